"""The flat byte-level Transformer: the uncompressed reference every boundary method is compared with."""

import flax.linen as nn
import jax.numpy as jnp

from tokjax.models import interface, layers


class FlatByteLM(nn.Module):
  """bytes -> embed -> `num_layers` Gemma-2 blocks -> next-byte logits. No chunking at all.

  A `interface.ByteLM` with no stages of boundaries: it takes no key, and ignores the key and
  boundary mode callers pass to every model.
  """

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

  num_stages = 0
  takes_key = False
  boundary_modes = ('sample',)

  def init_args(self, batch_size: int, seq_len: int) -> tuple:
    return interface.init_args(self, batch_size, seq_len)

  def stack_settings(self) -> layers.StackSettings:
    """Its one `layers.Stack` (named 'layers' in the parameters)."""
    return layers.StackSettings(
        num_layers=self.num_layers,
        num_heads=self.num_heads,
        mlp_hidden=self.mlp_hidden,
        window=self.window,
        dtype=self.dtype,
        remat=self.remat,
        scan=self.scan_layers,
        attention=self.attention,
    )

  @nn.compact
  def __call__(self, tokens, key=None, mode: str = 'sample') -> interface.ModelOutput:
    """tokens: int32[B, L] -> ModelOutput(logits float32[B, L, V], stages=()); logits at t predict
    tokens at t + 1. key and mode are unused (no boundaries to draw)."""
    del key, mode
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    x = layers.Embed(self.vocab_size, self.d_model, self.dtype, name='embed')(tokens)
    x = layers.Stack(self.stack_settings(), name='layers')(x, positions)
    logits = layers.LMHead(self.vocab_size, self.dtype, name='head')(x)
    return interface.checked(tokens, interface.ModelOutput(logits), self.vocab_size)
