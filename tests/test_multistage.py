"""The multi-stage hierarchy (config.model.stages > 1): one stage is today's model, the two-stage model
is causal in bytes at both levels, each stage's score function is unbiased (exact enumeration), the
sharded two-stage step equals one device, a two-stage run resumes exactly, and bad stage settings are
one clear error.

The sharded step runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set
before jax is imported): this file is also that script (`python tests/test_multistage.py sharded`),
printing one JSON line of measurements, and reuses tests/test_sharding.py's batches and tolerances.
"""

import json
import os
import shutil
import subprocess
import sys

from conftest import XLA_FAST_COMPILE, jit_call
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDED_MESH = (2, 2, 2)  # (data, fsdp, tensor): all 8 devices, the batch split 4 ways.


# ------------------------------------------------------------------------------ model helpers


def _two_stage(
    w0=1,
    w1=1,
    c0=16,
    c1=6,
    r0=0.3,
    r1=0.4,
    d=32,
    byte_window=8,
    inner_window=0,
    attention='blocked',
):
  """A policy/policy two-stage HierarchicalByteLM (one layer per stack, scale 1 for w > 1)."""
  from tokjax.models import boundaries as bd  # pylint: disable=g-import-not-at-top
  from tokjax.models import hierarchical  # pylint: disable=g-import-not-at-top

  level = lambda rate, window, capacity, byte_window: hierarchical.Level(
      boundary=bd.BoundaryPolicy(target_rate=rate, window=window, scale=1.0, capacity=capacity),
      capacity=capacity,
      encoder_layers=1,
      decoder_layers=1,
      window=byte_window,
  )
  return hierarchical.HierarchicalByteLM(
      vocab_size=258,
      d_model=d,
      num_heads=2,
      main_layers=1,
      levels=(level(r0, w0, c0, byte_window), level(r1, w1, c1, inner_window)),
      attention=attention,
  )


def _init(model, *args):
  """model's params for args. Drawn with the 'unsafe_rbg' generator: XLA compiles threefry once per
  parameter, which made initialisation most of these tests' CPU time; the values play no role."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  return nn.unbox(jax.jit(model.init)(jax.random.key(0, impl='unsafe_rbg'), *args))['params']


def _small_config(stages=1, window=1):
  """base_config at test size (d_model 32, L 32, capacity 12); stage 1 (if any) policy at rate 0.4."""
  from tokjax.config import defaults as config_defaults

  c = config_defaults.base_config()
  c.model.update(
      d_model=32,
      num_heads=2,
      encoder_layers=1,
      main_layers=1,
      decoder_layers=1,
      byte_window=8,
      capacity=12,
  )
  c.data.update(seq_len=32, batch_size=4)
  c.boundary.policy.window = window
  c.model.stages = stages
  for k in range(1, stages):
    name = f's{k}'
    if name not in c.stages:
      c.stages[name] = config_defaults.stage_section()
    c.stages[name].boundary.update(method='policy', target_rate=0.4)
    c.stages[name].model.update(capacity=6, encoder_layers=1, decoder_layers=1, byte_window=0)
  return c


def _batch(b=4, l=32, seed=0):
  rng = np.random.default_rng(seed)
  toks = rng.integers(97, 123, (b, l + 1)).astype(np.int32)
  toks[rng.random((b, l + 1)) < 0.2] = 32
  mask = np.ones((b, l), np.float32)
  mask[-1, l - 7 :] = 0.0
  return dict(inputs=toks[:, :-1], targets=toks[:, 1:], mask=mask)


# ------------------------------------------------------------------------------ 1. one stage


def test_one_stage_is_todays_model_composed_from_its_parts():
  """model.stages = 1: no inner_* parameters, and the objective equals the one-stage model composed
  by hand (embed -> encoder -> boundary -> downsample -> main -> upsample -> decoder -> head, the
  paper's loss with the estimator's terms) for the same parameters and key."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from tokjax import estimator, losses, models, stages  # pylint: disable=g-import-not-at-top
  from tokjax.models import chunking  # pylint: disable=g-import-not-at-top

  c = _small_config(stages=1, window=4)  # The sequential policy: its scan is part of the key path.
  c.model.capacity = 6  # Overflow: the capacity rule is part of today's model.
  model = models.build_model(c, levels=stages.resolve(c))
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  key = jax.random.PRNGKey(3)
  params = _init(model, *models.init_args(c, 4, 32))
  assert not [k for k in params if k.startswith('inner')], list(params)
  # Spread the policy so that boundaries (and overflow) vary between rows.
  params['boundary']['proj']['kernel'] = params['boundary']['proj']['kernel'] * 40.0

  loss, (metrics, _) = jax.jit(losses.objective(c, model, levels=stages.resolve(c)))(
      params, batch, key, 0
  )

  @jax.jit
  def reference(params):
    """The one-stage model and the paper's loss, composed from the submodules and primitives."""
    tokens, targets, mask = batch['inputs'], batch['targets'], batch['mask']
    m = model.bind({'params': params})
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    h = m.encoder(m.embed(tokens), positions)
    early = m.early_head(h)
    bnd = m.boundary(h, key, mode='sample', actions=None, tokens=tokens, early_logits=early)
    chunks, ends, valid = chunking.downsample(h, bnd.actions, c.model.capacity)
    y = chunking.upsample(h, m.main(chunks, ends, valid), bnd.actions, bnd.chunk_gate)
    logits = m.head(m.decoder(y, positions))
    ce_full = losses.cross_entropy(logits, targets) * mask
    ce_early = losses.cross_entropy(early, targets) * mask
    est = c.estimator
    rl, _ = estimator.score_function_terms(ce_full, ce_early, bnd, mask, est)
    mean = lambda x: jnp.sum(x) / jnp.sum(mask)
    want = (1 - est.lambda_early) * mean(ce_full) + est.lambda_early * mean(ce_early) + rl
    return logits, bnd, want + bnd.aux_loss

  logits, bnd, want = reference(params)
  assert float(bnd.dropped.sum()) > 0  # The overflow path ran.
  out = jax.jit(model.apply)({'params': params}, batch['inputs'], key)
  np.testing.assert_array_equal(out.boundaries.actions, bnd.actions)
  np.testing.assert_allclose(out.logits, logits, atol=1e-5)
  assert len(out.stages) == 1
  np.testing.assert_allclose(loss, want, rtol=1e-6, atol=1e-6)
  assert not [k for k in metrics if k.startswith('stage')]


def test_second_stage_leaves_stage_zero_unchanged():
  """A two-stage model holds the one-stage parameters plus inner_* ones; with the same stage-0
  parameters and key it draws the same stage-0 boundaries and early exit as the one-stage model."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax import models, stages  # pylint: disable=g-import-not-at-top

  one, two = (models.build_model(c, levels=stages.resolve(c)) for c in map(_small_config, (1, 2)))
  args = models.init_args(_small_config(1), 4, 32)
  p1, p2 = _init(one, *args), _init(two, *args)
  inner = {k for k in p2 if k.startswith('inner')}
  assert inner and set(p2) - inner == set(p1)
  shared = {k: v for k, v in p2.items() if k not in inner}
  assert jax.tree.structure(shared) == jax.tree.structure(p1)
  tokens = _batch()['inputs']
  key = jax.random.PRNGKey(7)
  a = jax.jit(one.apply)({'params': shared}, tokens, key)
  b = jax.jit(two.apply)({'params': p2}, tokens, key)
  for field in ('actions', 'log_probs', 'free', 'dropped'):
    np.testing.assert_array_equal(
        getattr(a.boundaries, field), getattr(b.boundaries, field), err_msg=field
    )
  np.testing.assert_array_equal(a.early_logits, b.early_logits)
  assert float(b.stages[1].boundaries.actions.sum()) > 0
  assert np.abs(np.asarray(a.logits - b.logits)).max() > 1e-4  # Stage 1 is really there.


def test_two_stage_output_has_the_documented_stage_shapes():
  """A two-stage model's `ModelOutput`: the shapes of every field of interface.StageOutput, stage 1
  reading stage 0's chunks, `sample_k`'s rows, and the objective's metrics named by stage_metric."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax import losses, models, stages  # pylint: disable=g-import-not-at-top
  from tokjax.models import interface  # pylint: disable=g-import-not-at-top

  c = _small_config(stages=2)
  model = models.build_model(c, levels=stages.resolve(c))
  b, l, v, c0, c1 = 4, 32, 258, c.model.capacity, c.stages.s1.model.capacity
  assert (model.num_stages, model.takes_key, model.boundary_modes) == (
      2,
      True,
      ('sample', 'greedy'),
  )
  params = _init(model, *model.init_args(b, l))
  batch = _batch(b, l)
  out = jit_call(model.apply, {'params': params}, batch['inputs'], jax.random.PRNGKey(1))
  assert out.logits.shape == (b, l, v) and out.values is None and len(out.stages) == 2
  s0, s1 = out.stages
  assert s0.boundaries is out.boundaries and s0.early_logits is out.early_logits
  for stage, n, cap in ((s0, l, c0), (s1, c0, c1)):
    assert stage.boundaries.actions.shape == stage.valid.shape == (b, n)
    assert stage.positions.shape == stage.tokens.shape == (b, n)
    assert stage.early_logits.shape == (b, l, v) and stage.chunk_valid.shape == (b, cap)
    assert stage.valid.dtype == stage.chunk_valid.dtype == bool
  assert np.all(s0.valid)
  np.testing.assert_array_equal(s0.positions, np.broadcast_to(np.arange(l), (b, l)))
  np.testing.assert_array_equal(s0.tokens, batch['inputs'])
  np.testing.assert_array_equal(s1.valid, s0.chunk_valid)  # Stage 1 reads stage 0's chunks...
  ends = np.asarray(s0.boundaries.actions) > 0.5
  for row in range(b):  # ... each at the byte its chunk ends on (L on empty slots).
    n = int(s0.chunk_valid[row].sum())
    np.testing.assert_array_equal(s1.positions[row, :n], np.flatnonzero(ends[row])[:n])
    assert np.all(np.asarray(s1.positions[row, n:]) == l)
  k = 3
  drawn = jit_call(
      model.apply, {'params': params}, batch['inputs'], jax.random.PRNGKey(1), k, method='sample_k'
  )
  assert drawn.logits.shape == (k * b, l, v) and drawn.early_logits.shape == (b, l, v)
  assert drawn.stages[1].early_logits.shape == (k * b, l, v)
  assert drawn.stages[1].valid.shape == (k * b, c0)
  names = interface.stage_metrics(model, 'rate')
  assert names == ['rate', 'stage1_rate']
  _, (metrics, _) = losses.objective(c, model, levels=stages.resolve(c))(
      params, batch, jax.random.PRNGKey(1), 0
  )
  assert set(names) <= set(metrics)
  np.testing.assert_allclose(
      metrics['stage1_rate'],
      float(np.sum(np.asarray(s1.boundaries.actions) * s1.valid) / np.sum(s1.valid)),
      rtol=1e-5,
  )


# ------------------------------------------------------------------------------ 2. causality


def _perturb_after(tokens, t):
  return tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 101) % 256)


@pytest.mark.parametrize('w0,w1,inner_window', [(1, 1, 0), (4, 3, 24)])
def test_two_stage_model_is_causal_at_both_levels_with_overflow(w0, w1, inner_window):
  """With a fixed key, bytes after t change no logit (full or any early exit), no stage-0 decision at
  or before t and no stage-1 decision whose input chunk ends at or before t; small capacities make
  both levels overflow (dropped decisions depend on earlier ones)."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax.models import hierarchical  # pylint: disable=g-import-not-at-top

  model = _two_stage(w0, w1, c0=20, c1=6, r0=0.5, r1=0.5, inner_window=inner_window)
  key = jax.random.PRNGKey(3)
  tokens = jax.random.randint(jax.random.PRNGKey(4), (3, 64), 0, 256)
  params = {'params': _init(model, tokens, key)}
  apply = jax.jit(model.apply)
  base = apply(params, tokens, key)
  fields = ('actions', 'probs', 'log_probs', 'free', 'dropped')
  assert float(base.boundaries.dropped.sum()) > 0  # Stage 0 overflowed...
  assert float(base.stages[1].boundaries.dropped.sum()) > 0  # ...and stage 1 too.
  for t in (0, 6, 13, 30, 62):
    out = apply(params, _perturb_after(tokens, t), key)
    logits = [('logits', base.logits, out.logits)]
    logits.append(('early_logits', base.early_logits, out.early_logits))
    logits.append(('stage1 early', base.stages[1].early_logits, out.stages[1].early_logits))
    for name, x, y in logits:
      np.testing.assert_array_equal(x[:, : t + 1], y[:, : t + 1], err_msg=f'{name} t={t}')
    for field in fields:
      np.testing.assert_array_equal(
          getattr(base.boundaries, field)[:, : t + 1],
          getattr(out.boundaries, field)[:, : t + 1],
          err_msg=f'stage 0 {field} t={t}',
      )
    s0, s1 = base.stages[1], out.stages[1]
    done = np.asarray(s0.positions <= t)  # Stage-1 inputs complete at t.
    for name in ('positions', 'valid', 'tokens'):
      np.testing.assert_array_equal(
          np.asarray(getattr(s0, name))[done],
          np.asarray(getattr(s1, name))[done],
          err_msg=f'{name} t={t}',
      )
    for field in fields:
      np.testing.assert_array_equal(
          np.asarray(getattr(s0.boundaries, field))[done],
          np.asarray(getattr(s1.boundaries, field))[done],
          err_msg=f'stage 1 {field} t={t}',
      )
    for s, (x, y) in enumerate(
        zip(hierarchical.boundaries_in_bytes(base), hierarchical.boundaries_in_bytes(out))
    ):
      np.testing.assert_array_equal(x[:, : t + 1], y[:, : t + 1], err_msg=f'ends {s} t={t}')
    assert np.abs(np.asarray(base.logits[:, t + 1 :] - out.logits[:, t + 1 :])).max() > 1e-3
  # The comparisons covered stage-1 decisions that the policy made (not only forced ones).
  assert np.any(np.asarray(base.stages[1].boundaries.free))


def test_inner_windows_are_bytes_on_every_attention_path():
  """A stage's window is a width in bytes: with an inner window of 12 bytes (a few stage-0
  chunks, far fewer than the 16 chunk slots) the 'dot_product' path gives the blocked path's logits,
  early exits and boundaries for the same parameters, and both differ from full inner attention (so
  the window binds)."""
  import jax  # pylint: disable=g-import-not-at-top

  tokens = jax.random.randint(jax.random.PRNGKey(4), (3, 64), 0, 256)
  key = jax.random.PRNGKey(3)
  run = lambda window, attention: jax.jit(
      _two_stage(c0=20, c1=8, r0=0.3, inner_window=window, attention=attention).apply
  )
  params = {'params': _init(_two_stage(c0=20, c1=8, r0=0.3, inner_window=12), tokens, key)}
  blocked = run(12, 'blocked')(params, tokens, key)
  dpa = run(12, 'dot_product')(params, tokens, key)
  full = run(0, 'blocked')(params, tokens, key)
  np.testing.assert_array_equal(
      dpa.stages[1].boundaries.actions, blocked.stages[1].boundaries.actions
  )
  np.testing.assert_allclose(dpa.logits, blocked.logits, atol=1e-4)
  np.testing.assert_allclose(dpa.stages[1].early_logits, blocked.stages[1].early_logits, atol=1e-4)
  assert np.abs(np.asarray(full.logits - blocked.logits)).max() > 1e-2


@pytest.mark.parametrize(
    'name,arg', [('two_stage', None), ('two_stage', 'learned,tiny'), ('paper_two_stage_40m', None)]
)
def test_two_stage_configs_window_every_inner_stage(name, arg):
  """The two-stage configs make stage 1 a bottleneck: its layers attend over fewer bytes than a
  sequence holds (the byte layers' window), so only the main layers read the whole sequence."""
  from tokjax import stages  # pylint: disable=g-import-not-at-top
  from tokjax.config import files as config_files
  from tokjax.config import validation as config_validation

  c = config_files.load(name, arg)
  config_validation.validate(c)
  assert stages.get(c, 1).window == c.model.byte_window
  assert 0 < c.model.byte_window < c.data.seq_len


# ------------------------------------------------------------------------------ 3. unbiasedness


def _joint_actions(l, c0, c1):
  """Every executable joint (stage-0, stage-1) action pair of one sequence of l bytes.

  Returns (a0: float32[R, l], a1: float32[R, c0]): stage 0 with forced ends and at most c0 - 2 free
  boundaries; stage 1 over the n chunks of that row (forced at 0 and n - 1, zero on padding) with at
  most c1 - 2 free boundaries. Each executable pair appears once.
  """
  import itertools  # pylint: disable=g-import-not-at-top

  rows0, rows1 = [], []
  for bits0 in itertools.product((0, 1), repeat=l - 2):
    if sum(bits0) > c0 - 2:
      continue
    a0 = (1, *bits0, 1)
    n = sum(a0)
    for bits1 in itertools.product((0, 1), repeat=max(n - 2, 0)):
      if sum(bits1) > c1 - 2:
        continue
      a1 = ((1, *bits1, 1) if n > 1 else (1,)) + (0,) * (c0 - n)
      rows0.append(a0)
      rows1.append(a1)
  return np.asarray(rows0, np.float32), np.asarray(rows1, np.float32)


def _enumeration_setup():
  """The two-stage case both exact-enumeration tests share: L = 7 bytes, capacities 4 and 3, one row
  per joint action pair (a0, a1) of `_joint_actions`, the same tokens and targets in every row, and
  both policies' kernels scaled by 10 so that every gradient is far from zero.

  Returns (L, model, params, a0, a1, tokens, targets, mask), the last three [R, L].
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  l, c0, c1 = 7, 4, 3
  model = _two_stage(3, 2, c0=c0, c1=c1, r0=0.4, r1=0.4, d=16, byte_window=4)
  tokens1 = jax.random.randint(jax.random.PRNGKey(11), (1, l), 0, 256)
  targets1 = jax.random.randint(jax.random.PRNGKey(12), (1, l), 0, 256)
  params = _init(model, tokens1, jax.random.PRNGKey(0))
  for name in ('boundary', 'inner_boundaries_0'):
    params[name]['proj']['kernel'] = params[name]['proj']['kernel'] * 10.0
  a0, a1 = _joint_actions(l, c0, c1)
  r = a0.shape[0]
  tokens, targets = jnp.tile(tokens1, (r, 1)), jnp.tile(targets1, (r, 1))
  return l, model, params, a0, a1, tokens, targets, jnp.ones((r, l), jnp.float32)


def test_each_stage_score_function_is_unbiased_by_exact_enumeration():
  """Two stages, L = 7 bytes, capacities 4 (stage 0) and 3 (stage 1), so both levels' capacity rules
  bind: over every joint action pair, sum_a pi(a) * (stage s's estimate) equals grad_s E[sum_t
  CE_full(t)] / L for each stage's own policy parameters, with rewards against that stage's early
  exit, gamma = 1 and no batch baseline.

  This holds because stage s's early exit does not depend on stage s's own decisions (its head reads
  the states of stage s's input): the same estimator with a baseline that does (CE_full itself, so
  r = 0 on stage 1) fails the comparison, which shows the test can detect a biased baseline.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  from tokjax import estimator, losses  # pylint: disable=g-import-not-at-top
  from tokjax.models import boundaries as bd  # pylint: disable=g-import-not-at-top

  l, model, params, a0, a1, tokens, targets, mask = _enumeration_setup()

  def forward(p):
    out = model.apply({'params': p}, tokens, jax.random.PRNGKey(0), 'given', (a0, a1))
    return out, out.boundaries, out.stages[1]

  cfg = ml_collections.ConfigDict(
      dict(
          reward='early_exit',
          baseline='none',
          gamma=1.0,
          lambda_rl=1.0,
          lambda_rate=0.0,
          rate_loss=False,
          target_rate=0.4,
      )
  )

  def log_prob(bnd):
    return jnp.sum(jnp.where(bnd.free, bnd.log_probs, 0.0), axis=-1)

  def policy_loss(bnd, ce_full, ce_early, positions):
    """Stage's score-function loss on each pair alone: float32[R]."""

    def one(ce_f, ce_e, fields, pos):
      row = bd.Boundaries(*(x[None] for x in fields))
      loss, _ = estimator.score_function_terms(
          ce_f[None], ce_e[None], row, mask[:1], cfg, positions=None if pos is None else pos[None]
      )
      return loss

    fields = (bnd.actions, bnd.logits, bnd.probs, bnd.log_probs, bnd.free, bnd.dropped)
    return jax.vmap(one)(ce_full, ce_early, fields, positions)

  @jax.jit
  def measure(p):
    """The executed actions, sum of pi over the pairs, and the gradients (w.r.t. p) of: E[sum_t
    CE_full] / L (exact), and per stage sum_a pi(a) * estimate(a) with pi(a) held fixed (the mean
    estimate; stage 1 also with CE_full as its baseline)."""
    # Every quantity depends on p only through the two stages' log-probabilities (the rate loss is
    # off), so one pullback through the model, batched over the four cotangents, gives all four.
    (out, b0, st1), pullback = jax.vjp(forward, p)
    b1 = st1.boundaries
    stop = jax.lax.stop_gradient
    ce_full = stop(losses.cross_entropy(out.logits, targets))
    ce_early = [
        stop(losses.cross_entropy(e, targets)) for e in (out.early_logits, st1.early_logits)
    ]
    prob = stop(jnp.exp(log_prob(b0) + log_prob(b1)))
    f = jnp.sum(ce_full, -1)
    f = f - jnp.mean(f)  # Centred for float32 accuracy: sum_a grad pi(a) = 0.

    def expected(lp0, lp1):
      joint = jnp.exp(log_prob(b0.replace(log_probs=lp0)) + log_prob(b1.replace(log_probs=lp1)))
      return jnp.sum(joint * f) / l

    def estimate(lp0, lp1, stage, baseline_ce):
      if stage == 0:
        return jnp.sum(prob * policy_loss(b0.replace(log_probs=lp0), ce_full, baseline_ce, None))
      loss = policy_loss(b1.replace(log_probs=lp1), ce_full, baseline_ce, st1.positions)
      return jnp.sum(prob * loss)

    lps = (b0.log_probs, b1.log_probs)
    cotangents = [
        jax.grad(expected, (0, 1))(*lps),
        jax.grad(estimate, (0, 1))(*lps, 0, ce_early[0]),
        jax.grad(estimate, (0, 1))(*lps, 1, ce_early[1]),
        jax.grad(estimate, (0, 1))(*lps, 1, ce_full),
    ]

    def pull(d0, d1):
      zeros = jax.tree.map(jnp.zeros_like, (out, b0, st1))
      st1_cot = zeros[2].replace(boundaries=zeros[2].boundaries.replace(log_probs=d1))
      cot = (zeros[0], zeros[1].replace(log_probs=d0), st1_cot)
      return pullback(cot)[0]

    stacked = jax.vmap(pull)(*(jnp.stack(x) for x in zip(*cotangents)))
    grads = {
        k: jax.tree.map(lambda x, i=i: x[i], stacked)
        for i, k in enumerate(('exact', 'stage0', 'stage1', 'biased'))
    }
    return b0.actions, b1.actions, jnp.sum(prob), grads

  got0, got1, total, grads = measure(params)
  # Given mode executed every pair as enumerated (nothing dropped or forced differently).
  np.testing.assert_array_equal(got0, a0)
  np.testing.assert_array_equal(got1, a1)
  np.testing.assert_allclose(float(total), 1.0, atol=1e-5)  # The enumeration is complete.
  exact = grads['exact']
  for stage, name in ((0, 'boundary'), (1, 'inner_boundaries_0')):
    want, got = exact[name], grads[f'stage{stage}'][name]
    scale = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(want))
    assert scale > 1e-3, (stage, scale)  # A real gradient, not zero.
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, w, atol=1e-4 * scale, rtol=0, err_msg=f'stage {stage}')
  # A baseline that reads stage 1's own decisions (CE_full itself) biases stage 1's estimate.
  biased = grads['biased']['inner_boundaries_0']
  err = max(
      float(jnp.abs(g - w).max())
      for g, w in zip(jax.tree.leaves(biased), jax.tree.leaves(exact['inner_boundaries_0']))
  )
  assert err > 1e-2 * max(float(jnp.abs(x).max()) for x in jax.tree.leaves(exact)), err


def test_counterfactual_baselines_are_unbiased_and_measured_by_exact_enumeration():
  """A counterfactual baseline for stage s: the full model's CE with stage s's decisions (and those
  above) drawn again given the lower stages' fixed ones, or with stage s's greedy pattern. It does
  not depend on stage s's sampled decisions, so over every joint action pair (the enumeration of
  test_each_stage_score_function_is_unbiased_by_exact_enumeration, gamma = 1, no batch baseline) the
  mean estimate of each stage's own policy gradient equals the exact one: for the draw averaged over
  its every outcome (enumerated: the pairs that share row i's lower stages, at their conditional
  probability), and at stage 1 for the model's own draw under one key (mode ('given', 'sample')) and
  its greedy pattern (('given', 'greedy')). The variance over the enumeration (trace of the
  covariance of the stage's policy-parameter gradient) is printed against today's early-exit
  baseline's, at init."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  from tokjax import estimator, losses, stages  # pylint: disable=g-import-not-at-top
  from tokjax.models import boundaries as bd  # pylint: disable=g-import-not-at-top

  l, model, params, a0, a1, tokens, targets, mask = _enumeration_setup()
  r = a0.shape[0]
  key = jax.random.PRNGKey(5)
  cfg = ml_collections.ConfigDict(
      dict(reward='early_exit', baseline='none', gamma=1.0, lambda_rl=1.0, lambda_rate=0.0)
  )
  cfg.update(rate_loss=False, target_rate=0.4)
  names = ('boundary', 'inner_boundaries_0')  # Each stage's own policy parameters.
  # losses.hierarchical_objective with the counterfactual reward at both stages (its own forward
  # passes, keys and stop-gradients), the rest of its terms as cfg's.
  objective_config = _small_config(2)
  objective_config.estimator.update(cfg.to_dict(), reward='counterfactual')
  objective_config.stages.s1.estimator.reward = 'counterfactual'
  objective_levels = stages.resolve(objective_config)

  @jax.jit
  def measure(p):
    def log_probs(v):
      """Each stage's log pi of the enumerated actions, as a function of the policies' parameters."""
      o = model.apply({'params': {**p, **unravel(v)}}, tokens, key, 'given', (a0, a1))
      return (o.boundaries.log_probs, o.stages[1].boundaries.log_probs), o

    # d log pi[s][row, t] / d (stage s's params): one forward-mode pass per parameter.
    flat, unravel = jax.flatten_util.ravel_pytree({k: p[k] for k in names})
    jac, out = jax.jacfwd(log_probs, has_aux=True)(flat)
    out = jax.lax.stop_gradient(out)
    ce_full = losses.cross_entropy(out.logits, targets)
    st1 = out.stages[1]
    ce_early = [losses.cross_entropy(e, targets) for e in (out.early_logits, st1.early_logits)]

    def alone(mode, given):
      """CE of the counterfactual of each row, drawn one row at a time with the same key: in training
      rows are sequences, but here a row is an action pattern, and a draw that differed by row would
      depend on that row's actions."""

      def one(t, y, a):
        o = model.apply({'params': p}, t[None], key, mode, None if a is None else (a[None], None))
        ce = losses.cross_entropy(o.logits, y[None])[0]
        return jax.lax.stop_gradient(ce), o.stages[1].boundaries.actions[0]

      return jax.vmap(one, (0, 0, None if given is None else 0))(tokens, targets, given)

    ce_cf1, cf1_actions = alone(('given', 'sample'), a0)
    ce_greedy1, _ = alone(('given', 'greedy'), a0)
    bnds = (out.boundaries, st1.boundaries)
    positions = (None, st1.positions)

    def coefficients(s, baseline_ce, rows):
      """d (stage s's loss of row i with baseline row baseline_ce[i]) / d log pi[s][rows[i]]."""

      def one(lp, b, i):
        bn = bnds[s]
        fields = (bn.actions, bn.logits, bn.probs, lp, bn.free, bn.dropped)
        row = bd.Boundaries(*(x[i][None] if x is not lp else lp[None] for x in fields))
        pos = None if positions[s] is None else positions[s][i][None]
        return estimator.score_function_terms(
            ce_full[i][None], b[None], row, mask[:1], cfg, positions=pos
        )[0]

      return jax.vmap(jax.grad(one), (0, 0, 0))(bnds[s].log_probs[rows], baseline_ce, rows)

    free = [jnp.where(b.free, 1.0, 0.0) for b in bnds]
    prob = jnp.exp(sum(jnp.sum(f * b.log_probs, -1) for f, b in zip(free, bnds)))
    f = jnp.sum(ce_full, -1)
    rows = jnp.arange(r)
    result = {'prob': prob, 'cf1_actions': cf1_actions, 'ce_cf1': ce_cf1, 'ce_full': ce_full}
    for s in (0, 1):
      grads = lambda coef, rows_, s=s: jnp.einsum('it,itp->ip', coef, jac[s][rows_])
      exact = jnp.einsum('i,i,it,itp->p', prob, f - jnp.sum(prob * f), free[s], jac[s]) / l
      # Stage s's alternative draws given row i's lower stages: every row for stage 0, the rows
      # with row i's stage-0 actions for stage 1, with their conditional probability.
      same = jnp.all(a0[:, None] == a0[None], -1) if s else jnp.ones((r, r), bool)
      cond = jnp.where(same, prob[None] / jnp.sum(jnp.where(same, prob[None], 0), 1, keepdims=1), 0)
      i, j = jnp.meshgrid(rows, rows, indexing='ij')
      pairs = grads(coefficients(s, ce_full[j.ravel()], i.ravel()), i.ravel()).reshape(r, r, -1)
      result[f'stage{s}'] = {
          'exact': exact,
          'today': grads(coefficients(s, ce_early[s], rows), rows),
          'cf_pairs': pairs,
          'cond': cond,
      }
      if s:
        result['stage1']['cf_key'] = grads(coefficients(s, ce_cf1, rows), rows)
        result['stage1']['greedy'] = grads(coefficients(s, ce_greedy1, rows), rows)

    def objective_grad(t, y, x0, x1):
      """The training objective's gradient (w.r.t. both policies) on one enumerated pair alone."""
      batch = {'inputs': t[None], 'targets': y[None], 'mask': mask[:1]}
      return jax.grad(
          lambda v: losses.hierarchical_objective(
              model,
              {**p, **unravel(v)},
              batch,
              key,
              0,
              cfg=objective_config,
              levels=objective_levels,
              mode=('given',) * 2,
              actions=(x0, x1),
          )[0]
      )(flat)

    result['objective'] = jax.vmap(objective_grad)(tokens, targets, a0[:, None], a1[:, None])
    return result

  m = jax.device_get(measure(params))
  prob = m['prob']
  np.testing.assert_allclose(prob.sum(), 1.0, atol=1e-5)
  # The mixed mode executes what 'given' executes: row i's counterfactual is the enumerated pair of
  # row i's stage-0 actions and the stage-1 actions it drew.
  for i in range(r):
    j = np.flatnonzero(np.all(a0 == a0[i], 1) & np.all(a1 == m['cf1_actions'][i], 1))
    assert len(j) == 1, i
    np.testing.assert_allclose(m['ce_cf1'][i], m['ce_full'][j[0]], atol=1e-5)
  for s in (0, 1):
    g = m[f'stage{s}']
    exact = g['exact']
    scale = np.abs(exact).max()
    assert scale > 1e-3, scale
    mean = lambda x: np.einsum('i,ip->p', prob, x)
    variance = lambda x, exact=exact: float(np.einsum('i,ip->', prob, (x - exact) ** 2))
    pairs_mean = np.einsum('i,ij,ijp->p', prob, g['cond'], g['cf_pairs'])
    pairs_var = float(np.einsum('i,ij,ijp->', prob, g['cond'], (g['cf_pairs'] - exact) ** 2))
    for name in ('today', 'cf_key', 'greedy')[: 3 if s else 1]:
      np.testing.assert_allclose(mean(g[name]), exact, atol=1e-4 * scale, err_msg=f'{s} {name}')
    np.testing.assert_allclose(pairs_mean, exact, atol=1e-4 * scale, err_msg=f'{s} draw')
    greedy = f', greedy {variance(g["greedy"]):.4g}' if s else ''
    if s:
      # The objective with counterfactual rewards: unbiased for both stages' policies at once.
      want = m['stage0']['exact'] + exact
      got = np.einsum('i,ip->p', prob, m['objective'])
      np.testing.assert_allclose(got, want, atol=1e-4 * scale, err_msg='objective')
    print(
        f'stage {s}: gradient variance (trace) today {variance(g["today"]):.4g}, counterfactual'
        f' draw {pairs_var:.4g}{greedy}; |exact| {scale:.3g}'
    )


def test_stage_estimator_settings_default_to_the_shared_ones_and_touch_only_their_stage():
  """config.stages.s1.estimator.{reward, gamma, lambda_rl, lambda_rate, baseline} left unset give,
  bit for bit,
  the objective of the same values set explicitly (config.estimator's: today's shared settings);
  other values (a counterfactual reward among them) change stage 1's terms and leave every stage-0
  metric bit for bit. The counterfactual is a draw apart from the training one (its CE differs), and
  its forward pass is counted in the training FLOPs."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax import flops, losses, models, stages  # pylint: disable=g-import-not-at-top
  from tokjax.config import validation as config_validation

  batch = {k: np.asarray(v) for k, v in _batch().items()}
  runs, forwards = {}, {}
  est = _small_config(2).estimator
  for name, fields in (
      ('default', {}),
      ('explicit', dict(gamma=est.gamma, lambda_rl=est.lambda_rl, lambda_rate=est.lambda_rate)),
      ('stage1', dict(gamma=0.5, lambda_rl=0.3, lambda_rate=0.2, reward='counterfactual')),
  ):
    if name == 'explicit':
      fields['reward'] = est.reward
    c = _small_config(2)
    c.stages.s1.estimator.update(fields)
    if fields:
      c.stages.s1.estimator.baseline = 'batch' if name == 'explicit' else 'none'
    config_validation.validate(c)
    model = models.build_model(c, levels=stages.resolve(c))
    if not runs:
      params = _init(model, *models.init_args(c, 4, 32))
    loss, (metrics, _) = jax.jit(losses.objective(c, model, levels=stages.resolve(c)))(
        params, batch, jax.random.PRNGKey(3), 0
    )
    runs[name] = {'loss': float(loss), **{k: float(v) for k, v in metrics.items()}}
    forwards[name] = flops.training_forwards(c, levels=stages.resolve(c))
  assert runs['explicit'] == runs['default']
  changed = runs['stage1']
  assert forwards == {'default': 3, 'explicit': 3, 'stage1': 4}
  assert 'stage1_bpb_counterfactual' not in runs['default']
  assert changed['stage1_bpb_counterfactual'] != changed['bpb']
  for k, v in runs['default'].items():
    if k.startswith('stage1_') and k.endswith(('policy_loss', 'return_abs')):
      assert changed[k] != v, k
    elif not k.startswith('stage1_') and k != 'loss':
      assert changed[k] == v, k
  assert changed['loss'] != runs['default']['loss']


def test_policy_and_rate_losses_weigh_a_decision_alike_at_every_stage():
  """One normalisation rule: at stage 0 (decisions over L bytes) and stage 1 (decisions over N < L
  chunks), d loss / d log pi(a) = -lambda_rl * G / (B * L) and d loss / d logit = lambda_rate *
  (mean p - r*) / (B * L) at each of the stage's free decisions, and 0 elsewhere."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from tokjax import estimator  # pylint: disable=g-import-not-at-top
  from tokjax.models import boundaries as bd  # pylint: disable=g-import-not-at-top

  b, l, n, r = 3, 24, 9, 0.3
  cfg = _small_config(2).estimator
  cfg.update(baseline='none', gamma=0.0, lambda_rl=0.7, lambda_rate=0.4, reward='plain')
  rng = np.random.default_rng(0)
  ce_full = jnp.asarray(rng.random((b, l)), jnp.float32)
  mask = jnp.ones((b, l), jnp.float32)
  for positions in (None, jnp.asarray(np.sort(rng.choice(l, (b, n)), axis=1), jnp.int32)):
    width = l if positions is None else n
    logits = jnp.asarray(rng.normal(size=(b, width)), jnp.float32)
    free = jnp.asarray(rng.random((b, width)) < 0.6)
    probs = jax.nn.sigmoid(logits)

    def loss(lg, lp, free=free, positions=positions):
      zeros = jnp.zeros(lg.shape)
      bnd = bd.Boundaries(zeros, lg, jax.nn.sigmoid(lg), lp, free, zeros)
      return estimator.score_function_terms(
          ce_full, ce_full, bnd, mask, cfg, positions=positions, target_rate=r
      )[0]

    lp = jax.nn.log_sigmoid(logits)
    d_logit, d_lp = jax.grad(loss, (0, 1))(logits, lp)
    err = float(jnp.sum(probs * free) / jnp.sum(free)) - r
    g = -ce_full if positions is None else jnp.take_along_axis(-ce_full, positions, axis=1)
    np.testing.assert_allclose(d_logit, np.where(free, 0.4 * err / (b * l), 0), atol=1e-8)
    np.testing.assert_allclose(d_lp, np.where(free, -0.7 * g / (b * l), 0), atol=1e-8)


# ------------------------------------------------------------------------------ 4. sharded step


def _sharded_worker():
  """Trains test_sharding.STEPS steps of a two-stage policy/policy model on one device and on
  SHARDED_MESH from the same init, batches and key; returns the measurements."""
  import jax  # pylint: disable=g-import-not-at-top
  import test_sharding as ts  # pylint: disable=g-import-not-at-top  (this file's directory)

  from tokjax import sharding  # pylint: disable=g-import-not-at-top
  from tokjax import trainer as trainer_lib

  config = ts._config('policy')  # pylint: disable=protected-access
  config.model.capacity = 10  # Overflow at stage 0 (32 bytes at rate 0.2 would rarely fill 16).
  config.boundary.target_rate = 0.4
  config.model.stages = 2
  config.stages.s1.boundary.update(method='policy', target_rate=0.4)
  config.stages.s1.model.update(capacity=4, encoder_layers=1, decoder_layers=1, byte_window=0)
  batches = ts._batches(ts.STEPS)  # pylint: disable=protected-access
  key = jax.random.PRNGKey(1)
  out, states, init = {'metrics': {}}, {}, None
  for shape in (ts.SINGLE, SHARDED_MESH):
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    mesh = sharding.make_mesh(config.mesh, jax.devices()[: int(np.prod(shape))])
    trainer = trainer_lib.Trainer(config, mesh)
    state = trainer.init(jax.random.PRNGKey(0))
    if init is None:
      init = jax.device_get(state.params)
    metrics = []
    for batch in batches:
      state, m = trainer.train_step(state, sharding.global_batch(batch, mesh), key)
      metrics.append({k: float(v) for k, v in jax.device_get(m).items()})
    out['metrics'][str(shape)] = metrics
    states[shape] = jax.device_get(state)
  mu = lambda shape: states[shape].opt_state[1][0].mu
  out['moved'] = ts._max_diff(states[ts.SINGLE].params, init)  # pylint: disable=protected-access
  out['mu_scale'] = max(float(np.abs(x).max()) for x in jax.tree.leaves(mu(ts.SINGLE)))
  out['mu_diff'] = ts._max_diff(mu(SHARDED_MESH), mu(ts.SINGLE))  # pylint: disable=protected-access
  out['param_diff'] = ts._max_diff(  # pylint: disable=protected-access
      states[SHARDED_MESH].params, states[ts.SINGLE].params
  )
  out['inner_params'] = sorted(k for k in init if k.startswith('inner'))
  out['devices'] = len(jax.devices())
  return out


def test_sharded_two_stage_step_equals_single_device():
  """Three train steps on 8 simulated devices ((data, fsdp, tensor) = (2, 2, 2)) give the single-
  device losses and metrics of both stages to 1e-5, and the same gradients (Adam's first moment) and
  parameters at test_sharding's tolerances."""
  import test_sharding as ts  # pylint: disable=g-import-not-at-top

  env = dict(
      os.environ,
      XLA_FLAGS=f'--xla_force_host_platform_device_count=8 {XLA_FAST_COMPILE}',
      JAX_PLATFORMS='cpu',
      TF_CPP_MIN_LOG_LEVEL='3',
      PYTHONPATH=os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]),
  )
  proc = subprocess.run(
      [sys.executable, __file__, 'sharded'],
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
      cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out['devices'] == 8 and out['inner_params']
  base, got = out['metrics'][str(ts.SINGLE)], out['metrics'][str(SHARDED_MESH)]
  for step, (m, m0) in enumerate(zip(got, base)):
    assert set(m) == set(m0)
    for k in m0:
      assert m[k] == pytest.approx(m0[k], rel=ts.TOL, abs=ts.TOL), (step, k, m[k], m0[k])
  # Both estimators ran, and both levels overflowed at least once.
  assert all(base[0][k] != 0.0 for k in ('policy_loss', 'stage1_policy_loss')), base[0]
  assert max(m['overflow'] for m in base) > 0 and max(m['stage1_overflow'] for m in base) > 0
  assert out['mu_diff'] < ts.MU_TOL * out['mu_scale'], out
  assert out['param_diff'] < ts.PARAM_TOL, out
  assert out['moved'] > 4 * ts.PARAM_TOL  # The steps really updated the parameters.


# ------------------------------------------------------------------------------ 5. resume


def test_two_stage_run_resumes_exactly(tiny_two_stage_run, tmp_path):
  """The shared configs/two_stage.py:learned,tiny run (4 steps, checkpoints at 2 and 4), copied; drop
  step 4 and resume from 2: steps 3 and 4 log the uninterrupted run's metrics, both stages' included,
  bit for bit."""
  from conftest import tiny_two_stage_config  # pylint: disable=g-import-not-at-top

  from tokjax import checkpointing, train  # pylint: disable=g-import-not-at-top
  from tokjax.metric_writers import read_metrics  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(tiny_two_stage_run[0], workdir)
  metrics = os.path.join(workdir, 'metrics.jsonl')
  train_rows = lambda: {r['step']: r for r in read_metrics(metrics) if r['split'] == 'train'}
  uninterrupted = train_rows()
  mgr = checkpointing.manager(workdir)
  mgr.delete(4)
  assert mgr.latest_step() == 2
  kept = [r for r in read_metrics(metrics) if r['step'] <= 2]
  with open(metrics, 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in kept)
  train.train(tiny_two_stage_config(workdir), resume=True)
  resumed = train_rows()
  stage_keys = [k for k in uninterrupted[4] if k.startswith('stage1_')]
  assert 'stage1_rate' in stage_keys and 'stage1_policy_loss' in stage_keys
  for step in (3, 4):
    for k in ['loss', 'rate', *stage_keys]:
      assert resumed[step][k] == uninterrupted[step][k], (step, k)


# ------------------------------------------------------------------------------ 6. bad input


@pytest.mark.parametrize(
    'changes,message',
    [
        (
            {'stages.s1.model.capacity': 1},
            'config.stages.s1.model.capacity=1 must be an integer >= 2',
        ),
        (
            {'stages.s1.model.encoder_layers': -1},
            'config.stages.s1.model.encoder_layers=-1 must be',
        ),
        ({'stages.s1.boundary.target_rate': 0.0}, 'config.stages.s1.boundary.target_rate=0.0 must'),
        ({'stages.s1.boundary.target_rate': 1.0}, 'config.stages.s1.boundary.target_rate=1.0 must'),
        ({'stages.s1.boundary.target_rate': -0.5}, 'config.stages.s1.boundary.target_rate=-0.5 mu'),
        ({'model.stages': 0}, 'config.model.stages=0 must be an integer >= 1'),
        (
            {'stages.s1.boundary.method': 'whitespace'},
            "config.stages.s1.boundary.method='whitespace'",
        ),
        (
            {'stages.s1.boundary.method': 'entropy'},
            "config.stages.s1.boundary.method='entropy' can",
        ),
        ({'stages.s1.boundary.policy.window': 0}, 'config.stages.s1.boundary.policy.window=0 must'),
        (
            {'stages.s1.estimator.gamma': 1.5},
            'config.stages.s1.estimator.gamma=1.5 must be in [0, 1]',
        ),
        ({'stages.s1.estimator.lambda_rl': -1.0}, 'config.stages.s1.estimator.lambda_rl=-1.0 must'),
        ({'stages.s1.estimator.baseline': 'mean'}, "config.stages.s1.estimator.baseline='mean' is"),
        (
            {'stages.s1.estimator.baseline': 'value'},
            "config.stages.s1.estimator.baseline='value' ne",
        ),
        (
            {'stages.s1.estimator.baseline': 'rloo'},
            "config.stages.s1.estimator.baseline='rloo' need",
        ),
        (
            {'stages.s1.estimator.reward': 'counterfactal'},
            "config.stages.s1.estimator.reward='coun",
        ),
        # Inherited values are named where they are set.
        ({'estimator.gamma': 1.5}, 'config.estimator.gamma=1.5 must be in [0, 1]'),
        ({'model.byte_window': -1}, 'config.model.byte_window=-1 must be an integer >= 0'),
        # A section that no stage reads, or that is no stage's.
        ({'model.stages': 1}, "config.stages.s1.boundary.method='policy' is set but config.model"),
        ({'stages.first': 1}, 'config.stages.first is not a stage section'),
        ({'stages.s1.model.window': 3}, 'config.stages.s1.model.window is not a field'),
        ({'estimator.reward': 'greedy'}, "config.estimator.reward='greedy' is not valid"),
    ],
)
def test_bad_stage_settings_are_one_clear_line(changes, message):
  import re  # pylint: disable=g-import-not-at-top

  from tokjax.config import files as config_files
  from tokjax.config import validation as config_validation
  from tokjax.errors import UserError  # pylint: disable=g-import-not-at-top

  c = config_files.load('two_stage', 'learned,tiny')
  config_validation.validate(c)  # The base is valid: the change alone makes it bad.
  for dotted, value in changes.items():
    *parents, key = dotted.split('.')
    node = c
    for p in parents:
      node = node[p]
    node[key] = value
  with pytest.raises(UserError, match='^' + re.escape(message)) as err:
    config_validation.validate(c)
  assert '\n' not in str(err.value)


if __name__ == '__main__':
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  print(json.dumps(_sharded_worker() if sys.argv[1] == 'sharded' else None))
