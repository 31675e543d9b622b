"""Autoencoder moved with model.to("cuda:0"); a buffer created on the device in __init__."""
import torch
import torch.nn as nn


class AutoEncoder(nn.Module):
    def __init__(self, dim=784, code=30, device="cuda:0"):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, 500), nn.ReLU(), nn.Linear(500, code))
        self.decoder = nn.Sequential(nn.Linear(code, 500), nn.ReLU(), nn.Linear(500, dim))
        self.register_buffer("scale", torch.ones(dim, device=device))

    def forward(self, x):
        return self.decoder(self.encoder(x * self.scale))


if __name__ == "__main__":
    model = AutoEncoder()
    model.to("cuda:0")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(10):
        x = torch.rand(128, 784, device="cuda:0")
        loss = ((model(x) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
