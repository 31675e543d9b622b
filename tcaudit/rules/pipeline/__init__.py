"""The TC4, the input pipeline wing: DataLoader workers, pinned memory, host-to-device copies, decoding and normalizing on the host,
DALI.

A module here is a rule (``tcNNN_*.py``: detection, fix, and for TC1 the model half) or a helper
that only this wing's rules import (tests/test_layers.py)."""
