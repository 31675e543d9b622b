"""A factory that returns the model already wrapped (DataParallel, then torch.compile)."""
import torch
import torch.nn as nn


class Tagger(nn.Module):
    def __init__(self, vocab=20000, dim=300, tags=9):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, tags)

    def forward(self, ids):
        return self.proj(self.emb(ids))


def get_model(compile_model=True):
    model = nn.DataParallel(Tagger()).cuda()
    if compile_model:
        model = torch.compile(model)
    return model


model = get_model()
ids = torch.randint(0, 20000, (32, 50), device="cuda")
