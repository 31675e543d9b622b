"""weights=ResNet18_Weights.DEFAULT, model.to(device)."""
import torch
from torchvision.models import ResNet18_Weights, resnet18

device = torch.device("cuda")
weights = ResNet18_Weights.DEFAULT
model = resnet18(weights=weights)
model.to(device)
model.train()
preprocess = weights.transforms()
batch = torch.randn(32, 3, 224, 224, device=device)
