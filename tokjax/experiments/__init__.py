"""Experiments built on the trainer: `compare` trains every boundary method at equal budget."""
