"""Autoregressive generation from the hierarchical byte LM, boundaries decided on the fly.

At step t the model reads byte x_t, the boundary policy decides a_t from the encoder state h_t (and,
for a window w > 1, the previous w - 1 executed decisions; a_0 = 1 is forced), a chunk closes at t when
a_t = 1, and the logits at t (which see the latest chunk complete at t, as in training) give x_{t+1}:
a prompt byte while reading the prompt, then a sample (temperature, top-k).

One stage of the learned policy generates with `generate`, in two paths that make the same
computation:
  - uncached: every step reruns the whole model on the buffer of all N positions (O(N) per byte),
    exactly the training forward (`HierarchicalByteLM` in mode 'given' on the decisions so far);
  - cached: every step feeds one byte through the model's own stacks (`layers.Stack`, the blocks
    training runs) called with key/value caches: a ring buffer of the last `byte_window` positions
    for each byte layer (sliding-window attention), and a buffer of all closed chunks for each chunk
    layer, written only when a_t = 1. Embedding, heads and the boundary policy are the model's
    modules too, on the model's own parameter tree.
Both draw a_t and x_{t+1} from the same keys (fold_in(key, t), then 0 for the boundary, 1 for the
byte), so for a fixed key they agree up to float rounding: the same decisions and bytes, logits equal
to ~1e-5 (tests/test_sample.py).

Generation does not apply the training chunk capacity: the chunk buffer holds every possible chunk.
Lengths beyond the training seq_len are extrapolation (byte layers are local; the chunk layers see more
chunks than in training).

Every other model (S > 1 stages, a one-stage model of another boundary method, the flat model)
generates with `generate_stages`, whose boundaries are those of the training forward (mode 'sample'
or 'greedy', every stage's boundary method drawing its own decisions) on a fixed buffer of N + 1
positions (PAD after the last byte known; the spare last one takes the convention's forced boundary),
with one boundary key for all steps. For a method whose registry entry has lookahead=False, the model
is causal in bytes, boundary decisions of every level included (tests/test_rivals.py checks every such
method), and each position's random draw depends only on the key, the position and the buffer's fixed
shape, so the decisions at positions <= t made at step t are never changed by the bytes appended
later: the boundaries drawn while generating equal one forward pass over the final text with the same
key (tests/test_multistage_inspection.py, tests/test_rivals.py). Uncached, every step runs that forward
over the buffer (O(N) per byte). Cached (`cached_stages_step`), every byte goes through each level's
stacks with key/value caches (a level above bytes gets a new position only when the level below
closes a chunk), and each level's boundary method runs over its buffer of encoder states so far: any
registered method decides incrementally without a form of its own, at the cost of the method's
module over N positions per byte (a dense layer or two; the policy at w > 1 scans them). A method
with lookahead=True (the whole window's BPE token starts, 'bpe_oracle') decides a boundary from bytes
generation has not made yet: `check_causal` refuses it.

Shape names: B rows, N total positions (BOS + prompt + generated), S cache slots, V vocabulary.
"""

import functools
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tokjax import models, stages
from tokjax.data import BOS_ID, PAD_ID
from tokjax.errors import UserError
from tokjax.models import boundaries as bd
from tokjax.models import chunking, interface, layers, registry


def check_causal(config, *, levels: stages.Levels) -> None:
  """UserError naming the first stage of config's model whose boundary method sees bytes after t (its
  registry entry's `lookahead`): generation decides each boundary before those bytes exist. levels:
  config's (`stages.resolve`)."""
  for st in levels[: models.num_stages(config)]:
    if registry.get(st.method).lookahead:
      raise UserError(
          f'{st.where("method")}={st.method!r} decides the boundary at byte t from bytes after t '
          '(its registry entry declares lookahead=True), which generation has not made yet; '
          "generate from a run of a causal method ('bpe' is BPE's causal form)."
      )


def incremental_policy(model) -> bool:
  """Whether `generate` runs model: one stage of the learned policy, decided one position at a time
  from its own history with a key per step; every other model generates with `generate_stages`."""
  levels: tuple[Any, ...] = getattr(model, 'levels', ())
  return len(levels) == 1 and isinstance(levels[0].boundary, bd.BoundaryPolicy)


def sample_byte(logits, key, temperature: float, top_k: int):
  """A byte (0..255, never BOS/PAD) from logits: float32[B, V]; temperature 0 = argmax -> int32[B]."""
  logits = logits[:, :256]
  if temperature <= 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if 0 < top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def decide(logit, t, key, mode: str):
  """a_t in {0, 1} (float32[B]) from the policy logit: forced 1 at t = 0, else greedy or sampled."""
  if mode == 'greedy':
    a = (logit > 0).astype(jnp.float32)
  else:
    a = (jax.random.uniform(key, logit.shape) < jax.nn.sigmoid(logit)).astype(jnp.float32)
  return jnp.where(t == 0, 1.0, a)


def _step_keys(key, t):
  k = jax.random.fold_in(key, t)
  return jax.random.fold_in(k, 0), jax.random.fold_in(k, 1)


def _cache(batch: int, slots: int, num_heads: int, head_dim: int, dtype):
  return {
      'k': jnp.zeros((batch, slots, num_heads, head_dim), dtype),
      'v': jnp.zeros((batch, slots, num_heads, head_dim), dtype),
      'pos': jnp.zeros((batch, slots), jnp.int32),
      'valid': jnp.zeros((batch, slots), bool),
  }


def init_caches(model, batch: int, total: int) -> dict:
  """Empty caches for N = total positions: byte layers keep byte_window slots (all N for full
  attention), chunk layers N slots (at most one chunk per position)."""
  hd, h, dt = model.d_model // model.num_heads, model.num_heads, model.dtype
  (bytes_,) = model.levels
  byte_slots = bytes_.window if 0 < bytes_.window < total else total
  return {
      'encoder': [_cache(batch, byte_slots, h, hd, dt) for _ in range(bytes_.encoder_layers)],
      'main': [_cache(batch, total, h, hd, dt) for _ in range(model.main_layers)],
      'decoder': [_cache(batch, byte_slots, h, hd, dt) for _ in range(bytes_.decoder_layers)],
      'last_chunk': jnp.zeros((batch, 1, model.d_model), dt),
      'num_chunks': jnp.zeros((batch,), jnp.int32),
      'history': jnp.zeros((batch, bytes_.boundary.window), jnp.float32),  # a_{t-w} .. a_{t-1}.
  }


def policy_logit(policy, params, h, history):
  """The policy's logit at t from h_t: [B, D] and the executed history [B, w] (a_{t-w}..a_{t-1}).

  Runs the policy module itself in mode 'given' on w + 1 positions that all hold h_t: its logit at the
  last position reads v(h_t) and the previous w - 1 decisions (position 0 is forced by the convention
  but lies outside the history term, and a_t itself does not enter its own logit).
  """
  w = policy.window
  hs = jnp.broadcast_to(h[:, None, :], (h.shape[0], w + 1, h.shape[-1]))
  acts = jnp.concatenate([history, jnp.zeros((h.shape[0], 1))], axis=1)
  policy = policy.clone(parent=None, capacity=w + 4)  # No drops inside this short window.
  return policy.apply({'params': params}, hs, None, mode='given', actions=acts).logits[:, -1]


def cached_step(model, params, caches, token, t, key, *, mode: str):
  """One position through the cached layers. token: int32[B], t: scalar int32 ->
  (caches, next-byte logits float32[B, V], a_t float32[B], policy logit float32[B])."""
  b = token.shape[0]
  position = jnp.full((b,), t, jnp.int32)
  ones = jnp.ones((b,), bool)

  def stack(which, x, slot, write):
    return layers.Stack(model.stack_settings(which)).apply(
        {'params': params[which]}, x, position[:, None], None, caches[which], slot, write
    )

  (bytes_,) = model.levels
  byte_slot = position % caches['encoder'][0]['pos'].shape[1] if bytes_.encoder_layers else position
  x = layers.Embed(model.vocab_size, model.d_model, model.dtype).apply(
      {'params': params['embed']}, token[:, None]
  )
  hid, enc = stack('encoder', x, byte_slot, ones)
  k_bnd, _ = _step_keys(key, t)
  logit = policy_logit(bytes_.boundary, params['boundary'], hid[:, 0], caches['history'])
  a = decide(logit, t, k_bnd, mode)
  close = a > 0.5
  # Most bytes close no chunk in any row; the main network then writes nothing and its output is
  # not read, so it is skipped (about 4 bytes in 5 at batch 1).
  chunk_out, main = jax.lax.cond(
      jnp.any(close),
      lambda: stack('main', hid, caches['num_chunks'], close),
      lambda: (caches['last_chunk'], caches['main']),
  )
  last = jnp.where(close[:, None, None], chunk_out, caches['last_chunk'])
  dec_slot = position % caches['decoder'][0]['pos'].shape[1] if bytes_.decoder_layers else position
  y, dec = stack('decoder', hid + last, dec_slot, ones)
  # flax types apply's result as (output, variables) too, which it is only with `mutable`.
  head = layers.LMHead(model.vocab_size, model.dtype)
  logits = cast(jax.Array, head.apply({'params': params['head']}, y))[:, 0]
  caches = {
      'encoder': enc,
      'main': main,
      'decoder': dec,
      'last_chunk': last,
      'num_chunks': caches['num_chunks'] + close.astype(jnp.int32),
      'history': jnp.concatenate([caches['history'][:, 1:], a[:, None]], axis=1),
  }
  return caches, logits, a, logit


def uncached_step(model, params, tokens, actions, t, key, *, mode: str):
  """The whole model on the buffer tokens: int32[B, N] with decisions actions: float32[B, N] for
  positions < t -> (next-byte logits at t float32[B, V], a_t float32[B], policy logit float32[B]).
  """
  k_bnd, _ = _step_keys(key, t)

  def forward(m, tokens, actions):
    # One spare position at the end takes the convention's forced last boundary, which would
    # otherwise override the decision at t = N - 1.
    tokens = jnp.pad(tokens, ((0, 0), (0, 1)), constant_values=PAD_ID)
    actions = jnp.pad(actions, ((0, 0), (0, 1)))
    hid, _ = m.encode(tokens)
    logit = jnp.take(m.boundary(hid, None, mode='given', actions=actions).logits, t, axis=1)
    a = decide(logit, t, k_bnd, mode)
    bnd = m.boundary(hid, None, mode='given', actions=actions.at[:, t].set(a))
    chunks, ends, valid = chunking.downsample(hid, bnd.actions, m.levels[0].capacity)
    x = chunking.upsample(hid, m.main(chunks, ends, valid), bnd.actions, bnd.chunk_gate)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits = m.head(m.decoder(x, positions))
    return jnp.take(logits, t, axis=1), a, logit

  return model.apply({'params': params}, tokens, actions, method=forward)


def with_capacity(model, capacity: int):
  """The same model (same parameters) with a chunk buffer of `capacity` slots at every level."""
  return model.with_capacities((capacity,) * model.num_stages)


@functools.partial(
    jax.jit, static_argnames=('model', 'num_bytes', 'mode', 'temperature', 'top_k', 'cached')
)
def generate(
    model,
    params,
    prompt,
    key,
    num_bytes: int,
    *,
    mode: str = 'sample',
    temperature: float = 1.0,
    top_k: int = 0,
    cached: bool = True,
    lengths=None,
):
  """Continues prompt: int32[B, P] (starting with BOS) by num_bytes bytes.

  lengths: optional int32[B], row b's prompt is prompt[b, :lengths[b]] (the rest is overwritten), so
  prompts of different lengths share one compiled shape; row b then generates N - lengths[b] bytes.

  Returns {'tokens': int32[B, N] (prompt then generated bytes, N = P + num_bytes),
  'actions': float32[B, N] (a_t; the last position's decision is made too),
  'logits': float32[N, B, V] (next-byte logits at each step), 'policy_logits': float32[N, B]}.
  """
  b, p = prompt.shape
  n = p + num_bytes
  lengths = jnp.full((b,), p, jnp.int32) if lengths is None else lengths
  model = with_capacity(model, n + 1)
  tokens0 = jnp.concatenate([prompt, jnp.full((b, num_bytes), PAD_ID, jnp.int32)], axis=1)

  def step(carry, t):
    tokens, actions, caches = carry
    if cached:
      caches, logits, a, logit = cached_step(model, params, caches, tokens[:, t], t, key, mode=mode)
    else:
      logits, a, logit = uncached_step(model, params, tokens, actions, t, key, mode=mode)
    _, k_byte = _step_keys(key, t)
    sampled = sample_byte(logits, k_byte, temperature, top_k)
    nxt = jnp.where(t + 1 < lengths, jnp.take(tokens, jnp.minimum(t + 1, n - 1), axis=1), sampled)
    tokens = tokens.at[:, t + 1].set(nxt, mode='drop')
    actions = actions.at[:, t].set(a)
    return (tokens, actions, caches), (logits, logit)

  caches = init_caches(model, b, n) if cached else None
  (tokens, actions, _), (logits, policy_logits) = jax.lax.scan(
      step, (tokens0, jnp.zeros((b, n)), caches), jnp.arange(n)
  )
  return {'tokens': tokens, 'actions': actions, 'logits': logits, 'policy_logits': policy_logits}


def _slots(window: int, total: int) -> int:
  """Cache slots of a stack attending within `window` positions (0: all of them) of `total`."""
  return window if 0 < window < total else total


def init_stage_caches(model, batch: int, total: int) -> dict:
  """The empty state of `cached_stages_step` over `total` positions (N + 1: the spare included).

  The flat model: {'layers': its stack's caches}. A hierarchical model: per level s, the key/value
  caches of its encoder and decoder (byte layers keep their window of slots; a level above keeps a
  slot per position, since its window counts bytes, not positions), the buffers its boundary method
  reads ('x': its encoder states [B, total, D], 'tokens': the byte each position ends on, PAD
  beyond), 'count' (its positions so far) and 'above' (the latest output handed down to it, [B, 1,
  D]); the main network's caches and 'main_count'; stage 0's 'early_logits' [B, total, V].
  """
  hd, h, dt = model.d_model // model.num_heads, model.num_heads, model.dtype
  caches = lambda layers_, slots: [_cache(batch, slots, h, hd, dt) for _ in range(layers_)]
  if not model.num_stages:
    st = model.stack_settings()
    return {'layers': caches(st.num_layers, _slots(st.window, total))}
  levels = []
  for s, lv in enumerate(model.levels):
    slots = _slots(lv.window, total) if s == 0 else total
    levels.append(
        {
            'encoder': caches(lv.encoder_layers, slots),
            'decoder': caches(lv.decoder_layers, slots),
            'x': jnp.zeros((batch, total, model.d_model), dt),
            'tokens': jnp.full((batch, total), PAD_ID, jnp.int32),
            'count': jnp.zeros((batch,), jnp.int32),
            'above': jnp.zeros((batch, 1, model.d_model), dt),
        }
    )
  return {
      'levels': levels,
      'main': caches(model.main_layers, total),
      'main_count': jnp.zeros((batch,), jnp.int32),
      'early_logits': jnp.zeros((batch, total, model.vocab_size), jnp.float32),
  }


def cached_stages_step(model, params, state, token, t, key, *, mode: str):
  """Byte t through every level's cached stacks (`init_stage_caches`; the flat model's one stack).

  token: int32[B], t: scalar int32 -> (state, next-byte logits float32[B, V], the chunk ends at t
  float32[B, byte_levels]: 1 where level s closed a chunk at t).

  A new position of level s (byte t at level 0; at level s + 1 wherever level s closes a chunk at t)
  goes through level s's encoder; level s's boundary method then decides at it by running over the
  level's whole buffer of encoder states (the training forward's input at every position so far,
  zeros and PAD after them), with the training forward's key and buffer shape, so for a causal method
  it decides what `stage_boundaries` decides. Where it closes a chunk, the chunk goes to the level
  above (the main network above the last level), whose output (H-Net's smoothing applied) is the one
  the decoder of level s adds until the next chunk closes, as distribute-add upsampling does.
  """
  b = token.shape[0]
  position = jnp.full((b, 1), t, jnp.int32)
  ones = jnp.ones((b,), bool)
  if not model.num_stages:
    st = model.stack_settings()
    slot = jnp.full((b,), t % state['layers'][0]['pos'].shape[1], jnp.int32)
    x = layers.Embed(model.vocab_size, model.d_model, model.dtype).apply(
        {'params': params['embed']}, token[:, None]
    )
    y, caches = layers.Stack(st).apply(
        {'params': params['layers']}, x, position, None, state['layers'], slot, ones
    )
    head = layers.LMHead(model.vocab_size, model.dtype)
    logits = cast(jax.Array, head.apply({'params': params['head']}, y))
    return {'layers': caches}, logits[:, 0], jnp.zeros((b, 1), jnp.float32)

  def step(m, state):
    levels = [dict(lv) for lv in state['levels']]
    out = {'main': state['main'], 'main_count': state['main_count']}
    early = state['early_logits']
    ends = []

    def run(s, x_in, live):
      nonlocal early
      st, total = levels[s], levels[s]['x'].shape[1]
      i = st['count']  # The new position's index at level s (t at level 0).
      slot = i % _slots(m.levels[0].window, total) if s == 0 else i
      x, enc = m.level_module('encoder', s)(x_in, position, None, st['encoder'], slot, live)
      st['x'] = layers.write_rows(st['x'], i, x[:, 0], live)
      st['tokens'] = layers.write_rows(st['tokens'], i, token, live)
      if s == 0:
        early = layers.write_rows(early, i, m.early_head(x)[:, 0], live)
      bnd = m.level_module('boundary', s)(
          st['x'],
          key if s == 0 else jax.random.fold_in(key, s),
          mode=mode,
          tokens=st['tokens'],
          early_logits=early if s == 0 else None,
      )
      at = lambda v: jnp.take_along_axis(v, i[:, None], axis=1)[:, 0]
      close = live & (at(bnd.actions) > 0.5)
      ends.append(close)
      if s + 1 < m.num_stages:
        z = run(s + 1, x, close)
      else:
        # Skipped when no row closes a chunk (its output is then not read, its caches not written).
        z, out['main'] = nn.cond(
            jnp.any(close),
            lambda mm, *args: mm.main(*args),
            lambda mm, x, positions, valid, caches, slot, write: (jnp.zeros_like(x), caches),
            m,
            x,
            position,
            None,
            out['main'],
            out['main_count'],
            close,
        )
        out['main_count'] = out['main_count'] + close.astype(jnp.int32)
      if bnd.chunk_ema is not None:  # zbar_j = P_j z_j + (1 - P_j) zbar_{j-1}.
        p = at(bnd.chunk_ema)[:, None, None].astype(z.dtype)
        z = p * z + (1.0 - p) * st['above']
      st['above'] = jnp.where(close[:, None, None], z, st['above'])
      gate = 1.0 if bnd.chunk_gate is None else at(bnd.chunk_gate)[:, None, None]
      up = x + (gate * st['above']).astype(x.dtype)
      y, dec = m.level_module('decoder', s)(up, position, None, st['decoder'], slot, live)
      st.update(encoder=enc, decoder=dec, count=i + live.astype(jnp.int32))
      return y

    y = run(0, m.embed(token[:, None]), ones)
    state = {'levels': levels, 'early_logits': early, **out}
    return state, m.head(y)[:, 0], jnp.stack(ends, axis=1).astype(jnp.float32)

  return model.apply({'params': params}, state, method=step)


def stage_keys(key):
  """(key of every stage's boundary draw over the whole buffer, key whose `_step_keys(., t)[1]` draws
  the byte after position t) of `generate_stages`."""
  k_bnd, k_bytes = jax.random.split(key)
  return k_bnd, k_bytes


def stage_boundaries(model, params, tokens, key, mode: str):
  """One forward pass: tokens int32[B, N] -> (next-byte logits float32[B, N, V], every stage's chunk
  ends on bytes float32[B, S, N] (`interface.levels_on_bytes`: one level of zeros for a model
  without stages))."""
  out = model.apply({'params': params}, tokens, key, mode=mode)
  return out.logits, interface.levels_on_bytes(out)


@functools.partial(
    jax.jit, static_argnames=('model', 'num_bytes', 'mode', 'temperature', 'top_k', 'cached')
)
def generate_stages(
    model,
    params,
    prompt,
    key,
    num_bytes: int,
    *,
    mode: str = 'sample',
    temperature: float = 1.0,
    top_k: int = 0,
    cached: bool = True,
    lengths=None,
):
  """Continues prompt: int32[B, P] (starting with BOS) by num_bytes bytes with a model of any number
  of stages and any causal boundary method, or the flat model (see the module docstring).
  cached: each byte goes through the stacks' key/value caches (`cached_stages_step`); else step t
  runs `stage_boundaries` on the whole buffer (PAD after the last byte known) and keeps its decisions
  and logits at t. Both decide the same boundaries. lengths: optional int32[B] prompt lengths, as in
  `generate`.

  Returns {'tokens': int32[B, N] (N = P + num_bytes), 'actions': float32[B, S, N] (every stage's chunk
  ends on bytes, as decided at each step), 'logits': float32[N, B, V]}. Boundaries use the key
  stage_keys(key)[0] for every step: `stage_boundaries` with it on the final tokens (padded by one
  position) gives the same actions.
  """
  b, p = prompt.shape
  n = p + num_bytes
  lengths = jnp.full((b,), p, jnp.int32) if lengths is None else lengths
  if model.num_stages:
    model = with_capacity(model, n + 1)
  k_bnd, k_bytes = stage_keys(key)
  tokens0 = jnp.concatenate([prompt, jnp.full((b, num_bytes + 1), PAD_ID, jnp.int32)], axis=1)

  def step(carry, t):
    tokens, actions, state = carry
    if cached:
      state, logits, ends = cached_stages_step(
          model, params, state, tokens[:, t], t, k_bnd, mode=mode
      )
    else:
      logits, levels = stage_boundaries(model, params, tokens, k_bnd, mode)
      logits, ends = jnp.take(logits, t, axis=1), levels[:, :, t]
    sampled = sample_byte(logits, _step_keys(k_bytes, t)[1], temperature, top_k)
    nxt = jnp.where(t + 1 < lengths, jnp.take(tokens, t + 1, axis=1), sampled)
    # The byte after the last step is not kept: the spare position stays PAD.
    tokens = tokens.at[:, t + 1].set(jnp.where(t + 1 < n, nxt, PAD_ID))
    actions = actions.at[:, :, t].set(ends)
    return (tokens, actions, state), logits

  state = init_stage_caches(model, b, n + 1) if cached else None
  actions0 = jnp.zeros((b, interface.byte_levels(model), n), jnp.float32)
  (tokens, actions, _), logits = jax.lax.scan(step, (tokens0, actions0, state), jnp.arange(n))
  return {'tokens': tokens[:, :n], 'actions': actions, 'logits': logits}


def generation_fn(model):
  """What generates from model: `generate` for one stage of the learned policy
  (`incremental_policy`), `generate_stages` for every other model; both take the same arguments."""
  return generate if incremental_policy(model) else generate_stages


def buffer_length(needed: int, window: int, smallest: int = 64) -> int:
  """The static buffer of a sliding step: the smallest power of two >= needed (at least `smallest`),
  at most window."""
  n = smallest
  while n < needed and n < window:
    n *= 2
  return min(n, window)


def slide(
    model,
    params,
    prompts,
    key,
    *,
    window: int,
    max_bytes: int,
    mode: str = 'sample',
    temperature: float = 1.0,
    top_k: int = 0,
    cached: bool = True,
):
  """Generates max_bytes bytes after each of prompts (list of bytes) with buffers of at most `window`
  positions (the training seq_len), sliding the window over the text. A step's buffer is the step's
  context and room for new bytes: BOS and the whole text when it fits in `cut` bytes, else the last
  cut + 1 bytes of the text with no BOS before them, as training reads a window cut from a document
  (BOS only ever precedes a document's first byte there; before cut text it cost 0.005-0.017 bpb on
  trained main jobs, `python -m tokjax.lab.bos`). The first step's cut leaves room for
  min(max_bytes, window - 1 - window // 2) new bytes; when a buffer is full, the next step's cut is
  window // 2. So memory stays O(window) for any length, and the model never sees more positions
  than in training.

  Rows of different prompt lengths share a buffer (`generate`'s lengths); a buffer's length is
  `buffer_length` of what its rows need, so a few shapes compile. Step i draws with fold_in(key, i).
  A one-stage model with the learned policy generates with `generate`, other boundary methods, more
  stages and the flat model with `generate_stages` (both cached unless cached=False).

  Yields, after every step, one (new bytes, their boundaries float32[S, n]) per prompt (empty once a
  row has all its bytes); the caller may stop early (stop strings).
  """
  if window < 3:
    raise UserError(
        f'a window of {window} positions leaves no room to slide (a step needs context, BOS and a '
        'new byte); generate with a model trained at data.seq_len >= 3.'
    )
  gen = generation_fn(model)
  keep = window // 2
  first_keep = window - 1 - min(max_bytes, window - 1 - keep)
  texts = [bytes(p)[-window:] for p in prompts]
  total = [len(p) for p in prompts]  # Bytes of each text so far; texts keeps only the last window.
  made = [0] * len(texts)
  step = 0
  while any(m < max_bytes for m in made):
    live = [i for i, m in enumerate(made) if m < max_bytes]
    cut = first_keep if step == 0 else keep
    # (BOS then the whole text) or (the last cut + 1 bytes): at most cut + 1 positions either way.
    bufs = [
        [BOS_ID, *texts[i]] if total[i] <= cut else list(texts[i][len(texts[i]) - cut - 1 :])
        for i in live
    ]
    need = max(len(c) + max_bytes - made[i] for c, i in zip(bufs, live))
    n = buffer_length(need, window)
    # Finished rows are replaced by copies of a live one: the batch keeps its compiled size.
    rows = bufs + [bufs[0]] * (len(texts) - len(live))
    buf = np.full((len(rows), n - 1), PAD_ID, np.int32)
    for j, c in enumerate(rows):
      buf[j, : len(c)] = c
    lengths = jnp.asarray([len(c) for c in rows], jnp.int32)
    k = jax.random.fold_in(key, step)
    out = gen(
        model,
        params,
        jnp.asarray(buf),
        k,
        1,
        mode=mode,
        temperature=temperature,
        top_k=top_k,
        cached=cached,
        lengths=lengths,
    )
    actions = np.asarray(out['actions'])
    if actions.ndim == 2:  # `generate`'s one level: [B, N] -> [B, 1, N].
      actions = actions[:, None]
    tokens = np.asarray(out['tokens'])
    news = [(b'', np.zeros((actions.shape[1], 0), np.float32))] * len(texts)
    for j, i in enumerate(live):
      begin = len(bufs[j])
      end = min(n, begin + max_bytes - made[i])
      new = bytes(tokens[j, begin:end].astype(np.uint8).tolist())
      texts[i] = (texts[i] + new)[-window:]  # Only the context of the next step is kept.
      total[i] += len(new)
      made[i] += len(new)
      news[i] = (new, actions[j, :, begin:end])
    step += 1
    yield news


def encode_prompt(prompt: bytes, batch: int = 1):
  """int32[batch, 1 + len(prompt)]: BOS then the prompt's bytes."""
  if not prompt:
    raise UserError('the prompt is empty; pass some text with --prompt="...".')
  return jnp.asarray([[BOS_ID] + list(prompt)] * batch, jnp.int32)
