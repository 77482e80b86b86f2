"""What every byte LM of tokjax offers its callers: typed outputs and one set of properties.

A model has S >= 0 stages of boundaries: the flat Transformer none (S = 0), the hierarchical model
config.model.stages (S >= 1). Training, evaluation, FLOPs, reporting, segmentation, generation and
lm_eval read a model only through `ByteLM` and its `ModelOutput`, so none of them asks which kind of
model it holds.

Shape names: B rows, L bytes, V vocabulary, N_s the input positions of stage s (N_0 = L; for s >= 1
the chunk capacity of stage s - 1), C_s the chunk capacity of stage s.
"""

from typing import Protocol

import chex
import flax.struct
import jax
import jax.numpy as jnp

from tokjax.models import boundaries as bd


@flax.struct.dataclass
class StageOutput:
  """One stage of boundaries, over that stage's own input sequence.

  Attributes:
    boundaries: the stage's `Boundaries` over [B, N_s] (stage 0: over bytes).
    valid: bool[B, N_s], the input positions that hold a real input (all of stage 0's; for s >= 1
      the filled chunk slots of stage s - 1, a prefix of each row).
    positions: int32[B, N_s], the byte each input position ends at (L on padding).
    tokens: int32[B, N_s], that byte (PAD on padding).
    early_logits: float32[B, L, V], the stage's early-exit next-byte logits.
    chunk_valid: bool[B, C_s], the filled slots of the chunks this stage hands upwards.
  """

  boundaries: bd.Boundaries
  valid: jax.Array
  positions: jax.Array
  tokens: jax.Array
  early_logits: jax.Array
  chunk_valid: jax.Array


@flax.struct.dataclass
class ModelOutput:
  """A model's forward pass.

  Attributes:
    logits: float32[B, L, V], next-byte logits (position t predicts byte t + 1).
    stages: one `StageOutput` per stage, stage 0 first; () for the flat model.
    values: float32[B, L], the critic's predicted returns (a model with a value head), else None.

  `sample_k`'s output has K * B rows everywhere except stage 0's early_logits and values (one encoder
  pass: [B, L, V] and [B, L]).
  """

  logits: jax.Array
  stages: tuple[StageOutput, ...] = ()
  values: jax.Array | None = None

  @property
  def boundaries(self) -> bd.Boundaries:
    """Stage 0's boundaries (over bytes)."""
    return self.stages[0].boundaries

  @property
  def early_logits(self) -> jax.Array:
    """Stage 0's early-exit logits float32[B, L, V]."""
    return self.stages[0].early_logits


class ByteLM(Protocol):
  """The interface of `FlatByteLM` and `HierarchicalByteLM` (flax modules).

  Calling convention: `model.apply({'params': p}, tokens, key, mode=mode)` with tokens int32[B, L]
  -> `ModelOutput`, for every model (a model without boundaries ignores key and mode), and
  `model.init(key, *model.init_args(B, L))`.
  """

  @property
  def num_stages(self) -> int:
    """S, the stages of boundaries (0: none)."""

  @property
  def takes_key(self) -> bool:
    """Whether the forward draws randomness (and so `init_args` holds a key)."""

  @property
  def boundary_modes(self) -> tuple[str, ...]:
    """The modes that give different boundaries: ('sample',) without boundaries, else ('sample',
    'greedy')."""

  def init_args(self, batch_size: int, seq_len: int) -> tuple:
    """Dummy positional arguments of model.init: (tokens,) or (tokens, key)."""


def init_args(model: ByteLM, batch_size: int, seq_len: int) -> tuple:
  """`ByteLM.init_args` for any model: int32 zeros[batch_size, seq_len], and a key if it takes one."""
  tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
  return (tokens, jax.random.PRNGKey(0)) if model.takes_key else (tokens,)


def checked(tokens: jax.Array, out: ModelOutput, vocab_size: int) -> ModelOutput:
  """out, after the shape and dtype checks of a forward pass at the model's boundary (at trace time:
  free under jit). A wrong shape anywhere below would otherwise surface as a broadcast far from it.

  tokens int[B, L]; logits and every stage's early_logits float[B, L, V]; per stage, boundaries,
  valid, positions and tokens all [B, N_s] (N_0 = L); values float[B, L] when present.
  """
  chex.assert_rank(tokens, 2)
  chex.assert_type(tokens, int)
  b_x_l = tokens.shape
  chex.assert_shape(out.logits, (*b_x_l, vocab_size))
  chex.assert_type(out.logits, float)
  for s, stage in enumerate(out.stages):
    chex.assert_shape(stage.early_logits, (*b_x_l, vocab_size))
    chex.assert_equal_shape([stage.boundaries.actions, stage.valid, stage.positions, stage.tokens])
    chex.assert_axis_dimension(stage.valid, 0, b_x_l[0])
    if s == 0:
      chex.assert_shape(stage.boundaries.actions, b_x_l)
  if out.values is not None:
    chex.assert_shape(out.values, b_x_l)
  return out


def stage_metric(s: int, name: str) -> str:
  """The metric name of statistic `name` of stage s: stage 0's bare ('rate'), 'stage{s}_rate' above."""
  return f'stage{s}_{name}' if s else name


def stage_metrics(model: ByteLM, name: str) -> list[str]:
  """`stage_metric` of every stage of the model, stage 0 first ([] without boundaries)."""
  return [stage_metric(s, name) for s in range(model.num_stages)]


def byte_levels(model: ByteLM) -> int:
  """Levels of boundaries on bytes that segmentation and generation report: S, and one level of
  zeros for a model without boundaries."""
  return max(model.num_stages, 1)


def boundaries_in_bytes(out: ModelOutput) -> list:
  """Every stage's chunk ends marked on bytes: a list of S float32[B, L], stage 0 first.

  Entry s is 1 at byte t when t is the last byte of a chunk of stage s (a stage-s chunk ends where
  its last input chunk ends), so entry s + 1 <= entry s everywhere.
  """
  first = out.boundaries.actions
  levels = [first]
  for stage in out.stages[1:]:
    b, l = first.shape
    at = jnp.where(stage.valid, stage.positions, l)  # Padding lands out of range: dropped.
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], at.shape)
    ends = stage.boundaries.actions * stage.valid
    levels.append(jnp.zeros((b, l), first.dtype).at[rows, at].max(ends, mode='drop'))
  return levels


def levels_on_bytes(out: ModelOutput) -> jax.Array:
  """float32[B, byte_levels, L]: `boundaries_in_bytes` stacked; one level of zeros when S = 0."""
  if not out.stages:
    b, l = out.logits.shape[:2]
    return jnp.zeros((b, 1, l), jnp.float32)
  return jnp.stack(boundaries_in_bytes(out), axis=1).astype(jnp.float32)
