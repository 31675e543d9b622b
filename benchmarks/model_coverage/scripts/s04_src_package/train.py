"""A package under the project: from tinyvit.models import build; absolute imports inside the package."""
import torch

from tinyvit.models import build
from tinyvit.settings import DEFAULTS

device = torch.device(DEFAULTS["device"])
model = build(DEFAULTS["variant"]).to(device)
optimizer = torch.optim.AdamW(model.parameters())
images = torch.randn(DEFAULTS["batch_size"], 3, 224, 224, device=device)
