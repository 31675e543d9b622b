"""The editing toolkit rules build their fixes from: statement and call edits, imports, and the
larger conversions (DDP, the DALI runtime) that several rules share."""
