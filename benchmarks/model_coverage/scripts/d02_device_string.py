"""Small convnet; device is the string "cuda"."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

DEVICE = "cuda"


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 30, 3, padding=1)
        self.conv2 = nn.Conv2d(30, 60, 3, padding=1)
        self.fc = nn.Linear(60 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def main():
    data = datasets.MNIST("data", train=True, download=True, transform=transforms.ToTensor())
    loader = DataLoader(data, batch_size=100, shuffle=True)
    model = ConvNet().to(DEVICE)
    opt = torch.optim.Adam(model.parameters())
    for x, y in loader:
        x, y = x.to(DEVICE), y.to(DEVICE)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
