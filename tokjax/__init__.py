"""tokjax: learning tokenization end to end, in JAX."""

__version__ = "0.1.0"
