"""The hierarchical byte LM ("autoregressive U-Net") with a pluggable boundary method.

  bytes -> embed -> encoder byte layers (sliding window) -> h ----------------> early-exit head
                                                            |-> boundary method -> actions a
  h, a -> select-downsample -> main chunk layers (full causal attention, RoPE at byte positions)
       -> distribute-add upsample (+ h) -> decoder byte layers (sliding window) -> LM head

Any module with the `BoundaryPolicy` call signature can draw the boundaries (the score-function policy,
straight-through routers, fixed rules): the model does not know how they were made.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from tokjax.models import chunking
from tokjax.models import layers


class HierarchicalByteLM(nn.Module):
  """See the module docstring. The byte MLPs are `byte_mlp_ratio * d`, chunk MLPs `main_mlp_ratio * d`."""
  vocab_size: int
  d_model: int
  num_heads: int
  encoder_layers: int
  main_layers: int
  decoder_layers: int
  boundary: nn.Module
  byte_window: int = 64
  byte_mlp_ratio: int = 1
  main_mlp_ratio: int = 4
  capacity: int = 64
  dtype: layers.Dtype = jnp.float32

  def setup(self):
    d, h = self.d_model, self.num_heads
    byte_stack = lambda n: layers.Stack(n, h, self.byte_mlp_ratio * d, self.byte_window, self.dtype)
    self.embed = layers.Embed(self.vocab_size, d, self.dtype)
    self.encoder = byte_stack(self.encoder_layers)
    self.main = layers.Stack(self.main_layers, h, self.main_mlp_ratio * d, 0, self.dtype)
    self.decoder = byte_stack(self.decoder_layers)
    self.early_head = layers.LMHead(self.vocab_size, self.dtype)
    self.head = layers.LMHead(self.vocab_size, self.dtype)

  def encode(self, tokens):
    """tokens: int32[B, L] -> (h: [B, L, D], early_logits: float32[B, L, V])."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    h = self.encoder(self.embed(tokens), positions)
    return h, self.early_head(h)

  def __call__(self, tokens, key, mode: str = 'sample', actions=None, **boundary_kwargs) -> dict[str, Any]:
    """tokens: int32[B, L]; key: PRNG key for the boundary method; mode: 'sample' | 'greedy' | 'given'.

    Returns logits and early_logits: float32[B, L, V], boundaries: `Boundaries`, chunk_valid: bool[B, C].
    """
    h, early_logits = self.encode(tokens)
    bnd = self.boundary(h, key, mode=mode, actions=actions, tokens=tokens,
                        early_logits=early_logits, **boundary_kwargs)
    chunks, ends, valid = chunking.downsample(h, bnd.actions, self.capacity)
    chunk_out = self.main(chunks, ends, valid)
    x = chunking.upsample(h, chunk_out, bnd.actions, bnd.chunk_gate)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits = self.head(self.decoder(x, positions))
    return {'logits': logits, 'early_logits': early_logits, 'boundaries': bnd, 'chunk_valid': valid}
