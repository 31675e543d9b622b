"""The rewriter: codemods (one per rule, ``tcNNN_*.py``), applied to a fixed point behind a safety
net (re-parse and compile before writing), with atomic writes that keep encoding, BOM, line endings
and file mode."""
