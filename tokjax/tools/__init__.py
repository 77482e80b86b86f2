"""Tools that exercise a whole training run from outside (fault injection)."""
