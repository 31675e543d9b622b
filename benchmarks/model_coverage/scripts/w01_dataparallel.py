"""nn.DataParallel around the model, then .to(device)."""
import torch
import torch.nn as nn


class CharCNN(nn.Module):
    def __init__(self, alphabet=70, length=1014, classes=4):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(alphabet, 256, 7), nn.ReLU(), nn.MaxPool1d(3), nn.Conv1d(256, 256, 7), nn.ReLU(), nn.MaxPool1d(3))
        self.fc = nn.Linear(256, classes)

    def forward(self, x):
        return self.fc(self.conv(x).amax(2))


device = torch.device("cuda")
model = CharCNN()
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)
model = nn.DataParallel(model)
model.to(device)
x = torch.randn(128, 70, 1014, device=device)
