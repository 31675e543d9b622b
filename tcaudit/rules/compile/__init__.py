"""The TC3, backend settings and compilation wing: TF32, cuDNN benchmarking, memory format, torch.compile and CUDA graphs, fused optimizers,
attention kernels.

A module here is a rule (``tcNNN_*.py``: detection, fix, and for TC1 the model half) or a helper
that only this wing's rules import (tests/test_layers.py)."""
