"""The score-function (REINFORCE) estimator for boundary policies, with its variance reduction.

Per byte position t of row b (CE in nats of predicting byte t+1 at position t):
  1. reward      r_bt = CE_early(t) - CE_full(t)      ('early_exit'), or -CE_full(t)   ('plain')
  2. advantage   A_bt = r_bt - mean_b' r_b't          (batch-relative, over valid rows; optional)
  3. return      G_bt = A_bt + gamma * G_b,t+1        (reverse lax.scan along the sequence)
  4. policy loss -lambda_rl * mean_bt(stopgrad(w_bt G_bt) * log pi(a_bt)) over the policy's own decisions
                 (w_bt: importance ratio pi/mu during an off-policy warm start, else 1)
  5. rate loss   lambda_rate * mean_bt(logit_bt) * stopgrad(mean(p) - target_rate)
The sign: a high return means "better than exiting early", so raising log pi of the action that
preceded it lowers the loss. Rewards are detached: the LM losses never reach the policy's logits.
"""

import jax
import jax.numpy as jnp


def rewards(ce_full, ce_early, kind: str):
  """ce_full, ce_early: float32[B, L] nats -> r: float32[B, L] (no gradient)."""
  if kind == 'early_exit':
    r = ce_early - ce_full
  elif kind == 'plain':
    r = -ce_full
  else:
    raise ValueError(f'unknown reward kind {kind!r}; use "early_exit" or "plain"')
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


def policy_loss(log_probs, returns, free, weights=None):
  """-mean_bt(stopgrad(w G) log pi(a)) over the policy's decisions (`free`), normalised by B * L."""
  coef = jax.lax.stop_gradient(returns if weights is None else weights * returns)
  return -jnp.sum(jnp.where(free, coef * log_probs, 0.0)) / free.size


def rate_loss(logits, probs, mask, target_rate: float):
  """Proportional controller: mean(logit) * stopgrad(mean(p) - r*). Pushes the rate toward r*."""
  mask = mask.astype(logits.dtype)
  n = jnp.maximum(jnp.sum(mask), 1.0)
  mean_p = jnp.sum(probs * mask) / n
  return jnp.sum(logits * mask) / n * jax.lax.stop_gradient(mean_p - target_rate)


def score_function_terms(ce_full, ce_early, bnd, mask, cfg):
  """The policy and rate losses of a boundary draw, and diagnostics.

  ce_full, ce_early: float32[B, L]; bnd: `Boundaries`; mask: float32[B, L] of valid targets;
  cfg: the `estimator` config (reward, batch_relative, gamma, lambda_rl, lambda_rate, target_rate).
  Returns (loss: scalar, metrics: dict of scalars).
  """
  r = rewards(ce_full, ce_early, cfg.reward) * mask
  adv = batch_relative_advantages(r, mask) if cfg.batch_relative else r
  g = discounted_returns(adv, cfg.gamma)
  free = bnd.free & (mask > 0)
  log_ratio = bnd.stats.get('log_ratio')
  weights = None if log_ratio is None else jnp.exp(log_ratio)
  pg = policy_loss(bnd.log_probs, g, free, weights)
  rate = rate_loss(bnd.logits, bnd.probs, free, cfg.target_rate)
  loss = cfg.lambda_rl * pg + (cfg.lambda_rate * rate if cfg.rate_loss else 0.0)
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
  return loss, metrics
