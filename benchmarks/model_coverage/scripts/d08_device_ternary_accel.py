"""device picked by accelerator availability; channels_last move with device and memory format."""
import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cuda"


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class SmallVGG(nn.Module):
    def __init__(self, classes=100):
        super().__init__()
        self.features = nn.Sequential(Block(3, 64), nn.MaxPool2d(2), Block(64, 128), nn.MaxPool2d(2), Block(128, 256))
        self.head = nn.Linear(256, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


model = SmallVGG().to(device, memory_format=torch.channels_last)
x = torch.randn(128, 3, 32, 32, device=device)
out = model(x)
