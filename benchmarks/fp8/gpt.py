"""A GPT trained the way a tuned script trains it today: bf16 autocast, SDPA with is_causal, the padded
vocabulary (50,304), fused AdamW and each block compiled (torchtitan's per-block compile), synthetic
tokens. The original side of issue 52's FP8 measurement: ``tcaudit verify benchmarks/fp8/gpt.py --fp8
--select TC108`` trains it against the patch ``fix --fp8`` makes (FP8 training of the large
linear layers the model audit picks), BENCHMARKS.md has the command and the numbers.

The defaults (d_model 4096, 8 layers, 32 heads: 1.8B parameters with the tied embedding; batch 8 of
1,024 tokens) fit one 80 GB H100 with AdamW's state; ``--n-layer 2 --n-embd 256`` runs anywhere.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--n-layer", type=int, default=8)
parser.add_argument("--n-embd", type=int, default=4096)
parser.add_argument("--n-head", type=int, default=32)
parser.add_argument("--block-size", type=int, default=1024)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--vocab-size", type=int, default=50304)
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--no-compile", action="store_true")
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_embd, n_head):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_embd, args.n_head).to(device)
if not args.no_compile:
    for block in model.h:
        block.compile()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, fused=device == "cuda")

# Synthetic tokens from a fixed generator: the same batches for every run, so the losses compare.
generator = torch.Generator().manual_seed(1)
data = torch.randint(args.vocab_size, (64, args.batch_size, args.block_size + 1), generator=generator)
for step in range(args.steps):
    batch = data[step % len(data)].to(device, non_blocking=True)
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
