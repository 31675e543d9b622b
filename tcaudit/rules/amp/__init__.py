"""The TC2, mixed precision wing: autocast, GradScaler, deprecated AMP APIs and the order of the steps around them.

A module here is a rule (``tcNNN_*.py``: detection, fix, and for TC1 the model half) or a helper
that only this wing's rules import (tests/test_layers.py)."""
