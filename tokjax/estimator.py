"""The score-function (REINFORCE) estimator for boundary policies, with its variance reduction.

Per byte position t of row b (CE in nats of predicting byte t+1 at position t):
  1. reward      r_bt = CE_early(t) - CE_full(t)      ('early_exit'), or -CE_full(t)   ('plain'),
                 or r_bt = CE_cf(t) - CE_full(t)      ('counterfactual', 'counterfactual_greedy')
  2. advantage   A_bt = r_bt - mean_b' r_b't          (batch-relative over valid rows: baseline 'batch')
  3. return      G_bt = A_bt + gamma * G_b,t+1        (reverse lax.scan along the sequence)
  4. policy loss -lambda_rl * sum_bt(stopgrad(w_bt G_bt) * log pi(a_bt)) / (B * L) over the policy's own
                 decisions (w_bt: importance ratio pi/mu during an off-policy warm start, else 1)
  5. rate loss   lambda_rate * sum_bt(logit_bt) / (B * L) * stopgrad(mean(p) - target_rate), the sum
                 over the same decisions and mean(p) their mean probability
One normalisation rule at every stage (tokjax/models/hierarchical.py): the policy and rate losses of a
stage are sums over that stage's own decisions divided by B * L, the byte positions of the batch. A
decision then weighs the same at every stage: a stage-1 decision, one per stage-0 chunk, gets the
gradient weight a stage-0 decision gets, in both losses, and lambda_rl and lambda_rate mean the same
at every level. (Averaging a stage's rate loss over its own decisions instead would make its
controller 1 / r0 times stronger per decision than stage 0's, r0 the stage-0 rate.)
Per-stage settings: stage s reads reward, baseline, gamma, lambda_rl, lambda_rate and its target rate
from its `tokjax.stages.Stage.estimator` (config.stages.sK.estimator where stage K sets them, else
config.estimator's); the functions here read those settings or config.estimator itself alike.
Counterfactual rewards (tokjax/losses.py runs them): CE_cf is the full model's CE, under stop-gradient,
with stage s's decisions and those of every stage above replaced by a second draw given the lower
stages' sampled decisions, which stay fixed ('counterfactual': drawn from the policies with a key
independent of the training draw's; 'counterfactual_greedy': stage s's and the upper stages' greedy
pattern). Given the lower stages, CE_cf does not depend on stage s's sampled decisions, so like the
early exit it adds no bias (tests/test_multistage.py proves it by exact enumeration); unlike the early
exit it differs from CE_full only through stage s's (and the upper stages') decisions, not through
what the full model reads beyond the early-exit head. Each costs one more forward pass per step.
Baselines (config.estimator.baseline, declared at the end of this file in `BASELINES`; 'batch' is
step 2 above, the default):
  'none'   A_bt = r_bt (no baseline).
  'batch'  step 2: the batch-relative advantage (the paper).
  'rloo'   K = estimator.rloo.k draws of boundaries per sequence (rows k*B + b, sharing one encoder
           pass): A_kbt = r_kbt - mean_{k' != k} r_k'bt, then discounted as in step 3. The other draws
           are independent of draw k's actions, so this baseline adds no bias at any gamma.
  'value'  a critic V_bt(encoder state h_bt) and GAE(gamma, lambda = estimator.value.gae_lambda):
           delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lambda A_{t+1};
           the critic is regressed on the detached discounted return G_t (estimator.value.weight * MSE
           relative to mean G^2). h_bt does not depend on any action, so at gamma = lambda = 1
           (A_t = G_t - V_t) it is unbiased.
A new baseline is one more `register_baseline(Baseline(...))` here (see README, "Extending tokjax").
Off-policy warm start (estimator.off_policy_steps > 0): the decisions of the first steps are drawn from
mu = Bernoulli(r*) instead of pi, and step 4's weight of decision t is its own ratio
w_bt = pi(a_bt) / mu(a_bt) only. This is an approximation: G_bt sums rewards at positions k >= t, and
the reward at k depends on every decision up to k, so the unbiased per-decision importance weight of
the term (t, k) is prod_{j <= k} pi(a_bj) / mu(a_bj). Dropping the ratios of the other decisions
(j != t) biases the gradient by however far those ratios are from 1; the bias vanishes as pi -> mu,
which is where the warm start begins (the policy's bias starts at logit(r*) and its projection near 0,
so pi is close to mu). Off by default (0 steps); the paper's runs do not use it.
The sign: a high return means "better than exiting early", so raising log pi of the action that
preceded it lowers the loss. Rewards are detached: the LM losses never reach the policy's logits.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from tokjax.errors import UserError


def rewards(ce_full, ce_early, kind: str):
  """ce_full, ce_early: float32[B, L] nats -> r: float32[B, L] (no gradient).

  ce_early is the baseline's CE: the stage's early exit ('early_exit'), or the counterfactual's
  CE_cf for the counterfactual kinds (`COUNTERFACTUAL`); 'plain' ignores it.
  """
  if kind == 'early_exit' or kind in COUNTERFACTUAL:
    r = ce_early - ce_full
  elif kind == 'plain':
    r = -ce_full
  else:
    raise ValueError(f'unknown reward kind {kind!r}; use one of {REWARDS}')
  return jax.lax.stop_gradient(r)


def batch_relative_advantages(r, mask):
  """A_bt = r_bt - (masked) mean over the batch at position t. r: [B, L], mask: [B, L] -> [B, L].

  Under data parallelism the batch axis is sharded, and this mean is still over the global batch:
  jit inserts the cross-device reduction.
  """
  mask = mask.astype(r.dtype)
  mean = jnp.sum(r * mask, axis=0) / jnp.maximum(jnp.sum(mask, axis=0), 1.0)
  return (r - mean[None, :]) * mask


def discounted_returns(a, gamma: float):
  """G_t = a_t + gamma * G_{t+1}, by a reverse scan over the sequence axis. a: [B, L] -> [B, L]."""

  def step(g_next, a_t):
    g = a_t + gamma * g_next
    return g, g

  _, g = jax.lax.scan(step, jnp.zeros(a.shape[0], a.dtype), a.T, reverse=True)
  return g.T


def leave_one_out_advantages(r, mask, k: int):
  """A = r - mean of the other k - 1 draws of the same sequence, per position.

  r, mask: [K*B, L], sample-major (row k*B + b is draw k of sequence b) -> [K*B, L]. Positions where a
  draw is masked take no part in the others' baseline.
  """
  kb, l = r.shape
  if kb % k:
    raise ValueError(f'{kb} rows do not split into rloo_k={k} draws per sequence')
  mask = mask.astype(r.dtype)
  rk, mk = (r * mask).reshape(k, kb // k, l), mask.reshape(k, kb // k, l)
  others = (jnp.sum(rk, 0)[None] - rk) / jnp.maximum(jnp.sum(mk, 0)[None] - mk, 1.0)
  return ((rk - others) * mk).reshape(kb, l)


def gae_advantages(r, values, gamma: float, lam: float, mask):
  """Generalised advantage estimation. r, values, mask: [B, L] -> A: [B, L] (no gradient to values).

  delta_t = r_t + gamma V_{t+1} - V_t (V after the last position is 0), A_t = sum_k (gamma lam)^k
  delta_{t+k}. At gamma = lam = 1, A_t = G_t - V_t.
  """
  mask = mask.astype(r.dtype)
  v = jax.lax.stop_gradient(values) * mask
  v_next = jnp.pad(v[:, 1:], ((0, 0), (0, 1)))
  return discounted_returns((r + gamma * v_next - v) * mask, gamma * lam)


def value_loss(values, returns, mask):
  """Critic regression: masked mean of (V - stopgrad(G))^2 / stopgrad(mean G^2), scale-free.

  values, returns, mask: [B, L] -> scalar. Returns of hundreds of bytes reach tens of nats; a raw MSE
  of that size would dominate the global-norm gradient clip and shrink every other update, so the
  error is measured relative to the returns' own mean square (1 for a critic that predicts 0).
  """
  mask = mask.astype(values.dtype)
  g = jax.lax.stop_gradient(returns) * mask
  n = jnp.maximum(jnp.sum(mask), 1.0)
  err = (values - g) * mask
  return jnp.sum(err * err) / n / jnp.maximum(jnp.sum(g * g) / n, 1e-6)


def policy_loss(log_probs, returns, free, weights=None, per=None):
  """-sum_bt(stopgrad(w G) log pi(a)) over the policy's decisions (`free`) / per (default free.size).

  log_probs, returns, free, weights: [B, N] -> scalar.
  """
  coef = jax.lax.stop_gradient(returns if weights is None else weights * returns)
  per = free.size if per is None else per
  return -jnp.sum(jnp.where(free, coef * log_probs, 0.0)) / per


def rate_loss(logits, probs, mask, target_rate: float, per=None):
  """Proportional controller: sum(logit) / per * stopgrad(mean(p) - r*). Pushes the rate toward r*.

  logits, probs, mask: [B, N] -> scalar; sums and the mean are over mask; per defaults to sum(mask)
  (the mean logit).
  """
  mask = mask.astype(logits.dtype)
  n = jnp.maximum(jnp.sum(mask), 1.0)
  mean_p = jnp.sum(probs * mask) / n
  per = n if per is None else per
  return jnp.sum(logits * mask) / per * jax.lax.stop_gradient(mean_p - target_rate)


def advantages_and_returns(r, mask, cfg, values=None):
  """The coefficient G of log pi under cfg.baseline, and the baseline's own loss (0 without a critic).

  r: float32[B, L] rewards (rows sample-major in K groups for 'rloo'); values: float32[B, L] for
  'value'. Returns (adv: [B, L] per-position advantages before discounting (GAE deltas for 'value'),
  G: [B, L], loss: scalar, already weighted, metrics: dict of scalars).
  """
  return baseline(cfg.baseline).advantages(r, mask, cfg, values)


def score_function_terms(
    ce_full, ce_early, bnd, mask, cfg, *, values=None, positions=None, target_rate=None
):
  """The policy and rate losses of a boundary draw (and the critic's loss), and diagnostics.

  ce_full, ce_early: float32[B, L]; bnd: `Boundaries`; mask: float32[B, L] of valid targets;
  cfg: the `estimator` config (reward, baseline and its section, gamma, lambda_rl, lambda_rate,
  rate_loss, target_rate); values: float32[B, L] critic output for baseline 'value'.
  Returns (loss: scalar, metrics: dict of scalars).

  Stages above the bytes (tokjax/models/hierarchical.py): bnd holds decisions over N positions,
  positions: int32[B, N] gives the byte where each one ends (L on padding), ce_early is that stage's
  early exit and target_rate its own. A decision there first changes the prediction at its byte, so
  its return is the byte-level return G at that byte: advantages are per byte and discounted along
  bytes, for every stage. Discounting along bytes keeps gamma's horizon in bytes (about 1 / (1 -
  gamma) of them) the same at every level; discounting along a stage's own positions would make the
  horizon in bytes grow with the chunk lengths that policy is still learning, moving the estimator's
  bias and variance as its rate moves. The policy and rate losses are both sums over the stage's
  decisions divided by B * L at every stage (the module docstring's normalisation rule); cfg is the
  stage's own settings (`tokjax.stages.Stage.estimator`).
  """
  r = rewards(ce_full, ce_early, cfg.reward) * mask
  adv, g, baseline_loss, baseline_metrics = advantages_and_returns(r, mask, cfg, values)
  if positions is None:
    free = bnd.free & (mask > 0)
  else:
    at = jnp.minimum(positions, mask.shape[1] - 1)
    take = lambda x: jnp.take_along_axis(x, at, axis=1)
    adv, g = take(adv), take(g)
    free = bnd.free & (positions < mask.shape[1]) & (take(mask) > 0)
  log_ratio = bnd.stats.get('log_ratio')
  weights = None if log_ratio is None else jnp.exp(log_ratio)
  pg = policy_loss(bnd.log_probs, g, free, weights, per=mask.size)
  target = cfg.target_rate if target_rate is None else target_rate
  rate = rate_loss(bnd.logits, bnd.probs, free, target, per=mask.size)
  loss = cfg.lambda_rl * pg + (cfg.lambda_rate * rate if cfg.rate_loss else 0.0) + baseline_loss
  n_free = jnp.maximum(jnp.sum(free), 1)
  p = jnp.clip(bnd.probs, 1e-6, 1 - 1e-6)
  entropy = -(p * jnp.log(p) + (1 - p) * jnp.log1p(-p))
  adv_mean = jnp.sum(jnp.where(free, adv, 0.0)) / n_free
  metrics = {
      'policy_loss': pg,
      'rate_loss': rate,
      'policy_entropy': jnp.sum(jnp.where(free, entropy, 0.0)) / n_free,
      'advantage_var': jnp.sum(jnp.where(free, (adv - adv_mean) ** 2, 0.0)) / n_free,
      'return_abs': jnp.sum(jnp.where(free, jnp.abs(g), 0.0)) / n_free,
  }
  metrics.update(baseline_metrics)
  return loss, metrics


# ----------------------------------------------------------------------------------------------------
# The baselines of the score function.


@dataclasses.dataclass(frozen=True)
class Baseline:
  """One baseline of the score function, chosen by config.estimator.baseline = name.

  advantages: (r, mask, cfg, values) -> (adv, G, loss, metrics) as in `advantages_and_returns`; cfg
    is config.estimator or a stage's `tokjax.stages.EstimatorSettings`, the baseline's settings are
    `baseline_settings(cfg, NAME)`.
  defaults: the fields of config.estimator.NAME with their defaults ({} = no settings).
  draws: cfg -> boundary draws per sequence (> 1: the model draws them from one encoder pass and the
    rows come sample-major, draw k of sequence b at row k * B + b).
  critic: the model needs its value head (`values`).
  validate: optional cfg -> None raising UserError for bad settings.
  """

  name: str
  advantages: Callable[..., Any]
  defaults: dict = dataclasses.field(default_factory=dict)
  draws: Callable[[Any], int] = lambda cfg: 1
  critic: bool = False
  description: str = ''
  validate: Callable[[Any], None] | None = None


BASELINES: dict[str, Baseline] = {}


def register_baseline(b: Baseline) -> Baseline:
  BASELINES[b.name] = b
  return b


def baseline(name: str) -> Baseline:
  """The baseline called `name`, or a UserError listing the registered ones."""
  if name not in BASELINES:
    raise UserError(
        f'config.estimator.baseline={name!r} is not valid; use one of {tuple(BASELINES)}.'
    )
  return BASELINES[name]


def baseline_settings(cfg, name: str):
  """The settings of baseline `name` (config.estimator.NAME) in cfg: config.estimator, or a stage's
  `tokjax.stages.EstimatorSettings`, which holds every baseline's section in `baselines`."""
  sections = getattr(cfg, 'baselines', None)
  return cfg[name] if sections is None else sections[name]


def _discounted(adv, cfg):
  return adv, discounted_returns(adv, cfg.gamma), jnp.zeros(()), {}


register_baseline(
    Baseline(
        name='none',
        advantages=lambda r, mask, cfg, values: _discounted(r, cfg),
        description='no baseline: A = r',
    )
)
register_baseline(
    Baseline(
        name='batch',
        advantages=lambda r, mask, cfg, values: _discounted(
            batch_relative_advantages(r, mask), cfg
        ),
        description='batch-relative advantage: r minus the batch mean at each position (the paper)',
    )
)


def _validate_rloo(cfg):
  k = baseline_settings(cfg, 'rloo').k
  if not (isinstance(k, int) and k >= 2):
    raise UserError(
        f'config.estimator.rloo.k={k!r} must be an integer >= 2 (leave-one-out needs at least two '
        'boundary draws per sequence).'
    )


register_baseline(
    Baseline(
        name='rloo',
        advantages=lambda r, mask, cfg, values: _discounted(
            leave_one_out_advantages(r, mask, baseline_settings(cfg, 'rloo').k), cfg
        ),
        defaults=dict(k=4),  # Boundary draws per sequence (one encoder pass).
        draws=lambda cfg: baseline_settings(cfg, 'rloo').k,
        description='leave-one-out over k boundary draws of each sequence',
        validate=_validate_rloo,
    )
)


def _value_advantages(r, mask, cfg, values):
  if values is None:
    raise ValueError(
        'baseline "value" needs the critic\'s values (model built with value_head=True)'
    )
  value = baseline_settings(cfg, 'value')
  g = gae_advantages(r, values, cfg.gamma, value.gae_lambda, mask)
  critic = value_loss(values, discounted_returns(r, cfg.gamma), mask)
  return g, g, value.weight * critic, {'value_loss': critic}


def _validate_value(cfg):
  value = baseline_settings(cfg, 'value')
  if not 0.0 <= value.gae_lambda <= 1.0:
    raise UserError(f'config.estimator.value.gae_lambda={value.gae_lambda} must be in [0, 1].')
  if not value.weight >= 0.0:
    raise UserError(f'config.estimator.value.weight={value.weight} must be >= 0.')


register_baseline(
    Baseline(
        name='value',
        advantages=_value_advantages,
        defaults=dict(
            gae_lambda=0.95,  # GAE lambda.
            weight=0.01,  # Weight of the critic's regression loss.
        ),
        critic=True,
        description='learned value baseline (critic on the encoder state) with GAE(gamma, lambda)',
        validate=_validate_value,
    )
)


# ----------------------------------------------------------------------------------------------------
# Checks of every stage's score-function settings.

# Rewards (`rewards`). The counterfactual kinds map to the modes of the counterfactual's stage and
# those above it (the stages below run 'given').
COUNTERFACTUAL = {'counterfactual': 'sample', 'counterfactual_greedy': 'greedy'}
REWARDS = ('early_exit', 'plain', *COUNTERFACTUAL)


def counterfactual_mode(kind: str):
  """The boundary mode of a counterfactual's redrawn stages for reward `kind`, or None."""
  return COUNTERFACTUAL.get(kind)


def validate(config, levels, score_function: tuple[bool, ...]) -> None:
  """Raises UserError naming the first bad field of config.estimator or of a stage's estimator
  settings (by `Stage.where`: config.stages.s1.estimator.gamma where stage 1 sets it).

  levels: the model's `tokjax.stages.Stage`s (their model fields already checked); score_function:
  for each level, whether its boundaries train with the score function (the model's checks say).
  """
  est = levels[0].estimator
  for st in levels:
    _validate_stage(st)
  first = bool(score_function) and score_function[0]
  b = baseline(est.baseline)
  if b.validate:
    b.validate(est)
  if len(levels) > 1:
    _validate_inner_baselines(config, levels)
  if (b.critic or b.draws(est) > 1) and not first:
    raise UserError(
        f'config.estimator.baseline={est.baseline!r} needs a hierarchical model whose boundary '
        f'method trains with the score function (boundary.method="policy"); this config has '
        f'model.kind={config.model.kind!r}, boundary.method={levels[0].method!r}. Set '
        '--config.estimator.baseline=batch.'
    )
  if est.off_policy_steps > 0 and not first:
    raise UserError(
        f'config.estimator.off_policy_steps={est.off_policy_steps} needs a boundary method '
        'trained with the score function (boundary.method="policy"); set it to 0.'
    )
  if not est.rate_loss:
    _check_buffers_hold_every_boundary(config, levels, score_function)


def _check_buffers_hold_every_boundary(config, levels, score_function) -> None:
  """Without the rate loss nothing holds a trained level's rate down, and a chunk buffer smaller
  than its input caps the rate at about capacity / input length: every level that trains with the
  score function needs room for a boundary at each of its input positions."""
  inputs, input_field = config.data.seq_len, 'config.data.seq_len'
  for st, trained in zip(levels, score_function):
    field = st.where('capacity')
    if trained and st.capacity < inputs:
      own = (
          'config.model.capacity' if st.level == 0 else f'config.stages.s{st.level}.model.capacity'
      )
      raise UserError(
          f'config.estimator.rate_loss=False needs {field} >= {input_field} (here '
          f'{st.capacity} < {inputs}): nothing holds the rate down, and a smaller buffer caps it '
          f'at about capacity / input length; set --{own}={inputs}.'
      )
    # Level s + 1 reads the chunks of level s.
    inputs, input_field = st.capacity, field


def _validate_stage(st) -> None:
  """A stage's reward, discount and weights."""
  cfg, where = st.estimator, lambda f: st.where(f'estimator.{f}')
  if cfg.reward not in REWARDS:
    raise UserError(f'{where("reward")}={cfg.reward!r} is not valid; use one of {REWARDS}.')
  if not 0.0 <= cfg.gamma <= 1.0:
    raise UserError(f'{where("gamma")}={cfg.gamma!r} must be in [0, 1].')
  for field in ('lambda_rl', 'lambda_rate'):
    if not getattr(cfg, field) >= 0.0:
      raise UserError(f'{where(field)}={getattr(cfg, field)!r} must be >= 0.')


def _validate_inner_baselines(config, levels) -> None:
  """The baselines of stages 1..S-1: no critic (the model has one, for stage 0), and the draws per
  sequence that every stage shares."""
  est = levels[0].estimator
  draws = baseline(est.baseline).draws(est)
  for st in levels[1:]:
    name, field = st.estimator.baseline, st.where('estimator.baseline')
    if name not in BASELINES:
      raise UserError(
          f'{field}={name!r} is not valid; use one of '
          f'{tuple(k for k, b in BASELINES.items() if not b.critic)}.'
      )
    b = baseline(name)
    if b.critic and field != 'config.estimator.baseline':
      raise UserError(
          f'{field}={name!r} needs a critic, and the model has one only for stage 0; use "batch", '
          '"rloo" or "none".'
      )
    if b.draws(est) not in (1, draws):
      raise UserError(
          f'{field}={name!r} needs {b.draws(est)} boundary draws per sequence, which every stage '
          f'shares: set config.estimator.baseline={name!r} too, or use "batch".'
      )
  if est.baseline == 'value':
    raise UserError(
        f'config.estimator.baseline="value" has one critic, for stage 0; with config.model.stages='
        f'{len(levels)} use "batch", "rloo" or "none" (each applies per stage).'
    )
