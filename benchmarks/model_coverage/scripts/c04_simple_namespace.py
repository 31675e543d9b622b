"""Hyper-parameters in a SimpleNamespace."""
from types import SimpleNamespace

import torch
import torch.nn as nn

hp = SimpleNamespace(vocab=8000, dim=512, layers=2, heads=8, seq_len=128, batch_size=16)


class Encoder(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.tok = nn.Embedding(hp.vocab, hp.dim)
        layer = nn.TransformerEncoderLayer(hp.dim, hp.heads, 4 * hp.dim, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, hp.layers)
        self.cls = nn.Linear(hp.dim, 2)

    def forward(self, ids):
        return self.cls(self.enc(self.tok(ids))[:, 0])


device = torch.device("cuda:0")
model = Encoder(hp).to(device)
ids = torch.randint(0, hp.vocab, (hp.batch_size, hp.seq_len), device=device)
model(ids).sum().backward()
