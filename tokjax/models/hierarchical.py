"""The hierarchical byte LM ("autoregressive U-Net") with a pluggable boundary method at every stage.

One stage (the paper's model):

  bytes -> embed -> encoder byte layers (sliding window) -> h ----------------> early-exit head
                                                            |-> boundary method -> actions a
  h, a -> select-downsample -> main chunk layers (full causal attention, RoPE at byte positions)
       -> distribute-add upsample (+ h) -> decoder byte layers (sliding window) -> LM head

S stages (config.model.stages) nest the same pattern: stage s >= 1 takes the chunks of stage s - 1 as
its input sequence (N_s = capacity of stage s - 1 positions, the valid ones a prefix, each at the byte
position where that chunk ends), runs its own encoder layers over them, draws boundaries over them
with its own method, hands its chunks to stage s + 1 (the main layers after the last stage), adds the
result back by distribute-add upsampling and runs its own decoder layers; stage 0 does this over bytes.

  bytes -> enc_0 -> bnd_0 -> down -> enc_1 -> bnd_1 -> down -> main -> up (+h_1) -> dec_1 -> up (+h_0)
        -> dec_0 -> LM head

Every stage keeps the boundary convention of tokjax.models.boundaries on its own sequence (its input
position 0 and its last valid position are forced boundaries; see `boundaries.restrict_to_valid`), so
each level reads only complete chunks and the whole model stays causal in bytes.

Early exits: stage 0's head reads h_0 (as in the paper). Stage s >= 1 has its own head on
h_0 + (h_s brought to bytes), where byte t reads h_s at the latest stage-s input position complete at
t. h_s depends on the decisions of stages below s but not on stage s's own, which is what lets it serve
as the baseline of stage s's score function (tokjax/estimator.py) without bias.

Any module with the `BoundaryPolicy` call signature can draw the boundaries (the score-function policy,
straight-through routers, fixed rules): the model does not know how they were made.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from tokjax.models import boundaries as bd
from tokjax.models import chunking, interface, layers
from tokjax.vocab import PAD_ID


@dataclasses.dataclass(frozen=True)
class Level:
  """One level of boundaries of `HierarchicalByteLM`, level 0 over bytes, level s >= 1 over the chunks
  of level s - 1 (built from `tokjax.stages.Stage` s by `tokjax.models.build_model`).

  boundary: its boundary module (any module with the `BoundaryPolicy` call signature), left unbound:
  the model binds it in setup (flax does not look for modules inside a plain dataclass field).
  capacity: its chunk buffer. encoder_layers, decoder_layers: its layers below and above the level
  above it (byte layers at level 0, chunk layers above). window: their attention width in bytes (0:
  full causal attention).
  """

  boundary: nn.Module
  capacity: int
  encoder_layers: int
  decoder_layers: int
  window: int = 0


@dataclasses.dataclass(frozen=True)
class Remat:
  """The `jax.checkpoint` policy of each kind of stack (layers.StackSettings.remat): the byte
  encoder, the main network (and every chunk stack of levels >= 1), the byte decoder."""

  encoder: str = 'none'
  main: str = 'none'
  decoder: str = 'none'


# The lists setup keeps each kind of module of levels >= 1 in: level s's is entry s - 1, named
# LIST_{s - 1} in the parameters. Level 0's go by the kind's own name, as in the one-level model.
# Saved checkpoints restore by these names, so they may not change.
_ABOVE = {
    'boundary': 'inner_boundaries',
    'encoder': 'inner_encoders',
    'decoder': 'inner_decoders',
    'early_head': 'inner_early_heads',
}


def is_boundary_module(name: str) -> bool:
  """Whether the top-level parameters `name` belong to a level's boundary method: `boundary` at
  level 0, `inner_boundaries_{s - 1}` at level s >= 1 (the names setup gives them)."""
  return name == 'boundary' or name.startswith('inner_boundaries_')


class HierarchicalByteLM(nn.Module):
  """See the module docstring. levels: every level of boundaries, bytes first (`Level`). The byte
  MLPs are `byte_mlp_ratio * d`, chunk MLPs (main network and levels >= 1) `main_mlp_ratio * d`."""

  vocab_size: int
  d_model: int
  num_heads: int
  main_layers: int
  levels: tuple[Level, ...]
  byte_mlp_ratio: int = 1
  main_mlp_ratio: int = 4
  dtype: layers.Dtype = jnp.float32
  value_head: bool = (
      False  # A critic on the (detached) encoder state, for estimator.baseline='value'.
  )
  # Memory and speed options of the stacks (layers.Stack).
  remat: Remat = Remat()
  scan_layers: bool = False
  attention: str = 'blocked'
  # The length it trains on (config.data.seq_len; 0: none given). A longer input gets chunk buffers
  # grown in proportion (`for_length`), so it keeps the boundaries training would have room for.
  train_length: int = 0

  def for_length(self, length: int) -> 'HierarchicalByteLM':
    """This model (same parameters) for inputs of `length` positions: each level's chunk buffer
    capacity * length / train_length (rounded up) where length exceeds train_length, else self."""
    if not 0 < self.train_length < length:
      return self
    grown = lambda c: -(-c * length // self.train_length)  # Rounded up: more than c.
    return self.with_capacities(tuple(grown(lv.capacity) for lv in self.levels))

  def with_capacities(self, capacities) -> 'HierarchicalByteLM':
    """This model (same parameters) with level s's chunk buffer capacities[s], whatever the
    input's length (no `for_length` growth on top)."""
    levels = tuple(
        dataclasses.replace(lv, boundary=lv.boundary.clone(parent=None, capacity=c), capacity=c)
        for lv, c in zip(self.levels, capacities)
    )
    return self.clone(parent=None, levels=levels, train_length=0)

  def apply(self, variables, *args, **kwargs):
    """`nn.Module.apply` on `for_length` of the input's length (the first argument, int32[B, L]):
    the chunk buffers are picked from the length at trace time."""
    tokens = args[0] if args else kwargs.get('tokens')
    shape: tuple[int, ...] = tuple(getattr(tokens, 'shape', ()))
    model = self.for_length(shape[1]) if len(shape) == 2 else self
    return nn.Module.apply(model, variables, *args, **kwargs)

  def stack_settings(self, which: str, level: int = 0) -> layers.StackSettings:
    """The `layers.Stack` of 'main', or of level's 'encoder' | 'decoder': byte-wide MLPs and their
    own remat at level 0, chunk-wide MLPs and the main network's remat above."""
    d = self.d_model
    if which == 'main':
      return self._stack(self.main_layers, self.main_mlp_ratio * d, 0, self.remat.main)
    lv = self.levels[level]
    num_layers = {'encoder': lv.encoder_layers, 'decoder': lv.decoder_layers}[which]
    if level == 0:
      return self._stack(num_layers, self.byte_mlp_ratio * d, lv.window, getattr(self.remat, which))
    return self._stack(num_layers, self.main_mlp_ratio * d, lv.window, self.remat.main)

  def _stack(self, num_layers, mlp_hidden, window, remat) -> layers.StackSettings:
    return layers.StackSettings(
        num_layers=num_layers,
        num_heads=self.num_heads,
        mlp_hidden=mlp_hidden,
        window=window,
        dtype=self.dtype,
        remat=remat,
        scan=self.scan_layers,
        attention=self.attention,
    )

  # The `interface.ByteLM` properties.
  @property
  def num_stages(self) -> int:
    return len(self.levels)

  takes_key = True
  boundary_modes = ('sample', 'greedy')

  def init_args(self, batch_size: int, seq_len: int) -> tuple:
    return interface.init_args(self, batch_size, seq_len)

  def capacities(self) -> tuple[int, ...]:
    """Chunk buffer of every level, level 0 first."""
    return tuple(lv.capacity for lv in self.levels)

  def setup(self):
    self.embed = layers.Embed(self.vocab_size, self.d_model, self.dtype)
    # Level 0's modules under their own names, the levels above in lists (`_ABOVE`).
    self.boundary = self.levels[0].boundary
    self.encoder = layers.Stack(self.stack_settings('encoder'))
    self.main = layers.Stack(self.stack_settings('main'))
    self.decoder = layers.Stack(self.stack_settings('decoder'))
    self.early_head = layers.LMHead(self.vocab_size, self.dtype)
    self.head = layers.LMHead(self.vocab_size, self.dtype)
    above = range(1, self.num_stages)
    self.inner_boundaries = [self.levels[s].boundary for s in above]
    self.inner_encoders = [layers.Stack(self.stack_settings('encoder', s)) for s in above]
    self.inner_decoders = [layers.Stack(self.stack_settings('decoder', s)) for s in above]
    self.inner_early_heads = [layers.LMHead(self.vocab_size, self.dtype) for _ in above]
    if self.value_head:
      self.critic = Critic(self.d_model)

  def level_module(self, kind: str, level: int) -> nn.Module:
    """Level's 'boundary' | 'encoder' | 'decoder' | 'early_head' (bound)."""
    return getattr(self, kind) if level == 0 else getattr(self, _ABOVE[kind])[level - 1]

  def encode(self, tokens):
    """tokens: int32[B, L] -> (h: [B, L, D], early_logits: float32[B, L, V])."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    h = self.encoder(self.embed(tokens), positions)
    return h, self.early_head(h)

  def __call__(
      self, tokens, key, mode: str = 'sample', actions=None, **boundary_kwargs
  ) -> interface.ModelOutput:
    """tokens: int32[B, L]; key: PRNG key for the boundary method; mode: 'sample' | 'greedy' | 'given',
    or a tuple of one mode per stage (say ('given', 'sample'): stage 0's actions given, stage 1 drawn).

    Returns `interface.ModelOutput` with S stages (see `_decode`) and values: float32[B, L] when the
    model has a critic.
    """
    h, early_logits = self.encode(tokens)
    out = self._decode(h, tokens, early_logits, key, mode, actions, **boundary_kwargs)
    if self.value_head:
      out = out.replace(values=self.critic(h))
    return interface.checked(tokens, out, self.vocab_size)

  def sample_k(
      self, tokens, key, k: int, mode: str = 'sample', **boundary_kwargs
  ) -> interface.ModelOutput:
    """K boundary draws per sequence sharing one encoder pass (for leave-one-out baselines).

    tokens: int32[B, L]. Returns `interface.ModelOutput` over K*B rows (row k*B + b is draw k of
    sequence b), except stage 0's early_logits: float32[B, L, V] (computed once) and values:
    float32[B, L] when the model has a critic.
    """
    h, early_logits = self.encode(tokens)
    tile = lambda x: jnp.tile(x, (k,) + (1,) * (x.ndim - 1))
    out = self._decode(
        tile(h), tile(tokens), tile(early_logits), key, mode, None, **boundary_kwargs
    )
    first = out.stages[0].replace(early_logits=early_logits)
    out = out.replace(stages=(first,) + out.stages[1:])
    if self.value_head:
      out = out.replace(values=self.critic(h))
    return out

  def _decode(self, h, tokens, early_logits, key, mode, actions, **boundary_kwargs):
    """Boundaries of every stage, the main stack and the decoders on encoder states h: [B, L, D].

    actions (mode 'given'): float32[B, L] for one stage, or a tuple with one array per stage
    (stage s >= 1: [B, N_s], N_s = capacity of stage s - 1; None for a stage that draws its own).
    mode: one for every stage, or a tuple with one per stage. Returns `interface.ModelOutput` with
    logits and one `interface.StageOutput` per stage: stage 0's over bytes (every position valid,
    positions 0..L-1, the input tokens, early_logits from the encoder), stage s >= 1's over its N_s
    input positions (the chunks of stage s - 1) with its early_logits from h_0 + h_s brought to bytes.
    """
    given = actions if isinstance(actions, (tuple, list)) else (actions,) * self.num_stages
    modes = mode if isinstance(mode, (tuple, list)) else (mode,) * self.num_stages
    b, l = tokens.shape
    x, positions = h, jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    valid, stage_tokens = None, tokens
    levels = []  # Per stage: its input x, positions, valid, tokens, boundaries and chunk ends.
    for s, capacity in enumerate(self.capacities()):
      bnd = self.level_module('boundary', s)(
          x,
          key if s == 0 else jax.random.fold_in(key, s),
          mode=modes[s],
          actions=given[s],
          tokens=stage_tokens,
          early_logits=early_logits if s == 0 else None,
          **boundary_kwargs,
      )
      if s > 0:
        bnd = bd.restrict_to_valid(bnd, valid)
      chunks, index, chunk_valid = chunking.downsample(x, bnd.actions, capacity)
      n = x.shape[1]
      at = jnp.minimum(index, n - 1)
      levels.append(
          dict(
              x=x,
              positions=positions,
              valid=valid,
              tokens=stage_tokens,
              boundaries=bnd,
              index=index,
              chunk_valid=chunk_valid,
          )
      )
      # Where each chunk ends, in bytes (L for empty slots), and the byte it ends on (PAD there).
      positions = jnp.where(chunk_valid, jnp.take_along_axis(positions, at, axis=1), l)
      stage_tokens = jnp.where(chunk_valid, jnp.take_along_axis(stage_tokens, at, axis=1), PAD_ID)
      valid = chunk_valid
      if s + 1 < self.num_stages:
        x = self._chunk_stack('encoder', s + 1, chunks, positions, valid)
      else:
        out = self._chunk_stack('main', s + 1, chunks, positions, valid)
    for s in reversed(range(self.num_stages)):
      lv = levels[s]
      bnd = lv['boundaries']
      if bnd.chunk_ema is not None:
        out = chunking.ema_chunks(out, bnd.chunk_ema, lv['index'])
      out = chunking.upsample(lv['x'], out, bnd.actions, bnd.chunk_gate)
      if s == 0:
        out = self.decoder(out, lv['positions'])
      else:
        out = self._chunk_stack('decoder', s, out, lv['positions'], lv['valid'])
    logits = self.head(out)
    stages = []
    for s, lv in enumerate(levels):
      if s == 0:
        valid, stage_early = jnp.ones((b, l), bool), early_logits
      else:
        valid = lv['valid']
        stage_early = self.level_module('early_head', s)(h + self.to_bytes(lv['x'], levels[:s]))
      stages.append(
          interface.StageOutput(
              boundaries=lv['boundaries'],
              valid=valid,
              positions=lv['positions'],
              tokens=lv['tokens'],
              early_logits=stage_early,
              chunk_valid=lv['chunk_valid'],
          )
      )
    return interface.ModelOutput(logits=logits, stages=tuple(stages))

  def _chunk_stack(self, which: str, level: int, x, positions, valid):
    """The stack over a chunk buffer ('main', or level >= 1's 'encoder' | 'decoder'), run on the
    occupied prefix of the buffer (`layers.on_occupied_prefix`)."""
    stack = self.main if which == 'main' else self.level_module(which, level)
    lengths = layers.prefix_lengths(x.shape[1])
    if self.is_initializing() or len(lengths) == 1:
      return stack(x, positions, valid)
    run = lambda params, *args: stack.clone(parent=None).apply({'params': params}, *args)
    # The stack runs unbound; its name in the op names keeps profiles and HLO dumps attributing it.
    with jax.named_scope(str(stack.name)):
      return layers.on_occupied_prefix(run, stack.variables['params'], x, positions, valid, lengths)

  @staticmethod
  def to_bytes(x, below):
    """States x: [B, N_s, D] of stage s's input positions brought to bytes: [B, L, D].

    below: the levels of stages 0..s-1. Byte t takes x at the latest stage-s input position complete
    at t (the chunk of stage s - 1 that last ended at or before t, and so on down to bytes).
    """
    for lv in reversed(below):
      x = chunking.upsample(jnp.zeros(lv['x'].shape, x.dtype), x, lv['boundaries'].actions)
    return x


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


# Kept here for the callers that read it from this module.
boundaries_in_bytes = interface.boundaries_in_bytes
