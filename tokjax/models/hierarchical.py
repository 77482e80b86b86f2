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
import jax
import jax.numpy as jnp

from tokjax.models import chunking, layers


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
  value_head: bool = (
      False  # A critic on the (detached) encoder state, for estimator.baseline='value'.
  )
  # Memory and speed options of the stacks (layers.Stack): remat policy of encoder, main, decoder.
  remat: tuple[str, str, str] = ('none', 'none', 'none')
  scan_layers: bool = False
  attention: str = 'blocked'

  def stack_args(self, which: str) -> tuple:
    """`layers.Stack`'s arguments for stack `which` ('encoder' | 'main' | 'decoder')."""
    d, h = self.d_model, self.num_heads
    n, mlp, window = {
        'encoder': (self.encoder_layers, self.byte_mlp_ratio * d, self.byte_window),
        'main': (self.main_layers, self.main_mlp_ratio * d, 0),
        'decoder': (self.decoder_layers, self.byte_mlp_ratio * d, self.byte_window),
    }[which]
    remat = self.remat[('encoder', 'main', 'decoder').index(which)]
    return (n, h, mlp, window, self.dtype, remat, self.scan_layers, self.attention)

  def setup(self):
    self.embed = layers.Embed(self.vocab_size, self.d_model, self.dtype)
    self.encoder = layers.Stack(*self.stack_args('encoder'))
    self.main = layers.Stack(*self.stack_args('main'))
    self.decoder = layers.Stack(*self.stack_args('decoder'))
    self.early_head = layers.LMHead(self.vocab_size, self.dtype)
    self.head = layers.LMHead(self.vocab_size, self.dtype)
    if self.value_head:
      self.critic = Critic(self.d_model)

  def encode(self, tokens):
    """tokens: int32[B, L] -> (h: [B, L, D], early_logits: float32[B, L, V])."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    h = self.encoder(self.embed(tokens), positions)
    return h, self.early_head(h)

  def __call__(
      self, tokens, key, mode: str = 'sample', actions=None, **boundary_kwargs
  ) -> dict[str, Any]:
    """tokens: int32[B, L]; key: PRNG key for the boundary method; mode: 'sample' | 'greedy' | 'given'.

    Returns logits and early_logits: float32[B, L, V], boundaries: `Boundaries`, chunk_valid: bool[B, C].
    """
    h, early_logits = self.encode(tokens)
    out = self._decode(h, tokens, early_logits, key, mode, actions, **boundary_kwargs)
    if self.value_head:
      out['values'] = self.critic(h)
    return out

  def sample_k(
      self, tokens, key, k: int, mode: str = 'sample', **boundary_kwargs
  ) -> dict[str, Any]:
    """K boundary draws per sequence sharing one encoder pass (for leave-one-out baselines).

    tokens: int32[B, L]. Returns logits: float32[K*B, L, V] (row k*B + b is draw k of sequence b),
    early_logits: float32[B, L, V] (computed once), boundaries and chunk_valid over K*B rows, and
    values: float32[B, L] when the model has a critic.
    """
    h, early_logits = self.encode(tokens)
    tile = lambda x: jnp.tile(x, (k,) + (1,) * (x.ndim - 1))
    out = self._decode(
        tile(h), tile(tokens), tile(early_logits), key, mode, None, **boundary_kwargs
    )
    out['early_logits'] = early_logits
    if self.value_head:
      out['values'] = self.critic(h)
    return out

  def _decode(self, h, tokens, early_logits, key, mode, actions, **boundary_kwargs):
    """Boundaries, main and decoder stacks on encoder states h: [B, L, D] (see __call__)."""
    bnd = self.boundary(
        h,
        key,
        mode=mode,
        actions=actions,
        tokens=tokens,
        early_logits=early_logits,
        **boundary_kwargs
    )
    chunks, ends, valid = chunking.downsample(h, bnd.actions, self.capacity)
    chunk_out = self.main(chunks, ends, valid)
    if bnd.chunk_ema is not None:
      chunk_out = chunking.ema_chunks(chunk_out, bnd.chunk_ema, ends)
    x = chunking.upsample(h, chunk_out, bnd.actions, bnd.chunk_gate)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits = self.head(self.decoder(x, positions))
    return {'logits': logits, 'early_logits': early_logits, 'boundaries': bnd, 'chunk_valid': valid}


class Critic(nn.Module):
  """Value head: stopgrad(h): [B, L, D] -> predicted return float32[B, L]. It reads a detached h, so its
  regression loss trains only itself and leaves the encoder to the LM and policy losses."""

  hidden: int

  @nn.compact
  def __call__(self, h):
    x = jax.lax.stop_gradient(h).astype(jnp.float32)
    x = nn.gelu(
        nn.Dense(
            self.hidden,
            name='hidden',
            dtype=jnp.float32,
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.lecun_normal(), ('embed', 'mlp')
            ),
        )(x)
    )
    return nn.Dense(
        1,
        name='out',
        dtype=jnp.float32,
        kernel_init=nn.with_logical_partitioning(nn.initializers.zeros, ('mlp', None)),
    )(x)[..., 0]
