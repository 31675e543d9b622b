"""model.to(0): a bare device index, and inputs moved with .to(0)."""
import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, vocab=30000, dim=250, classes=5):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.head(self.embed(tokens))


model = Classifier().to(0)
opt = torch.optim.Adam(model.parameters())
batch_size = 32
for _ in range(5):
    tokens = torch.randint(0, 30000, (batch_size, 128)).to(0)
    labels = torch.randint(0, 5, (batch_size,)).to(0)
    loss = nn.functional.cross_entropy(model(tokens), labels)
    loss.backward()
    opt.step()
