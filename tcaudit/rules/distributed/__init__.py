"""The TC5, distributed training wing: DataParallel, DDP and its sampler, process groups, SyncBatchNorm.

A module here is a rule (``tcNNN_*.py``: detection, fix, and for TC1 the model half) or a helper
that only this wing's rules import (tests/test_layers.py)."""
