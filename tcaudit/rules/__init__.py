"""One module per script rule: its detection and its fix (see :mod:`tcaudit.rules.base`)."""
