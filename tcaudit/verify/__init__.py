"""Verification: train the original and the patched script side by side and compare them.

``harness`` runs inside the user's process; ``runner`` orchestrates; ``report`` renders."""
