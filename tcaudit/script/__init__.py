"""Script checks: facts shared by all rules (``facts``) and one module per rule (``tcNNN_name.py``)."""
