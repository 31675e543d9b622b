import torch.nn as nn


class Seq2SeqAttn(nn.Module):
    def __init__(self, vocab, dim, heads):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim))
        self.out = nn.Linear(dim, vocab)

    def forward(self, src):
        x = self.embed(src)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.out(x + self.ff(x))
