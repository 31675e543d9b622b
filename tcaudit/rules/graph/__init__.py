"""The TC1, the model graph wing: what the model audit measured (GEMM, conv, vocabulary and batch dimensions, casts, FP8
candidates) and the literals in the script that set those widths. A TC1 rule's model half (a
:class:`~tcaudit.rules.base.ModelRule` over the audit's facts) and its script half (a
:class:`~tcaudit.rules.base.ScriptRule` over the script's text) live in one module.

A module here is a rule (``tcNNN_*.py``: detection, fix, and for TC1 the model half) or a helper
that only this wing's rules import (tests/test_layers.py)."""
