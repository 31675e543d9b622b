"""kuangliu-style: from models import *, net = ResNetMini()."""
import torch

from models import *

device = "cuda" if torch.cuda.is_available() else "cpu"
net = ResNetMini()
net = net.to(device)
if device == "cuda":
    net = torch.nn.DataParallel(net)
