"""The model keeps a device attribute and creates a mask on it in forward."""
import torch
import torch.nn as nn


class CausalLM(nn.Module):
    def __init__(self, vocab=5000, dim=256, heads=4, layers=2, device="cuda"):
        super().__init__()
        self.device = device
        self.tok = nn.Embedding(vocab, dim)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True), layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        t = ids.size(1)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=self.device), diagonal=1)
        return self.head(self.body(self.tok(ids), mask=mask))


model = CausalLM().to("cuda")
seq_len = 64
batch_size = 16
ids = torch.randint(0, 5000, (batch_size, seq_len), device="cuda")
