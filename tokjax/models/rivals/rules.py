"""Fixed boundary rules: spacelike bytes (SpaceByte), a fixed stride (hourglass, MEGABYTE), uniform random.

None has parameters or a rate loss; all are causal (the decision at t reads bytes <= t, or nothing).
  * whitespace: SpaceByte's "spacelike" bytes (anything but an ASCII letter, digit or UTF-8
    continuation byte). a_t = 1 at a spacelike byte whose predecessor is not spacelike, so "word " and
    "word," are chunks and a run of indentation spaces joins the next chunk instead of flooding the
    chunk buffer. (SpaceByte places its block on the first spacelike byte of a run too; the ending is
    at that byte itself, which needs no look-ahead.)
  * stride: a_t = 1 when (t + 1) % k == 0 with k = round(1 / target_rate): chunks of k bytes.
  * uniform: exactly round(target_rate * L) boundaries per row (the two forced ones included) at
    positions drawn with the key, uniformly among positions 1..L-2.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from tokjax.models import registry
from tokjax.models.rivals import common
from tokjax.vocab import BOS_ID


def spacelike(tokens):
  """bool[B, L]: SpaceByte's spacelike bytes (BOS counts as spacelike, PAD does not)."""
  t = tokens
  letter_or_digit = ((t >= 48) & (t <= 57)) | ((t >= 65) & (t <= 90)) | ((t >= 97) & (t <= 122))
  continuation = (t >= 0x80) & (t <= 0xBF)
  return ((t < 256) & ~letter_or_digit & ~continuation) | (t == BOS_ID)


def whitespace_rule(tokens):
  """{0,1} float32[B, L]: spacelike byte not preceded by a spacelike byte."""
  s = spacelike(tokens)
  prev = jnp.pad(s, ((0, 0), (1, 0)))[:, :-1]
  return (s & ~prev).astype(jnp.float32)


class Whitespace(nn.Module):
  """tokens int32[B, L] -> `Boundaries` (same call signature as BoundaryPolicy)."""

  capacity: int = 64

  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    del key, early_logits, unused
    sampled = actions if mode == 'given' else whitespace_rule(tokens)
    return common.finish(sampled, self.capacity)


class Stride(nn.Module):
  """Every k-th byte closes a chunk, k = round(1 / target_rate)."""

  target_rate: float = 0.2
  capacity: int = 64

  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    del key, tokens, early_logits, unused
    k = max(1, round(1.0 / self.target_rate))
    rule = ((jnp.arange(h.shape[1]) + 1) % k == 0).astype(jnp.float32)
    sampled = actions if mode == 'given' else jnp.broadcast_to(rule, h.shape[:2])
    return common.finish(sampled, self.capacity)


class Uniform(nn.Module):
  """Exactly round(target_rate * L) boundaries per row at random positions (forced ones included)."""

  target_rate: float = 0.2
  capacity: int = 64

  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    del tokens, early_logits, unused
    b, l = h.shape[:2]
    n_free = min(max(round(self.target_rate * l) - 2, 0), l - 2)
    # The n_free largest of iid uniforms over positions 1..L-2 are a uniform random n_free-subset.
    scores = jax.random.uniform(key, (b, l)).at[:, jnp.array([0, l - 1])].set(-1.0)
    kth = jnp.sort(scores, axis=-1)[:, l - n_free][:, None] if n_free > 0 else jnp.full((b, 1), 2.0)
    rule = (scores >= kth).astype(jnp.float32)
    sampled = actions if mode == 'given' else rule
    return common.finish(sampled, self.capacity)


registry.register(
    registry.BoundaryMethod(
        name='whitespace',
        build=lambda st, c: Whitespace(capacity=st.capacity),
        description='SpaceByte rule: a chunk ends at the first spacelike byte of a run',
    )
)
registry.register(
    registry.BoundaryMethod(
        name='stride',
        build=lambda st, c: Stride(target_rate=st.target_rate, capacity=st.capacity),
        inner_stages=True,
        description='fixed stride: a chunk every round(1 / target_rate) bytes',
    )
)
registry.register(
    registry.BoundaryMethod(
        name='uniform',
        build=lambda st, c: Uniform(target_rate=st.target_rate, capacity=st.capacity),
        sampling=True,
        inner_stages=True,
        description='round(target_rate * L) boundaries at uniformly random positions',
    )
)
