"""The flat byte-level Transformer: the uncompressed reference every boundary method is compared with."""

import flax.linen as nn
import jax.numpy as jnp

from tokjax.models import layers


class FlatByteLM(nn.Module):
  """bytes -> embed -> `num_layers` Gemma-2 blocks -> next-byte logits. No chunking at all."""

  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  mlp_hidden: int
  window: int = 0
  dtype: layers.Dtype = jnp.float32
  remat: str = 'none'  # Memory and speed options of the stack: see layers.Stack.
  scan_layers: bool = False
  attention: str = 'blocked'

  @nn.compact
  def __call__(self, tokens):
    """tokens: int32[B, L] -> {'logits': float32[B, L, V]} (logits at t predict tokens at t + 1)."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    x = layers.Embed(self.vocab_size, self.d_model, self.dtype, name='embed')(tokens)
    x = layers.Stack(
        self.num_layers,
        self.num_heads,
        self.mlp_hidden,
        self.window,
        self.dtype,
        self.remat,
        self.scan_layers,
        self.attention,
        name='layers',
    )(x, positions)
    return {'logits': layers.LMHead(self.vocab_size, self.dtype, name='head')(x)}
