"""The PyTorch 2.6+ idiom: torch.accelerator.current_accelerator()."""
import torch
from torch import nn

device = torch.accelerator.current_accelerator()


class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    def forward(self, x):
        return self.linear_relu_stack(self.flatten(x))


model = NeuralNetwork().to(device)
print(model)
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for X, y in []:
    X, y = X.to(device), y.to(device)
    loss = loss_fn(model(X), y)
    loss.backward()
    optimizer.step()
