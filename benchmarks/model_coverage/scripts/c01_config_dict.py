"""A config dict at module level; the model takes **config["model"]."""
import torch
import torch.nn as nn

CONFIG = {
    "model": {"in_channels": 3, "base": 48, "num_classes": 10},
    "train": {"batch_size": 128, "lr": 0.05, "epochs": 30},
}


class WideNet(nn.Module):
    def __init__(self, in_channels, base, num_classes):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, base, 3, padding=1), nn.BatchNorm2d(base), nn.ReLU(),
            nn.Conv2d(base, base * 2, 3, stride=2, padding=1), nn.BatchNorm2d(base * 2), nn.ReLU(),
            nn.Conv2d(base * 2, base * 4, 3, stride=2, padding=1), nn.BatchNorm2d(base * 4), nn.ReLU(),
        )
        self.fc = nn.Linear(base * 4, num_classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


def train(config):
    device = torch.device("cuda")
    model = WideNet(**config["model"]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=config["train"]["lr"])
    for _ in range(config["train"]["epochs"]):
        x = torch.randn(config["train"]["batch_size"], 3, 32, 32, device=device)
        model(x).sum().backward()
        opt.step()


if __name__ == "__main__":
    train(CONFIG)
