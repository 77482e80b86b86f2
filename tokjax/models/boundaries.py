"""Chunk boundaries: the one convention every boundary method uses, and the learned boundary policy.

THE CONVENTION (used everywhere in tokjax):
  a[b, t] = 1 means byte t is the LAST byte of its chunk. Position 0 and position L-1 are always
  boundaries (forced, so every row starts a chunk at 0 and closes its last chunk); forced decisions are
  not the policy's and carry no gradient. j(t) = cumsum(a)[t] - 1 is the latest chunk COMPLETE at t (the
  latest one ending at or before t): byte t's own chunk when a_t = 1, the chunk before it when a_t = 0
  (byte t's own chunk is still open then). Byte t reads chunk j(t), never an open one.

CAPACITY: the chunk buffer has a fixed size C (static shapes, one compilation). Once C - 1 chunks are
closed before the last position, every later boundary is dropped (executed as 0) and the final forced
boundary closes chunk C. Those dropped decisions are not the policy's either: the executed action was
forced by the full buffer, so its log-probability is log 1 = 0 and it is masked out of the policy loss.
The estimator therefore differentiates the policy the model actually executed, which keeps it unbiased.
Dropped boundaries are counted as `overflow` in the metrics.

THE POLICY (Dauncey & Wattenhofer 2026). A linear map gives v_t in R^w from the encoder state h_t;
  x_t = v_t[w-1] + sum_{k=1..w-1} v_t[w-1-k] * a_{t-k}
reads it with the previous w - 1 executed decisions (x_t = v_t for w = 1). Two parametrisations
(config.boundary.policy.form):
  plain:   logit_t = x_t + bias
  scaled:  z_t = s * x_t + bias,   logit_t = 6 tanh(z_t / 6),   s = 1/16 (policy.scale)
and p_t = sigmoid(logit_t). 'auto' (the default) is plain for w = 1 (independent decisions, sampled
in parallel) and scaled for w > 1 (the paper's sequential policy); naming one of them holds the
parametrisation fixed while the window changes, so an ablation can vary one factor at a time. For
w > 1 each decision depends on the previous w - 1 executed ones, so they are sampled by a `lax.scan`
on device. The bias starts where the initial logit is logit(target rate): at logit(r*) itself in the
plain form, at 6 artanh(logit(r*) / 6) in the scaled form (inside the softcap's inverse, so
6 tanh(bias / 6) = logit(r*) exactly). The projection is a read-out: its init has standard deviation
0.02 up to d_model = 128 and 0.02 * 128 / d_model above (the 1 / width read-out scaling of muP), so
the initial logit noise v_t shrinks as the model widens and the initial rate stays at the target
(mean initial p_t over 4 initialisations on 8 x 256 bytes of the standard library, w = 1: 0.205 at
d_model = 128; 0.203 at d_model = 768, where a width-independent 0.02 gave 0.244; tests/test_rivals.py
checks d_model = 768).
('auto' leaves the 1/16 scale out of the independent policy: there it acts as a 16x smaller learning
rate, and at CPU scale the policy then learns nothing in the first thousand steps.)
Log-probabilities of the executed actions are then recomputed in parallel from the same formula, which
is what the gradient flows through.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from tokjax.errors import UserError
from tokjax.models import registry


def forced_mask(shape) -> jax.Array:
  """bool[B, L]: the positions whose boundary is forced (first and last byte)."""
  t = jnp.arange(shape[-1])
  return jnp.broadcast_to((t == 0) | (t == shape[-1] - 1), shape)


def enforce_convention(sampled, capacity: int):
  """Applies the convention to raw decisions.

  sampled: {0,1}[B, L] -> (executed float32[B, L], free bool[B, L], dropped float32[B, L]) where
  `free` marks the decisions that were the policy's (not forced, buffer not full) and `dropped` the
  sampled boundaries that the full buffer turned into 0.
  """
  forced = forced_mask(sampled.shape)
  s = jnp.where(forced, 0.0, sampled.astype(jnp.float32))
  # Before the buffer fills, executed == sampled, so the exclusive count of sampled boundaries among
  # positions 1..t-1 tells whether there is room at t (one chunk is already open at position 0 and
  # one slot is kept for the forced final boundary).
  count_before = jnp.cumsum(s, axis=-1) - s
  room = count_before < capacity - 2
  free = room & ~forced
  executed = jnp.where(forced, 1.0, s * room)
  return executed, free, s * (1.0 - room)


def chunk_index(actions):
  """int32[B, L]: j(t) = cumsum(a)[t] - 1, the latest chunk complete at t (byte t's own chunk only
  where a_t = 1; where a_t = 0 byte t's chunk is j(t) + 1, still open)."""
  return jnp.cumsum(actions.astype(jnp.int32), axis=-1) - 1


@flax.struct.dataclass
class Boundaries:
  """What a boundary method hands the hierarchical model (all [B, L]).

  actions: float32 executed boundaries in {0, 1} (straight-through methods may attach a gradient).
  logits: the policy's logits (zeros for fixed rules); probs: their sigmoid (or the method's p_t).
  log_probs: log pi(executed action); only meaningful where `free`.
  free: bool, decisions that belong to the policy (score-function gradient flows only there).
  dropped: boundaries sampled but dropped for lack of capacity.
  aux_loss: a scalar the method adds to the total loss (0 for most); chunk_gate: optional float32[B, L]
  multiplier on upsampled chunk outputs (straight-through methods), the factor of the executed action
  in `rivals.common.ste_gate`'s form (c + stopgrad(1 - c), c = p or 1 - p); stats: extra scalar
  metrics.
  chunk_ema: optional float32[B, L] smoothing probabilities (H-Net): chunk j's output is replaced by
  P_j z_j + (1 - P_j) zbar_{j-1} with P_j = chunk_ema at chunk j's last byte (see chunking.ema_chunks).
  """

  actions: jax.Array
  logits: jax.Array
  probs: jax.Array
  log_probs: jax.Array
  free: jax.Array
  dropped: jax.Array
  aux_loss: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros(()))
  chunk_gate: Any = None
  stats: Any = dataclasses.field(default_factory=dict)
  chunk_ema: Any = None


def restrict_to_valid(bnd: Boundaries, valid) -> Boundaries:
  """Boundaries over a padded sequence (an inner stage's chunks): n valid positions, then padding.

  valid: bool[B, N], True on a prefix of each row. The convention then applies to the valid prefix:
  its last position n - 1 is a forced boundary (it closes the last chunk, as position L - 1 does for
  bytes), padding holds no boundary, and neither is a decision of the policy. The method's own room
  rule already kept one slot free for a final boundary at or after n - 1, so capacity still holds.
  A straight-through `chunk_gate` (`rivals.common.ste_gate`'s form) follows the executed actions.
  """
  n = jnp.sum(valid, axis=-1, keepdims=True)
  last = jnp.arange(valid.shape[-1]) == n - 1
  inside = valid & ~last
  actions = jnp.where(last, 1.0, jnp.where(valid, bnd.actions, 0.0))
  gate = bnd.chunk_gate
  if gate is not None:
    # The straight-through factor is that of the executed action (p for a boundary, 1 - p for none,
    # forward value 1): where restriction flips the action, c + sg(1 - c) becomes 2 - (c + sg(1 - c)).
    flipped = (actions > 0.5) != (bnd.actions > 0.5)
    gate = jnp.where(flipped, 2.0 - gate, gate)
  return dataclasses.replace(
      bnd,
      actions=actions,
      chunk_gate=gate,
      free=bnd.free & inside,
      dropped=jnp.where(inside, bnd.dropped, 0.0),
  )


def bernoulli_log_prob(logits, actions):
  """log pi(a) for a ~ Bernoulli(sigmoid(logits)), elementwise."""
  return jnp.where(actions > 0.5, jax.nn.log_sigmoid(logits), jax.nn.log_sigmoid(-logits))


def _history_term(v, actions, window: int):
  """sum_{k=1..w-1} v[..., w-1-k] * a_{t-k}, for v: [B, L, w] and actions: [B, L]."""
  total = jnp.zeros(actions.shape, v.dtype)
  for k in range(1, window):
    shifted = jnp.pad(actions, ((0, 0), (k, 0)))[:, : actions.shape[1]]
    total = total + v[..., window - 1 - k] * shifted
  return total


def sample_sequential(v, bias, uniforms, scale: float, capacity: int, scaled: bool = True):
  """Draws boundaries one position at a time, each conditioned on the previous w - 1 executed ones.

  v: [B, L, w] policy features, bias: scalar, uniforms: [B, L] in [0, 1) -> sampled {0,1} float32[B, L]
  (raw samples: `enforce_convention` turns them into executed actions; forced positions are ignored).
  scaled: the logit's form (`form_logit`).
  """
  b, l, w = v.shape
  t_idx = jnp.arange(l)

  def step(carry, inputs):
    history, count = carry  # history: executed a_{t-1}, ..., a_{t-w+1}: [B, w-1]; count: [B].
    v_t, u_t, t = inputs
    x = v_t[:, w - 1] + jnp.sum(v_t[:, w - 2 :: -1][:, : w - 1] * history, axis=-1)
    p = jax.nn.sigmoid(form_logit(x, bias, scale, scaled))
    sample = (u_t < p).astype(jnp.float32)
    forced = (t == 0) | (t == l - 1)
    executed = jnp.where(forced, 1.0, sample * (count < capacity - 2))
    count = count + jnp.where(forced, 0.0, executed)
    history = jnp.concatenate([executed[:, None], history[:, :-1]], axis=1)
    return (history, count), sample

  init = (jnp.zeros((b, max(w - 1, 1)), v.dtype), jnp.zeros((b,), v.dtype))
  _, samples = jax.lax.scan(step, init, (v.swapaxes(0, 1), uniforms.swapaxes(0, 1), t_idx))
  return samples.swapaxes(0, 1)


PROJ_STD, PROJ_WIDTH = 0.02, 128  # Projection init: std 0.02 up to width 128, then ~ 1 / width.
SOFTCAP = 6.0  # Scaled-form logits are SOFTCAP * tanh(z / SOFTCAP).
# config.boundary.policy.form: 'auto' is 'plain' for w = 1 and 'scaled' for w > 1.
FORMS = ('auto', 'plain', 'scaled')


def is_scaled(form: str, window: int) -> bool:
  """Whether the logit has the scaled, softcapped form (the module docstring's two forms)."""
  return window > 1 if form == 'auto' else form == 'scaled'


def form_logit(x, bias, scale: float, scaled: bool):
  """The logit from x_t = v_t[w-1] + the history term: x + bias, or 6 tanh((s x + bias) / 6)."""
  if not scaled:
    return x + bias
  z = scale * x + bias
  return SOFTCAP * jnp.tanh(z / SOFTCAP)


def initial_bias(target_rate: float, window: int, form: str = 'auto') -> jax.Array:
  """The bias whose logit is logit(target_rate): inside the softcap's inverse in the scaled form."""
  logit = jnp.log(target_rate / (1.0 - target_rate))  # float32, as the w = 1 runs always had it.
  return SOFTCAP * jnp.arctanh(logit / SOFTCAP) if is_scaled(form, window) else logit


class BoundaryPolicy(nn.Module):
  """The score-function method's policy: encoder states h: [B, L, D] -> `Boundaries`."""

  target_rate: float = 0.2
  window: int = 1
  scale: float = 1.0 / 16.0
  capacity: int = 64
  form: str = 'auto'  # `FORMS`: the logit's parametrisation (module docstring).

  @nn.compact
  def __call__(
      self,
      h,
      key,
      mode: str = 'sample',
      actions=None,
      tokens=None,
      early_logits=None,
      behavior=None,
  ):
    """mode: 'sample' (draw with `key`), 'greedy' (p > 0.5) or 'given' (evaluate `actions`).

    behavior: optional traced bool; when true (off-policy warm start) the decisions are drawn from
    Bernoulli(target_rate) instead, and `stats['log_ratio']` holds log pi(a) - log mu(a) for importance
    weighting. tokens and early_logits are unused here (rule-based methods need them).

    The policy reads a stop-gradient-free h: its gradient reaches the encoder only through the policy
    and rate losses, because the LM losses see `actions` (non-differentiable samples), not the logits.
    """
    std = PROJ_STD * min(1.0, PROJ_WIDTH / h.shape[-1])
    v = nn.Dense(
        self.window,
        name='proj',
        dtype=jnp.float32,
        kernel_init=nn.with_logical_partitioning(nn.initializers.normal(std), ('embed', None)),
        use_bias=False,
    )(
        h.astype(jnp.float32)
    )  # [B, L, w]
    rate = self.target_rate
    bias = self.param(
        'bias',
        nn.initializers.constant(initial_bias(rate, self.window, self.form)),
        (),
        jnp.float32,
    )
    scaled = is_scaled(self.form, self.window)

    def logits_given(executed):
      x = v[..., self.window - 1]
      if self.window > 1:
        x = x + _history_term(v, executed, self.window)
      return form_logit(x, bias, self.scale, scaled)

    if mode == 'given':
      sampled = actions
    elif self.window == 1:
      logits0 = logits_given(jnp.zeros(h.shape[:2]))
      if mode == 'greedy':
        sampled = (logits0 > 0).astype(jnp.float32)
      else:
        sampled = jax.random.bernoulli(key, jax.nn.sigmoid(logits0)).astype(jnp.float32)
    else:
      # Greedy is sampling with u = 0.5: a boundary wherever p > 0.5 given the executed history.
      u = jnp.full(h.shape[:2], 0.5) if mode == 'greedy' else jax.random.uniform(key, h.shape[:2])
      sampled = sample_sequential(
          jax.lax.stop_gradient(v),
          jax.lax.stop_gradient(bias),
          u,
          self.scale,
          self.capacity,
          scaled,
      )
    if behavior is not None:
      mu_draw = jax.random.bernoulli(jax.random.fold_in(key, 1), rate, h.shape[:2])
      sampled = jnp.where(behavior, mu_draw.astype(jnp.float32), sampled)
    executed, free, dropped = enforce_convention(jax.lax.stop_gradient(sampled), self.capacity)
    logits = logits_given(executed)
    log_probs = bernoulli_log_prob(logits, executed)
    stats = {}
    if behavior is not None:
      log_mu = bernoulli_log_prob(jnp.log(rate / (1.0 - rate)), executed)
      stats['log_ratio'] = jnp.where(behavior, log_probs - log_mu, 0.0)
    return Boundaries(
        actions=executed,
        logits=logits,
        probs=jax.nn.sigmoid(logits),
        log_probs=log_probs,
        free=free,
        dropped=dropped,
        stats=stats,
    )


def _build(stage, config):
  del config
  p = stage.settings
  return BoundaryPolicy(
      target_rate=stage.target_rate,
      window=p.window,
      scale=p.scale,
      capacity=stage.capacity,
      form=p.form,
  )


def _validate(stage):
  p, where = stage.settings, lambda f: stage.where(f'settings.{f}')
  if not (isinstance(p.window, int) and p.window >= 1):
    raise UserError(f'{where("window")}={p.window!r} must be an integer >= 1.')
  if not p.scale > 0:
    raise UserError(f'{where("scale")}={p.scale!r} must be positive (1/16 is usual).')
  if p.form not in FORMS:
    raise UserError(
        f'{where("form")}={p.form!r} must be one of {", ".join(map(repr, FORMS))} '
        "('auto': plain for window 1, scaled above)."
    )


registry.register(
    registry.BoundaryMethod(
        name='policy',
        build=_build,
        defaults=dict(
            window=1,  # w: 1 = independent decisions, 8 = sequential (the paper's reference).
            scale=1.0 / 16.0,  # Logit scale s of the scaled form.
            # The logit: 'plain' (v + history + bias) | 'scaled' (s * (v + history) + bias,
            # softcapped at 6) | 'auto' (plain for w = 1, scaled for w > 1: the paper's policy).
            form='auto',
        ),
        score_function=True,
        sampling=True,
        inner_stages=True,
        description='the learned policy, trained by the score function (the paper)',
        validate=_validate,
    )
)
