"""A classmethod from_config builds the model."""
import torch
import torch.nn as nn

CONFIG = {"vocab": 1000, "dim": 100, "hidden": 100, "classes": 3}


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocab, dim, hidden, classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.ff = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg["vocab"], cfg["dim"], cfg["hidden"], cfg["classes"])

    def forward(self, ids):
        return self.ff(self.emb(ids).mean(1))


model = BagOfEmbeddings.from_config(CONFIG).to("cuda")
ids = torch.randint(0, 1000, (32, 64), device="cuda")
