"""The TC6, the host side of the training loop wing: per-step host syncs, zero_grad, cache emptying, evaluation without no_grad.

A module here is a rule (``tcNNN_*.py``: detection, fix, and for TC1 the model half) or a helper
that only this wing's rules import (tests/test_layers.py)."""
