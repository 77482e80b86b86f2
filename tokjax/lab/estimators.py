r"""The estimator lab: bias and variance of boundary-gradient estimators on one fixed model and batch.

  python -m tokjax.lab.estimators [--samples 4000] [--out results/estimators]      # tiny model
  python -m tokjax.lab.estimators --config configs/compare.py:policy --samples 256        # fresh model
  python -m tokjax.lab.estimators --checkpoint runs/default --samples 256          # trained model

ONE ESTIMATE is the gradient, with respect to the boundary policy's own parameters, of the policy loss
of one boundary draw of the whole batch (lambda_rl = 1; the rate loss is left out: it is a controller,
not an estimate of anything). For a score-function variant with a sound baseline its expectation is
  g* = grad_theta E_{a ~ pi_theta}[ sum_bt CE_full(b, t; a) ] / (B L),
the gradient of the expected LM loss of the discrete problem (CE at t depends on a_<=t only, so the
return's past terms vanish in expectation). Draws are shared between the score-function variants (each
variant's statistics come from independent draws; only comparisons across variants are correlated).

THE REFERENCE g*: on the tiny model (L = 8, 2^6 boundary patterns per row) it is exact: every pattern's
CE is computed and E = sum_a pi(a) CE(a) is differentiated. On a config or checkpoint it is sampled from
--ref_samples separate draws, grouped in fours into leave-one-out (RLOO, K = 4) gamma = 1 estimates:
unbiased, and the lowest-variance unbiased estimator here (`sampled_reference`); its own noise (trace
of its covariance / estimates) is subtracted in the bias statistics.

STRAIGHT-THROUGH ESTIMATORS (tiny model only) are gradients of mean CE_full with respect to their own
predictor's parameters, so they are compared in their own parameter space, against that predictor's own
discrete problem, with scale-free statistics (cosines, bias and variance relative to |g*|^2):
  * Gumbel (dynamic token pooling): the hard decision [s_t > 0.5] of the Gumbel-sigmoid is exactly
    a_t ~ Bernoulli(sigmoid(logit_t)), so g* = grad E_{a ~ Bern(sigmoid(logit))}[CE(a)] over the MLP's
    parameters, enumerated; the straight-through factor (forward value 1) is not part of the loss.
  * H-Net: the rule a_t = [p_t >= 0.5] is deterministic (its expected loss is piecewise constant in a),
    so g* is taken for the natural Bernoulli(p_t) relaxation, E_{a ~ Bern(p)}[CE(a; theta)], including
    the genuine pathwise dependence through EMA smoothing and excluding the straight-through factor.
    The H-Net estimate is deterministic: variance 0.

STATISTICS (`summarize`): variance = trace of the sample covariance; cos(single, mean) and cos(single,
ref) averaged over estimates; bias = sqrt(max(|mean - g*|^2 - tr(Cov)/N - ref noise, 0)), an unbiased
estimate of |bias|^2 under the square root; bias_chi = |mean - g*|^2 / (tr(Cov)/N + ref noise), about 1
for an unbiased estimator and large for a biased one. RLOO and mean-of-K estimates use K draws each:
`var_x_draws` (variance times draws per estimate) compares estimators at equal sampling cost.
"""

import dataclasses
import os
import sys
import time
from typing import Any, cast

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np

from tokjax import cli, estimator, losses, stages
from tokjax.data import VOCAB_SIZE
from tokjax.errors import UserError
from tokjax.lab import common
from tokjax.models import boundaries as bd
from tokjax.models import hierarchical
from tokjax.models.rivals import gumbel as gumbel_lib
from tokjax.models.rivals import hnet as hnet_lib

GAMMAS = (0.9, 0.97, 0.99, 1.0)


# ----------------------------------------------------------------------------------------------------
# Statistics.


def flatten_batched(tree, n: int) -> np.ndarray:
  """A pytree whose leaves have a leading axis of n -> float64[n, P] (leaves in tree order)."""
  return np.concatenate(
      [np.asarray(x, np.float64).reshape(n, -1) for x in jax.tree.leaves(tree)], 1
  )


def flatten(tree) -> np.ndarray:
  return flatten_batched(jax.tree.map(lambda x: x[None], tree), 1)[0]


def _cos(a, b):
  na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
  return np.sum(a * b, -1) / np.maximum(na * nb, 1e-30)


def summarize(estimates, reference=None, reference_noise: float = 0.0) -> dict:
  """Variance, cosines and bias of estimates: float[N, P] against reference: float[P] (optional).

  reference_noise: E|ref - g*|^2 of a sampled reference (0 for an exact one). See the module docstring.
  """
  est = np.asarray(estimates, np.float64)
  n = est.shape[0]
  mean = est.mean(0)
  var = float(est.var(0, ddof=1).sum()) if n > 1 else 0.0
  out: dict[str, float | None] = {
      'n': int(n),
      'variance': var,
      'mean_norm': float(np.linalg.norm(mean)),
      'cos_single_mean': float(np.mean(_cos(est, mean[None]))) if var > 0 else 1.0,
  }
  if reference is None:
    return out
  ref = np.asarray(reference, np.float64)
  ref_norm2 = float(np.sum(ref * ref))
  err2 = float(np.sum((mean - ref) ** 2))
  noise = var / n + reference_noise
  bias = float(np.sqrt(max(err2 - noise, 0.0)))
  out.update(
      {
          'ref_norm': float(np.sqrt(ref_norm2)),
          'cos_single_ref': float(np.mean(_cos(est, ref[None]))),
          'cos_mean_ref': float(_cos(mean, ref)),
          'bias': bias,
          'rel_bias': bias / max(np.sqrt(ref_norm2), 1e-30),
          'bias_chi': err2 / noise if noise > 0 else (0.0 if err2 == 0 else None),
          'rel_variance': var / max(ref_norm2, 1e-30),
      }
  )
  if var > 0 and reference_noise == 0.0:
    # Largest per-coordinate z-score of mean - ref: robust to a covariance dominated by few directions
    # (where bias_chi has few effective degrees of freedom).
    se = np.sqrt(est.var(0, ddof=1) / n) + 1e-30
    out['max_z'] = float(np.max(np.abs(mean - ref) / se))
  return out


# ----------------------------------------------------------------------------------------------------
# The problem: a model, its parameters and one fixed batch.


@dataclasses.dataclass
class Setup:
  """model: HierarchicalByteLM; params; tokens, targets: int32[B, L]; mask: float32[B, L]."""

  model: hierarchical.HierarchicalByteLM
  params: dict
  tokens: jax.Array
  targets: jax.Array
  mask: jax.Array

  @property
  def boundary_params(self):
    return self.params['boundary']


TINY_L, TINY_D = 8, 16


def tiny_model(boundary) -> hierarchical.HierarchicalByteLM:
  """d_model 16, one block per stack, L = 8, capacity 8 (never binding: 6 free decisions)."""
  return hierarchical.HierarchicalByteLM(
      vocab_size=VOCAB_SIZE,
      d_model=TINY_D,
      num_heads=2,
      main_layers=1,
      levels=(
          hierarchical.Level(
              boundary=boundary, capacity=TINY_L, encoder_layers=1, decoder_layers=1, window=4
          ),
      ),
  )


def tiny_setups(seed: int = 0, batch: int = 8) -> dict[str, Setup]:
  """The enumerable problem: 'policy' (score function, w = 1), 'gumbel' and 'hnet', sharing one LM
  (embedding, stacks, heads) and one batch of random bytes; only the boundary predictor differs.

  The predictors' output layers are scaled up so that boundary probabilities spread over (0, 1) and
  the gradients are far from zero (at initialisation every p_t is about the target rate).
  """
  k_tok, k_tgt, k_init = jax.random.split(jax.random.PRNGKey(seed), 3)
  tokens = jax.random.randint(k_tok, (batch, TINY_L), 0, 256)
  targets = jax.random.randint(k_tgt, (batch, TINY_L), 0, 256)
  mask = jnp.ones((batch, TINY_L), jnp.float32)
  init = lambda m: nn.unbox(m.init(k_init, tokens[:1], jax.random.PRNGKey(0)))['params']
  modules = {
      'policy': bd.BoundaryPolicy(target_rate=0.3, window=1, capacity=TINY_L),
      'gumbel': gumbel_lib.GumbelPooling(target_rate=0.3, capacity=TINY_L),
      'hnet': hnet_lib.HNetRouter(target_rate=0.3, capacity=TINY_L),
  }
  base = init(tiny_model(modules['policy']))
  base['boundary']['proj']['kernel'] = base['boundary']['proj']['kernel'] * 60.0
  out = {}
  for name, module in modules.items():
    model = tiny_model(module)
    params = dict(base, boundary=init(model)['boundary'] if name != 'policy' else base['boundary'])
    if name == 'gumbel':
      params['boundary']['mlp_out']['kernel'] = params['boundary']['mlp_out']['kernel'] * 100.0
    out[name] = Setup(model, params, tokens, targets, mask)
  return out


def all_patterns(l: int) -> jax.Array:
  """float32[2^(l-2), l]: every boundary vector with forced ends; row i has free bits = binary i."""
  n = l - 2
  bits = (np.arange(2**n)[:, None] >> np.arange(n - 1, -1, -1)[None]) & 1
  ones = np.ones((2**n, 1))
  return jnp.asarray(np.concatenate([ones, bits, ones], 1), jnp.float32)


def pattern_index(actions) -> jax.Array:
  """int32[...]: the row of `all_patterns` equal to actions: float[..., L]."""
  n = actions.shape[-1] - 2
  weights = 2 ** jnp.arange(n - 1, -1, -1)
  return jnp.sum(jnp.round(actions[..., 1:-1]).astype(jnp.int32) * weights, axis=-1)


def _stop_ste_gate(next_fun, args, kwargs, context):
  """Method interceptor: the straight-through factor keeps its forward value 1 but loses its gradient."""
  out = next_fun(*args, **kwargs)
  if (
      context.method_name == '__call__'
      and isinstance(out, bd.Boundaries)
      and out.chunk_gate is not None
  ):
    # What flax's out.replace does (its stubs do not declare it).
    out = dataclasses.replace(out, chunk_gate=jax.lax.stop_gradient(out.chunk_gate))
  return out


def _enumerated(setup: Setup, boundary_params, pathwise: bool):
  """CE of every pattern for every row and the pattern log-probabilities.

  Returns (ce: float32[B, P, L] (differentiable through the model iff pathwise, never through the
  straight-through factor), log_p: float32[B, P] under a_t ~ Bernoulli(sigmoid(logit_t)) at free
  positions).
  """
  pats = all_patterns(setup.tokens.shape[1])
  b, n_pat = setup.tokens.shape[0], pats.shape[0]
  rep = lambda x: jnp.repeat(x, n_pat, axis=0)
  acts = jnp.tile(pats, (b, 1))
  with nn.intercept_methods(_stop_ste_gate):
    out = setup.model.apply(
        {'params': dict(setup.params, boundary=boundary_params)},
        rep(setup.tokens),
        None,
        mode='given',
        actions=acts,
    )
  ce = losses.cross_entropy(out.logits, rep(setup.targets)) * rep(setup.mask)
  if not pathwise:
    ce = jax.lax.stop_gradient(ce)
  lp = bd.bernoulli_log_prob(out.boundaries.logits, acts)
  log_p = jnp.sum(jnp.where(bd.forced_mask(acts.shape), 0.0, lp), -1)
  return ce.reshape(b, n_pat, -1), log_p.reshape(b, n_pat)


def exact_gradient(setup: Setup, pathwise: bool = False):
  """grad over boundary params of E_a[sum_bt CE(b, t; a)] / sum(mask), by enumeration (tiny L)."""

  def expected(pb):
    ce, log_p = _enumerated(setup, pb, pathwise)
    return jnp.sum(jnp.exp(log_p) * ce.sum(-1)) / jnp.sum(setup.mask)

  return jax.jit(jax.grad(expected))(setup.boundary_params)


# ----------------------------------------------------------------------------------------------------
# Score-function estimates.


@dataclasses.dataclass(frozen=True)
class Variant:
  """One score-function estimator. baseline: 'none' | 'batch' | 'rloo' | 'value'."""

  name: str
  reward: str = 'early_exit'
  baseline: str = 'batch'
  gamma: float = 0.99
  gae_lambda: float = 1.0
  rloo_k: int = 1
  group: str = ''
  critic: str = (
      'ideal'  # 'value' baseline: 'ideal' (V_t = E[G_t]) | 'learned' (the model's critic head).
  )

  def config(self):
    return ml_collections.ConfigDict(
        dict(
            reward=self.reward,
            baseline=self.baseline,
            gamma=self.gamma,
            rloo=dict(k=max(self.rloo_k, 2)),
            value=dict(gae_lambda=self.gae_lambda, weight=0.0),
        )
    )


def default_variants(rloo_k: int = 4) -> list[Variant]:
  """The paper's ladder, the gamma sweeps (for the plot) and the two estimators past the paper."""
  v = [
      Variant('REINFORCE (reward -CE, gamma 1, no baseline)', 'plain', 'none', 1.0, group='ladder'),
      Variant('+ early-exit reward', 'early_exit', 'none', 1.0, group='ladder'),
      Variant('+ batch-relative advantage', 'early_exit', 'batch', 1.0, group='ladder'),
      Variant('full method (gamma 0.99)', 'early_exit', 'batch', 0.99, group='ladder'),
  ]
  v += [
      Variant(f'plain, no baseline, gamma {g}', 'plain', 'none', g, group='sweep_plain')
      for g in GAMMAS
  ]
  v += [
      Variant(f'full method, gamma {g}', 'early_exit', 'batch', g, group='sweep_full')
      for g in GAMMAS
  ]
  v += [
      Variant(
          f'RLOO K={rloo_k} (gamma 0.99)', 'early_exit', 'rloo', 0.99, rloo_k=rloo_k, group='past'
      ),
      Variant(f'RLOO K={rloo_k} (gamma 1)', 'early_exit', 'rloo', 1.0, rloo_k=rloo_k, group='past'),
      Variant('value + GAE(0.99, 0.95)', 'early_exit', 'value', 0.99, 0.95, group='past'),
      Variant('value + GAE(1, 1)', 'early_exit', 'value', 1.0, 1.0, group='past'),
  ]
  return v


def learned_critic_variants() -> list[Variant]:
  """The value baselines again with the model's own critic head (models trained with baseline 'value')."""
  return [
      Variant(
          'value + GAE(0.99, 0.95), learned critic',
          'early_exit',
          'value',
          0.99,
          0.95,
          group='past',
          critic='learned',
      ),
      Variant(
          'value + GAE(1, 1), learned critic',
          'early_exit',
          'value',
          1.0,
          1.0,
          group='past',
          critic='learned',
      ),
  ]


def encode(setup: Setup):
  """-> (h: [B, L, D], ce_early: float32[B, L])."""
  h, early = setup.model.apply({'params': setup.params}, setup.tokens, method='encode')
  return h, losses.cross_entropy(early, setup.targets) * setup.mask


def draw_actions(setup: Setup, h, key, n: int):
  """n independent boundary draws of the batch from the policy: float32[n, B, L]."""
  policy = setup.model.levels[0].boundary
  # flax types apply's result as (output, variables) too, which it is only with `mutable`.
  one = lambda k: cast(
      bd.Boundaries, policy.apply({'params': setup.boundary_params}, h, k, mode='sample')
  ).actions
  return jax.jit(jax.vmap(one))(jax.random.split(key, n))


def ce_table_fn(setup: Setup):
  """For the tiny model: actions float[..., B, L] -> CE_full float32[..., B, L] by table lookup."""
  table, _ = _enumerated(setup, setup.boundary_params, pathwise=False)  # [B, P, L]
  rows = jnp.arange(table.shape[0])
  return jax.jit(lambda a: table[rows, pattern_index(a)])


def ce_forward_fn(setup: Setup, chunk: int = 8):
  """For any model: actions float[N, B, L] -> CE_full float32[N, B, L] by forward passes."""

  def one(a):
    out = setup.model.apply({'params': setup.params}, setup.tokens, None, mode='given', actions=a)
    return losses.cross_entropy(out.logits, setup.targets) * setup.mask

  fwd = jax.jit(jax.vmap(one))

  def run(actions):
    n = actions.shape[0]
    parts = [fwd(actions[i : i + chunk]) for i in range(0, n, chunk)]
    return jnp.concatenate(parts, 0)

  return run


def _policy_grads(setup: Setup, h, mask, actions, coefs):
  """Per-estimate gradients of policy_loss over the boundary params: actions, coefs: [N, R, L] with
  R rows (h: [R, L, D], mask: [R, L]) -> float64[N, P]."""
  policy = setup.model.levels[0].boundary

  def one(a, g):
    def surrogate(pb):
      b = cast(bd.Boundaries, policy.apply({'params': pb}, h, None, mode='given', actions=a))
      return estimator.policy_loss(b.log_probs, g, b.free & (mask > 0))

    return jax.grad(surrogate)(setup.boundary_params)

  grads = jax.jit(jax.vmap(one))(actions, coefs)
  return flatten_batched(grads, actions.shape[0])


def learned_values(setup: Setup, h):
  """The model's critic head on encoder states h: [B, L, D] -> float32[B, L]."""
  if not setup.model.value_head:
    raise UserError(
        'the learned-critic variants need a model trained with estimator.baseline="value".'
    )
  return setup.model.apply({'params': setup.params}, h, method=lambda m, x: m.critic(x))


def variant_estimates(setup: Setup, variant: Variant, h, ce_early, actions, ce_full, mean_ce_full):
  """float64[N / K, P] estimates of one variant from shared draws actions, ce_full: [N, B, L].

  mean_ce_full: float32[B, L], E[CE_full] per position (exact or sampled): the ideal critic of the
  'value' variants is V_t = E[G_t] = discounted sum of E[r] (a critic of the action-free encoder state
  can do no better on a fixed batch); critic='learned' uses the model's own critic head instead.
  """
  cfg = variant.config()
  mask = setup.mask
  r = jax.vmap(lambda c: estimator.rewards(c, ce_early, variant.reward) * mask)(ce_full)
  if variant.baseline == 'rloo':
    k = variant.rloo_k
    m = actions.shape[0] // k
    b, l = mask.shape
    group = lambda x: x[: m * k].reshape(m, k * b, l)  # Draws k*m .. : rows k'*B + b of estimate m.
    mask_k = jnp.tile(mask, (k, 1))
    coefs = jax.vmap(lambda rr: estimator.advantages_and_returns(rr, mask_k, cfg)[1])(group(r))
    return _policy_grads(setup, jnp.tile(h, (k, 1, 1)), mask_k, group(actions), coefs)
  values = None
  if variant.baseline == 'value' and variant.critic == 'learned':
    values = learned_values(setup, h)
  elif variant.baseline == 'value':
    mean_r = estimator.rewards(mean_ce_full, ce_early, variant.reward) * mask
    values = estimator.discounted_returns(mean_r, variant.gamma)
  coefs = jax.vmap(lambda rr: estimator.advantages_and_returns(rr, mask, cfg, values)[1])(r)
  return _policy_grads(setup, h, mask, actions, coefs)


REF_K = 4  # Draws per estimate of the sampled reference.


def sampled_reference(setup: Setup, h, ce_early, key, n: int, ce_fn):
  """An unbiased estimate of g* from n fresh draws: the mean of n / REF_K leave-one-out (K = REF_K)
  estimates at gamma = 1, the lowest-variance unbiased estimator the lab has (its baseline is built
  from the other, independent draws of the same row, and gamma = 1 keeps every future term).

  Returns (g*: float64[P], noise: tr(Cov) of the mean, E[CE_full]: float32[B, L] from the same draws).
  """
  if n < 2 * REF_K:
    raise UserError(
        f'--ref_samples={n} is too few for the sampled reference: use at least {2 * REF_K}.'
    )
  actions = draw_actions(setup, h, key, n)
  ce = ce_fn(actions)
  mean_ce_full = jnp.mean(ce, 0)
  variant = Variant('reference', 'early_exit', 'rloo', 1.0, rloo_k=REF_K)
  est = variant_estimates(setup, variant, h, ce_early, actions, ce, mean_ce_full)
  return est.mean(0), float(est.var(0, ddof=1).sum()) / est.shape[0], mean_ce_full


# ----------------------------------------------------------------------------------------------------
# Straight-through estimates.


def ste_estimates(setup: Setup, key, n: int) -> np.ndarray:
  """float64[n, P]: gradients of mean CE_full over the predictor's params, one per boundary draw."""

  def one(k):
    def lm(pb):
      out = setup.model.apply(
          {'params': dict(setup.params, boundary=pb)}, setup.tokens, k, mode='sample'
      )
      return losses.masked_mean(
          losses.cross_entropy(out.logits, setup.targets) * setup.mask, setup.mask
      )

    return jax.grad(lm)(setup.boundary_params)

  grads = jax.jit(jax.vmap(one))(jax.random.split(key, n))
  return flatten_batched(grads, n)


# ----------------------------------------------------------------------------------------------------
# The lab.


def run_lab(
    setup: Setup,
    key,
    n_samples: int,
    variants=None,
    ste_setups=None,
    exact: bool = True,
    ref_samples: int = 0,
    ste_samples: int = 0,
    log=print,
) -> dict:
  """Measures every variant on `setup` (whose boundary method must be the score-function policy).

  exact: enumerate the reference (tiny L only); otherwise sample it from ref_samples extra draws.
  ste_setups: optional {'gumbel': Setup, 'hnet': Setup} (exact references, tiny L only), measured
  with ste_samples draws (0 = n_samples): each is a full forward and backward pass of the model.
  Returns {'reference': {...}, 'rows': [dict per variant]}.
  """
  if not isinstance(setup.model.levels[0].boundary, bd.BoundaryPolicy):
    raise UserError(
        "the estimator lab measures the score-function policy: the model's "
        'boundary.method must be "policy".'
    )
  variants = default_variants() if variants is None else variants
  k_draw, k_ref, k_ste = jax.random.split(key, 3)
  h, ce_early = encode(setup)
  actions = draw_actions(setup, h, k_draw, n_samples)
  t0 = time.time()
  if exact:
    ce_fn = ce_table_fn(setup)
    ce_all, log_p = _enumerated(setup, setup.boundary_params, pathwise=False)
    mean_ce_full = jnp.sum(jnp.exp(log_p)[..., None] * ce_all, 1)
    ref = flatten(exact_gradient(setup))
    ref_info: dict[str, Any] = {'kind': 'exact enumeration', 'noise': 0.0}
  else:
    ce_fn = ce_forward_fn(setup)
    ref, noise, mean_ce_full = sampled_reference(setup, h, ce_early, k_ref, ref_samples, ce_fn)
    ref_info = {
        'kind': f'mean of {ref_samples // REF_K} RLOO K={REF_K} gamma-1 estimates '
        f'({ref_samples} draws)',
        'noise': noise,
    }
  ce_full = ce_fn(actions)
  log(
      f'reference ({ref_info["kind"]}): |g*| = {np.linalg.norm(ref):.4g}; CE of {n_samples} draws '
      f'in {time.time() - t0:.1f}s'
  )
  rows = []
  for v in variants:
    t0 = time.time()
    est = variant_estimates(setup, v, h, ce_early, actions, ce_full, mean_ce_full)
    stats = summarize(est, ref, ref_info['noise'])
    rows.append(
        dict(
            name=v.name,
            group=v.group,
            gamma=v.gamma,
            draws=max(v.rloo_k, 1),
            **stats,
            var_x_draws=stats['variance'] * max(v.rloo_k, 1),
        )
    )
    log(
        f'{v.name:48s} var {stats["variance"]:.4g} rel.bias {stats["rel_bias"]:.3f} '
        f'chi {stats["bias_chi"]:.3g} ({time.time() - t0:.1f}s)'
    )
  for name, ste in (ste_setups or {}).items():
    t0 = time.time()
    ste_ref = flatten(exact_gradient(ste, pathwise=(name == 'hnet')))
    n = 2 if name == 'hnet' else (ste_samples or n_samples)  # H-Net's rule is deterministic.
    est = ste_estimates(ste, jax.random.fold_in(k_ste, len(name)), n)
    stats = summarize(est, ste_ref)
    label = {
        'hnet': 'H-Net straight-through (router params)',
        'gumbel': 'Gumbel straight-through (MLP params)',
    }.get(name, name)
    rows.append(
        dict(name=label, group='ste', gamma=None, draws=1, **stats, var_x_draws=stats['variance'])
    )
    log(
        f'{label:48s} var {stats["variance"]:.4g} rel.bias {stats["rel_bias"]:.3f} '
        f'cos(mean, ref) {stats["cos_mean_ref"]:.3f} ({time.time() - t0:.1f}s)'
    )
  return {'reference': dict(ref_info, norm=float(np.linalg.norm(ref))), 'rows': rows}


# ----------------------------------------------------------------------------------------------------
# Reports.


def result_lines(result: dict, command: str) -> list[str]:
  """The lines of the results page: the command, the reference and one table row per variant."""
  ref = result['reference']

  def _fmt(x):  # bias_chi is None where the estimator has no noise but a bias: unbounded.
    return common.fmt(x, 3, 'g', none='inf')

  return [
      f'Command: `{command}`',
      '',
      f'Reference gradient: {ref["kind"]}, |g*| = {ref["norm"]:.4g}.',
      '',
      *common.table(
          'variant | draws/est. | estimates | tr(Cov) | tr(Cov)/abs(g*)^2 | var x draws | '
          'cos(single, mean) | cos(single, g*) | cos(mean, g*) | rel. bias | bias chi | max z',
          (
              f'{r["name"]} | {r["draws"]} | {r["n"]} | {_fmt(r["variance"])} | '
              f'{_fmt(r["rel_variance"])} | {_fmt(r["var_x_draws"])} | {_fmt(r["cos_single_mean"])} | '
              f'{_fmt(r["cos_single_ref"])} | {_fmt(r["cos_mean_ref"])} | {_fmt(r["rel_bias"])} | '
              f'{_fmt(r["bias_chi"])} | {_fmt(r.get("max_z", "-"))}'
              for r in result['rows']
          ),
      ),
  ]


def plot_variance(result: dict, path: str) -> None:
  """PNG of variance (relative to |g*|^2) against gamma for the two gamma sweeps."""
  fig, ax = common.pyplot().subplots(figsize=(5, 3.5))
  for group, label in (
      ('sweep_plain', 'reward -CE, no baseline'),
      ('sweep_full', 'early-exit reward + batch-relative'),
  ):
    rows = sorted((r for r in result['rows'] if r['group'] == group), key=lambda r: r['gamma'])
    if rows:
      ax.plot([r['gamma'] for r in rows], [r['rel_variance'] for r in rows], 'o-', label=label)
  ax.set_yscale('log')
  ax.set_xlabel('gamma')
  ax.set_ylabel('tr(Cov) / |g*|^2 (one draw)')
  ax.legend(fontsize=8)
  common.save_figure(fig, path, dpi=120)


def write_outputs(result: dict, out_dir: str, command: str, name: str = 'results') -> None:
  """NAME.md / NAME.json (the table) and NAME_variance_vs_gamma.png in out_dir."""
  common.write_results(out_dir, dict(result, command=command), result_lines(result, command), name)
  plot_variance(result, os.path.join(out_dir, f'{name}_variance_vs_gamma.png'))


# ----------------------------------------------------------------------------------------------------
# Command line.

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'Run folder of a trained model to measure.')
  _CONFIG = config_flags.DEFINE_config_file('config', None, 'Config of a fresh (untrained) model.')
  _SAMPLES = flags.DEFINE_integer('samples', 4000, 'Boundary draws of the batch per variant.')
  _REF_SAMPLES = flags.DEFINE_integer(
      'ref_samples', 0, 'Draws of the sampled reference (0 = 4 x samples).'
  )
  _RLOO_K = flags.DEFINE_integer('rloo_k', 4, 'Draws per sequence of the RLOO variants.')
  _BATCH = flags.DEFINE_integer('batch', 8, "Rows of the tiny model's batch.")
  _SEED = flags.DEFINE_integer('seed', 0, 'Seed of the tiny problem and of the draws.')
  _OUT = flags.DEFINE_string('out', 'results/estimators', 'Output folder.')
  _NAME = flags.DEFINE_string(
      'name', '', 'File stem of the outputs (default: tiny | config | checkpoint).'
  )


def _model_setup(config, params, seed: int) -> Setup:
  from tokjax import models  # pylint: disable=g-import-not-at-top
  from tokjax.data import pipeline  # pylint: disable=g-import-not-at-top

  model = models.build_model(config, levels=stages.resolve(config))
  if params is None:
    init_args = models.init_args(config, 1, config.data.seq_len)
    params = nn.unbox(model.init(jax.random.PRNGKey(config.seed), *init_args))['params']
  batch = pipeline.build_data(config).val_batches[0]
  return Setup(
      model,
      params,
      jnp.asarray(batch['inputs']),
      jnp.asarray(batch['targets']),
      jnp.asarray(batch['mask'], jnp.float32),
  )


def main(argv):
  del argv
  if _SAMPLES.value < 2 * _RLOO_K.value:
    raise UserError(f'--samples={_SAMPLES.value} is too few: use at least 2 x --rloo_k.')
  if _RLOO_K.value < 2:
    raise UserError(f'--rloo_k={_RLOO_K.value} must be at least 2.')
  key = jax.random.PRNGKey(_SEED.value)
  variants = default_variants(_RLOO_K.value)
  if _CHECKPOINT.value and _CONFIG.value is not None:
    raise UserError('pass either --checkpoint or --config, not both.')
  if _CHECKPOINT.value or _CONFIG.value is not None:
    if _CHECKPOINT.value:
      from tokjax import inspection  # pylint: disable=g-import-not-at-top

      ckpt = inspection.load_checkpoint(_CHECKPOINT.value)
      config, params, name = ckpt.config, ckpt.params, 'checkpoint'
    else:
      config, params, name = _CONFIG.value, None, 'config'
    from tokjax import models  # pylint: disable=g-import-not-at-top

    if not models.num_stages(config) or stages.get(config, 0).method != 'policy':
      raise UserError('the estimator lab needs a hierarchical model with boundary.method="policy".')
    setup = _model_setup(config, params, _SEED.value)
    if setup.model.value_head:
      variants += learned_critic_variants()
    ref_samples = _REF_SAMPLES.value or 4 * _SAMPLES.value
    result = run_lab(setup, key, _SAMPLES.value, variants, exact=False, ref_samples=ref_samples)
  else:
    setups = tiny_setups(_SEED.value, _BATCH.value)
    name = 'tiny'
    result = run_lab(
        setups['policy'],
        key,
        _SAMPLES.value,
        variants,
        ste_setups={k: setups[k] for k in ('gumbel', 'hnet')},
    )
  command = 'python -m tokjax.lab.estimators ' + ' '.join(sys.argv[1:])
  write_outputs(result, _OUT.value, command.strip(), _NAME.value or name)
  print(f'wrote {_OUT.value}/{_NAME.value or name}.md, .json and _variance_vs_gamma.png')


if __name__ == '__main__':
  cli.run(main)
