"""A LLaMA-7B-shaped model (6.7B parameters) in the style of Meta's reference code, for
benchmarks/model_audit.py. Never trained here."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    vocab_size: int = 32000
    hidden_dim: int = 11008
    norm_eps: float = 1e-5
    max_seq_len: int = 2048


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_rope(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    angles = torch.outer(torch.arange(end).float(), freqs)
    return torch.cat([angles, angles], dim=-1)


def rotate(x, angles):
    a, b = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat((-b, a), dim=-1) * angles.sin()


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads = args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x, angles):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, angles), rotate(k, angles)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.w2 = nn.Linear(args.hidden_dim, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, angles):
        h = x + self.attention(self.attention_norm(x), angles)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params):
        super().__init__()
        self.params = params
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.layers = nn.ModuleList([TransformerBlock(params) for _ in range(params.n_layers)])
        self.norm = RMSNorm(params.dim, params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
        self.register_buffer("angles", precompute_rope(params.dim // params.n_heads, params.max_seq_len), persistent=False)

    def forward(self, tokens):
        _, T = tokens.shape
        h = self.tok_embeddings(tokens)
        angles = self.angles[:T]
        for layer in self.layers:
            h = layer(h, angles)
        return self.output(self.norm(h)).float()


def main():
    model = Transformer(ModelArgs())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(10):
        tokens = torch.randint(0, 32000, (4, 2048))
        loss = F.cross_entropy(model(tokens).view(-1, 32000), tokens.view(-1))
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
