"""tcaudit: keep PyTorch training code on the GPU's Tensor Cores."""

__version__ = "0.1.0"
