"""Blocks, the flat model, boundaries, chunking and the whole hierarchical model (causality first)."""

import chex
from conftest import hierarchical_model, jit_call
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax.models import boundaries as bd
from tokjax.models import chunking, flat, interface, layers


def _tokens(key, b=2, l=48):
  return jax.random.randint(key, (b, l), 0, 256)


def _perturb_after(tokens, t):
  return tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 101) % 256)


def test_local_attention_equals_dense_windowed_attention():
  q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 45, 2, 8))
  pos = jnp.broadcast_to(jnp.arange(45), (2, 45))
  for window in (4, 8, 16):
    np.testing.assert_allclose(
        layers.local_causal_attention(q, k, v, window),
        layers.full_causal_attention(q, k, v, pos, pos, None, window=window),
        atol=1e-5,
    )


def test_rope_depends_on_relative_position_only():
  """q.k after RoPE is unchanged when every position shifts by the same offset."""
  q, k = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 5, 1, 8))
  pos = jnp.array([[0, 3, 7, 8, 20]])
  dots = lambda p: jnp.einsum('blhk,bmhk->blm', layers.apply_rope(q, p), layers.apply_rope(k, p))
  np.testing.assert_allclose(dots(pos), dots(pos + 13), atol=1e-4)
  assert not np.allclose(dots(pos), dots(pos * 2), atol=1e-3)


def _assert_flat_causal(model, apply):
  tokens = _tokens(jax.random.PRNGKey(2))
  params = nn.unbox(jit_call(model.init, jax.random.PRNGKey(0), tokens))
  t = 20
  a = apply(params, tokens).logits
  b = apply(params, _perturb_after(tokens, t)).logits
  np.testing.assert_array_equal(a[:, : t + 1], b[:, : t + 1])
  assert np.abs(a[:, t + 1 :] - b[:, t + 1 :]).max() > 1e-3


@pytest.mark.parametrize('window', [0, 8])
def test_flat_model_is_causal(window):
  model = flat.FlatByteLM(258, 32, 2, 2, 64, window=window)
  _assert_flat_causal(model, jax.jit(model.apply))


def _hier(window=1, capacity=24, rate=0.2, scale=1 / 16, byte_window=8):
  policy = bd.BoundaryPolicy(target_rate=rate, window=window, scale=scale, capacity=capacity)
  return hierarchical_model(policy, d_model=32, capacity=capacity, window=byte_window)


@pytest.mark.parametrize(
    'window,capacity,rate', [(1, 24, 0.2), (8, 24, 0.2), (1, 6, 0.5), (4, 6, 0.5)]
)
def test_hierarchical_model_is_causal_including_boundary_decisions(window, capacity, rate):
  """With a fixed key, bytes after t change no logit, boundary probability or sample at or before t.

  Also with a small capacity, so that overflow (which depends on earlier decisions) is exercised.
  """
  model = _hier(window, capacity, rate, scale=1.0)
  _assert_hierarchical_causal(model, jax.jit(model.apply), capacity)


def _assert_hierarchical_causal(model, apply, capacity):
  key = jax.random.PRNGKey(3)
  tokens = _tokens(jax.random.PRNGKey(4), b=3, l=64)
  params = nn.unbox(jit_call(model.init, key, tokens, key))
  base = apply(params, tokens, key)
  for t in (0, 9, 30, 62):
    out = apply(params, _perturb_after(tokens, t), key)
    for name in ('logits', 'early_logits'):
      np.testing.assert_array_equal(
          getattr(base, name)[:, : t + 1], getattr(out, name)[:, : t + 1], err_msg=name
      )
    for field in ('actions', 'probs', 'log_probs', 'free', 'dropped'):
      np.testing.assert_array_equal(
          getattr(base.boundaries, field)[:, : t + 1],
          getattr(out.boundaries, field)[:, : t + 1],
          err_msg=field,
      )
    assert np.abs(base.logits[:, t + 1 :] - out.logits[:, t + 1 :]).max() > 1e-3
  if capacity == 6:
    assert base.boundaries.dropped.sum() > 0  # The overflow path really ran.


class CausalityWithAndWithoutJitTest(chex.TestCase):
  """The causality checks above, also run eagerly (chex variants): a jit-only bug, or one that jit
  hides (a Python branch on a traced value), fails one variant."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_flat_model_is_causal(self):
    model = flat.FlatByteLM(258, 32, 2, 2, 64, window=8)
    _assert_flat_causal(model, self.variant(model.apply))

  @chex.variants(with_jit=True, without_jit=True)
  def test_hierarchical_model_is_causal_with_overflow(self):
    model = _hier(4, 6, 0.5, scale=1.0)
    _assert_hierarchical_causal(model, self.variant(model.apply), 6)


def test_a_forward_pass_checks_its_shapes_at_the_models_boundary():
  """interface.checked: the logits' vocabulary, a stage's fields of unequal length, the token rank."""
  model = _hier()
  key = jax.random.PRNGKey(3)
  tokens = _tokens(jax.random.PRNGKey(4), b=2, l=16)
  params = nn.unbox(jit_call(model.init, key, tokens, key))
  out = jit_call(model.apply, params, tokens, key)
  assert interface.checked(tokens, out, 258) is out
  with pytest.raises(AssertionError):
    interface.checked(tokens, out, 259)
  stage = out.stages[0].replace(valid=out.stages[0].valid[:, :-1])
  with pytest.raises(AssertionError):
    interface.checked(tokens, out.replace(stages=(stage,)), 258)
  with pytest.raises(AssertionError):
    interface.checked(tokens[0], out, 258)


def test_upsample_uses_latest_complete_chunk_not_the_open_one():
  """A leak test at the seam: chunk j's output reaches bytes t >= b_j only."""
  actions = jnp.array([[1, 0, 1, 0, 0, 1, 0, 1]], jnp.float32)  # chunks end at 0, 2, 5, 7
  chunks, ends, valid = chunking.downsample(jnp.arange(8.0)[None, :, None], actions, capacity=6)
  np.testing.assert_array_equal(ends[0], [0, 2, 5, 7, 8, 8])
  np.testing.assert_array_equal(valid[0], [1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(chunks[0, :, 0], [0, 2, 5, 7, 0, 0])
  chunk_out = jnp.array([[[10.0], [20.0], [30.0], [40.0], [50.0], [60.0]]])
  y = chunking.upsample(jnp.zeros((1, 8, 1)), chunk_out, actions)
  np.testing.assert_array_equal(y[0, :, 0], [10, 10, 20, 20, 20, 30, 30, 40])


def test_enforce_convention_forces_ends_and_drops_overflow():
  sampled = jnp.array([[0, 1, 1, 1, 1, 1, 0, 0]], jnp.float32)
  executed, free, dropped = bd.enforce_convention(sampled, capacity=4)
  # Chunk 1 is open at 0; room for capacity - 2 = 2 sampled boundaries, then the forced last one.
  np.testing.assert_array_equal(executed[0], [1, 1, 1, 0, 0, 0, 0, 1])
  np.testing.assert_array_equal(dropped[0], [0, 0, 0, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(free[0], [0, 1, 1, 0, 0, 0, 0, 0])
  assert executed.sum() == 4
  # Idempotent: evaluating executed actions reproduces them and the same free mask.
  again, free2, dropped2 = bd.enforce_convention(executed, capacity=4)
  np.testing.assert_array_equal(again, executed)
  np.testing.assert_array_equal(free2, free)
  assert dropped2.sum() == 0


@pytest.mark.parametrize('window', [1, 4])
def test_overflow_never_exceeds_capacity_and_masks_the_gradient(window):
  """A policy that wants a boundary everywhere: at most C chunks, and dropped positions carry no
  policy gradient (their executed action was forced by the full buffer)."""
  model = _hier(window, capacity=5, rate=0.9, scale=1.0)
  key = jax.random.PRNGKey(5)
  tokens = _tokens(jax.random.PRNGKey(6), b=4, l=40)
  params = nn.unbox(jit_call(model.init, key, tokens, key))
  out = jit_call(model.apply, params, tokens, key)
  bnd = out.boundaries
  assert float(bnd.actions.sum(-1).max()) <= 5
  assert float(bnd.dropped.sum()) > 0
  assert not np.any(np.asarray(bnd.free) & (np.asarray(bnd.dropped) > 0))
  np.testing.assert_array_equal(out.stages[0].chunk_valid.sum(-1), bnd.actions.sum(-1))

  def surrogate(p):
    b = model.apply(p, tokens, key).boundaries
    return jnp.sum(jnp.where(b.free, b.log_probs, 0.0))

  g_free = jax.jit(jax.grad(surrogate))(params)['params']['boundary']['bias']

  def surrogate_all(p):
    b = model.apply(p, tokens, key).boundaries
    return jnp.sum(b.log_probs)

  g_all = jax.jit(jax.grad(surrogate_all))(params)['params']['boundary']['bias']
  assert not np.isclose(g_free, g_all)  # The mask really removes the dropped (and forced) terms.


def test_sequential_sampler_matches_parallel_recomputation():
  """Executed actions of the lax.scan sampler, fed back in 'given' mode, reproduce its log-probs,
  and the scan honours the same capacity rule as enforce_convention."""
  model = _hier(window=8, capacity=10, rate=0.4, scale=1.0)
  key = jax.random.PRNGKey(7)
  tokens = _tokens(jax.random.PRNGKey(8), b=4, l=64)
  params = nn.unbox(jit_call(model.init, key, tokens, key))
  sampled = jit_call(model.apply, params, tokens, key).boundaries
  given = jit_call(
      model.apply, params, tokens, None, mode='given', actions=sampled.actions
  ).boundaries
  np.testing.assert_array_equal(sampled.actions, given.actions)
  np.testing.assert_allclose(sampled.log_probs, given.log_probs, atol=1e-6)
  assert float(sampled.actions.sum(-1).max()) <= 10


def test_sequential_sampler_draws_with_the_probability_it_reports():
  """E[a_t - p_t] = 0 at each free position, where p_t is the reported (history-dependent) probability.

  The statistic is a martingale difference; a sampler conditioned on the wrong history (an off-by-one
  shift) fails it, which the second half checks so the test can actually detect that bug.
  """
  w, n, l = 4, 4000, 12
  v = jax.random.normal(jax.random.PRNGKey(9), (1, l, w)) * 20.0
  v = jnp.broadcast_to(v, (n, l, w))
  u = jax.random.uniform(jax.random.PRNGKey(10), (n, l))
  scale, bias, cap = 1.0 / 16, -0.5, 100
  samples = bd.sample_sequential(v, bias, u, scale, cap)
  executed, free, _ = bd.enforce_convention(samples, cap)

  def reported(history_shift):
    hist = jnp.pad(executed, ((0, 0), (history_shift, 0)))[:, :l]
    z = scale * (v[..., w - 1] + bd._history_term(v, hist, w)) + bias  # pylint: disable=protected-access
    return jax.nn.sigmoid(6.0 * jnp.tanh(z / 6.0))

  def max_z(p):
    resid = jnp.where(free, executed - p, 0.0)
    se = jnp.sqrt(jnp.sum(jnp.where(free, p * (1 - p), 0.0), 0)) + 1e-9
    return float(jnp.max(jnp.abs(jnp.sum(resid, 0)) / se))

  assert max_z(reported(0)) < 4.5
  assert max_z(reported(1)) > 6.0


def test_off_policy_warm_start_draws_from_the_target_rate_and_reports_importance_ratios():
  """behavior=True: decisions come from Bernoulli(target_rate) whatever the policy says, and
  stats['log_ratio'] = log pi(a) - log mu(a) on them; behavior=False leaves the policy in charge."""
  model = _hier(window=1, capacity=64, rate=0.2, scale=1.0)
  key = jax.random.PRNGKey(11)
  tokens = _tokens(jax.random.PRNGKey(12), b=8, l=64)
  params = nn.unbox(jit_call(model.init, key, tokens, key))
  params['params']['boundary']['bias'] = jnp.asarray(3.0)  # The policy wants p = 0.95.
  apply = jax.jit(model.apply)
  off = apply(params, tokens, key, behavior=jnp.asarray(True)).boundaries
  on = apply(params, tokens, key, behavior=jnp.asarray(False)).boundaries
  interior = lambda x: np.asarray(x)[:, 1:-1]
  assert abs(interior(off.actions).mean() - 0.2) < 0.05
  assert interior(on.actions).mean() > 0.8
  log_mu = np.where(interior(off.actions) > 0.5, np.log(0.2), np.log(0.8))
  np.testing.assert_allclose(
      interior(off.stats['log_ratio']), interior(off.log_probs) - log_mu, rtol=1e-5, atol=1e-5
  )
  np.testing.assert_array_equal(on.stats['log_ratio'], 0.0)


def test_flat_model_is_the_zero_stage_case_of_the_interface():
  """The flat model through `interface.ByteLM`: no stages, no key, one mode; its objective and the
  evaluator's forward work on it as on any model, called the same way."""
  from tokjax import evaluator as evaluator_lib
  from tokjax import losses, models, stages  # pylint: disable=g-import-not-at-top
  from tokjax.config import files as config_files
  from tokjax.config import presets

  c = config_files.load('flat_cpu')
  presets.tiny(c)
  model = models.build_model(c, levels=stages.resolve(c))
  assert (model.num_stages, model.takes_key, model.boundary_modes) == (0, False, ('sample',))
  args = model.init_args(2, 16)
  assert len(args) == 1 and args[0].shape == (2, 16)
  params = nn.unbox(jit_call(model.init, jax.random.PRNGKey(0), *args))['params']
  tokens = _tokens(jax.random.PRNGKey(1), 2, 16)
  key = jax.random.PRNGKey(2)
  out = jit_call(model.apply, {'params': params}, tokens, key, mode='greedy')
  assert out.stages == () and out.values is None and out.logits.shape == (2, 16, 258)
  np.testing.assert_array_equal(
      out.logits, jit_call(model.apply, {'params': params}, tokens).logits
  )
  assert interface.stage_metrics(model, 'rate') == [] and interface.byte_levels(model) == 1
  targets = jnp.roll(tokens, -1, axis=1)
  mask = jnp.ones((2, 16), jnp.float32).at[1, 10:].set(0.0)
  batch = {'inputs': tokens, 'targets': targets, 'mask': mask}
  loss, (metrics, ce) = losses.objective(c, model, levels=stages.resolve(c))(params, batch, key, 0)
  want = losses.cross_entropy(out.logits, targets) * mask
  np.testing.assert_allclose(ce, want, rtol=1e-6)
  np.testing.assert_allclose(loss, want.sum() / mask.sum(), rtol=1e-6)
  assert set(metrics) == {'loss', 'bpb'}
  ce_eval, levels = evaluator_lib._forward(model, 'sample', params, batch, key)  # pylint: disable=protected-access
  np.testing.assert_allclose(ce_eval, want, rtol=1e-6)
  assert levels.shape == (2, 1, 16) and not np.any(levels)


# The parameter paths of the models `tiny_config` and `tiny_two_stage_config` build, printed by the
# code before every level became a `hierarchical.Level`: saved checkpoints restore by these
# paths, so they may not change.
ONE_STAGE_PARAM_PATHS = (
    'params/boundary/bias',
    'params/boundary/proj/kernel',
    'params/decoder/block_0/attn/key/kernel',
    'params/decoder/block_0/attn/out/kernel',
    'params/decoder/block_0/attn/query/kernel',
    'params/decoder/block_0/attn/value/kernel',
    'params/decoder/block_0/mlp/down/kernel',
    'params/decoder/block_0/mlp/gate/kernel',
    'params/decoder/block_0/mlp/up/kernel',
    'params/decoder/block_0/post_attn_norm/scale',
    'params/decoder/block_0/post_mlp_norm/scale',
    'params/decoder/block_0/pre_attn_norm/scale',
    'params/decoder/block_0/pre_mlp_norm/scale',
    'params/early_head/norm/scale',
    'params/early_head/proj/kernel',
    'params/embed/embedding',
    'params/encoder/block_0/attn/key/kernel',
    'params/encoder/block_0/attn/out/kernel',
    'params/encoder/block_0/attn/query/kernel',
    'params/encoder/block_0/attn/value/kernel',
    'params/encoder/block_0/mlp/down/kernel',
    'params/encoder/block_0/mlp/gate/kernel',
    'params/encoder/block_0/mlp/up/kernel',
    'params/encoder/block_0/post_attn_norm/scale',
    'params/encoder/block_0/post_mlp_norm/scale',
    'params/encoder/block_0/pre_attn_norm/scale',
    'params/encoder/block_0/pre_mlp_norm/scale',
    'params/head/norm/scale',
    'params/head/proj/kernel',
    'params/main/block_0/attn/key/kernel',
    'params/main/block_0/attn/out/kernel',
    'params/main/block_0/attn/query/kernel',
    'params/main/block_0/attn/value/kernel',
    'params/main/block_0/mlp/down/kernel',
    'params/main/block_0/mlp/gate/kernel',
    'params/main/block_0/mlp/up/kernel',
    'params/main/block_0/post_attn_norm/scale',
    'params/main/block_0/post_mlp_norm/scale',
    'params/main/block_0/pre_attn_norm/scale',
    'params/main/block_0/pre_mlp_norm/scale',
    'params/main/block_1/attn/key/kernel',
    'params/main/block_1/attn/out/kernel',
    'params/main/block_1/attn/query/kernel',
    'params/main/block_1/attn/value/kernel',
    'params/main/block_1/mlp/down/kernel',
    'params/main/block_1/mlp/gate/kernel',
    'params/main/block_1/mlp/up/kernel',
    'params/main/block_1/post_attn_norm/scale',
    'params/main/block_1/post_mlp_norm/scale',
    'params/main/block_1/pre_attn_norm/scale',
    'params/main/block_1/pre_mlp_norm/scale',
)

TWO_STAGE_PARAM_PATHS = (
    'params/boundary/bias',
    'params/boundary/proj/kernel',
    'params/decoder/block_0/attn/key/kernel',
    'params/decoder/block_0/attn/out/kernel',
    'params/decoder/block_0/attn/query/kernel',
    'params/decoder/block_0/attn/value/kernel',
    'params/decoder/block_0/mlp/down/kernel',
    'params/decoder/block_0/mlp/gate/kernel',
    'params/decoder/block_0/mlp/up/kernel',
    'params/decoder/block_0/post_attn_norm/scale',
    'params/decoder/block_0/post_mlp_norm/scale',
    'params/decoder/block_0/pre_attn_norm/scale',
    'params/decoder/block_0/pre_mlp_norm/scale',
    'params/early_head/norm/scale',
    'params/early_head/proj/kernel',
    'params/embed/embedding',
    'params/encoder/block_0/attn/key/kernel',
    'params/encoder/block_0/attn/out/kernel',
    'params/encoder/block_0/attn/query/kernel',
    'params/encoder/block_0/attn/value/kernel',
    'params/encoder/block_0/mlp/down/kernel',
    'params/encoder/block_0/mlp/gate/kernel',
    'params/encoder/block_0/mlp/up/kernel',
    'params/encoder/block_0/post_attn_norm/scale',
    'params/encoder/block_0/post_mlp_norm/scale',
    'params/encoder/block_0/pre_attn_norm/scale',
    'params/encoder/block_0/pre_mlp_norm/scale',
    'params/head/norm/scale',
    'params/head/proj/kernel',
    'params/inner_boundaries_0/bias',
    'params/inner_boundaries_0/proj/kernel',
    'params/inner_decoders_0/block_0/attn/key/kernel',
    'params/inner_decoders_0/block_0/attn/out/kernel',
    'params/inner_decoders_0/block_0/attn/query/kernel',
    'params/inner_decoders_0/block_0/attn/value/kernel',
    'params/inner_decoders_0/block_0/mlp/down/kernel',
    'params/inner_decoders_0/block_0/mlp/gate/kernel',
    'params/inner_decoders_0/block_0/mlp/up/kernel',
    'params/inner_decoders_0/block_0/post_attn_norm/scale',
    'params/inner_decoders_0/block_0/post_mlp_norm/scale',
    'params/inner_decoders_0/block_0/pre_attn_norm/scale',
    'params/inner_decoders_0/block_0/pre_mlp_norm/scale',
    'params/inner_early_heads_0/norm/scale',
    'params/inner_early_heads_0/proj/kernel',
    'params/inner_encoders_0/block_0/attn/key/kernel',
    'params/inner_encoders_0/block_0/attn/out/kernel',
    'params/inner_encoders_0/block_0/attn/query/kernel',
    'params/inner_encoders_0/block_0/attn/value/kernel',
    'params/inner_encoders_0/block_0/mlp/down/kernel',
    'params/inner_encoders_0/block_0/mlp/gate/kernel',
    'params/inner_encoders_0/block_0/mlp/up/kernel',
    'params/inner_encoders_0/block_0/post_attn_norm/scale',
    'params/inner_encoders_0/block_0/post_mlp_norm/scale',
    'params/inner_encoders_0/block_0/pre_attn_norm/scale',
    'params/inner_encoders_0/block_0/pre_mlp_norm/scale',
    'params/main/block_0/attn/key/kernel',
    'params/main/block_0/attn/out/kernel',
    'params/main/block_0/attn/query/kernel',
    'params/main/block_0/attn/value/kernel',
    'params/main/block_0/mlp/down/kernel',
    'params/main/block_0/mlp/gate/kernel',
    'params/main/block_0/mlp/up/kernel',
    'params/main/block_0/post_attn_norm/scale',
    'params/main/block_0/post_mlp_norm/scale',
    'params/main/block_0/pre_attn_norm/scale',
    'params/main/block_0/pre_mlp_norm/scale',
)


@pytest.mark.parametrize(
    'config_fn,want',
    [('tiny_config', ONE_STAGE_PARAM_PATHS), ('tiny_two_stage_config', TWO_STAGE_PARAM_PATHS)],
)
def test_built_models_keep_the_parameter_paths_checkpoints_restore_into(config_fn, want):
  import conftest  # pylint: disable=g-import-not-at-top

  from tokjax import models, stages  # pylint: disable=g-import-not-at-top

  c = getattr(conftest, config_fn)('unused')
  model = models.build_model(c, levels=stages.resolve(c))
  init = lambda: nn.unbox(model.init(jax.random.PRNGKey(0), *model.init_args(1, 16)))
  leaves = jax.tree_util.tree_flatten_with_path(jax.eval_shape(init))[0]
  assert sorted('/'.join(k.key for k in path) for path, _ in leaves) == list(want)


def test_an_input_longer_than_training_keeps_every_boundary_training_had_room_for(tmp_path):
  """A 1500-byte row through a model trained on 64-byte rows (chunk buffer 32): its buffers grow
  with the row's length, so it equals the model with room for a chunk at every byte."""
  from conftest import tiny_config  # pylint: disable=g-import-not-at-top

  from tokjax import decoding, models, stages  # pylint: disable=g-import-not-at-top

  c = tiny_config(str(tmp_path))
  model = models.build_model(c, levels=stages.resolve(c))
  assert (model.train_length, model.capacities()) == (64, (32,))
  params = jit_call(
      lambda *a: nn.unbox(model.init(*a)), jax.random.PRNGKey(0), *model.init_args(1, 64)
  )
  row = jax.random.randint(jax.random.PRNGKey(1), (1, 1500), 32, 127)
  key = jax.random.PRNGKey(2)
  run = lambda m: jit_call(m.apply, params, row, key, mode='sample')
  assert model.for_length(1500).capacities() == (750,)  # 32 * 1500 / 64.
  # A buffer given explicitly (generation's) stays as given at any length.
  assert decoding.with_capacity(model, 1500).for_length(3000).capacities() == (1500,)
  grown, unbounded = run(model), run(decoding.with_capacity(model, 1500))
  # More chunks than the 32 of a training row's buffer, none dropped: a fixed buffer would drop.
  chunks = float(grown.stages[0].boundaries.actions.sum())
  assert chunks > 32 and float(grown.stages[0].boundaries.dropped.sum()) == 0, chunks
  np.testing.assert_array_equal(
      grown.stages[0].boundaries.actions, unbounded.stages[0].boundaries.actions
  )
  np.testing.assert_allclose(grown.logits, unbounded.logits, atol=1e-5, rtol=0)


def test_occupied_prefix_runs_the_shortest_length_that_holds_every_row():
  """`on_occupied_prefix` picks the shortest of its lengths holding each row's valid slots, runs the
  function there alone (its output here is the length it ran at), zeros the rest, and its gradient
  is that branch's."""
  assert layers.prefix_lengths(256) == (64, 128, 192, 256)
  assert layers.prefix_lengths(1000) == (256, 512, 768, 1000)
  assert layers.prefix_lengths(128) == (128,)  # Under four query blocks: the whole buffer.
  lengths = layers.prefix_lengths(256)
  fn = lambda w, x, positions, valid: w * x * x.shape[1]
  x = jnp.ones((2, 256, 3))
  positions = jnp.broadcast_to(jnp.arange(256), (2, 256))
  for counts, ran in (((40, 64), 64), ((40, 65), 128), ((256, 3), 256)):
    valid = jnp.arange(256)[None] < jnp.asarray(counts)[:, None]
    run = lambda w, x, valid=valid: layers.on_occupied_prefix(fn, w, x, positions, valid, lengths)
    out = jax.jit(run)(2.0, x)
    np.testing.assert_array_equal(out[:, :ran], 2.0 * ran)
    np.testing.assert_array_equal(out[:, ran:], 0.0)
    total = lambda w, x, run=run: jnp.sum(run(w, x))
    dw, dx = jax.jit(jax.grad(total, argnums=(0, 1)))(2.0, x)
    assert float(dw) == 2 * 3 * ran * ran
    np.testing.assert_array_equal(dx[:, :ran], 2.0 * ran)
    np.testing.assert_array_equal(dx[:, ran:], 0.0)


@pytest.mark.parametrize('stages', [1, 2])
def test_chunk_stacks_on_the_occupied_prefix_equal_the_whole_buffer(monkeypatch, stages):
  """Chunk buffers of 256 slots holding about a fifth of them: the main network (and the chunk
  layers of level 1) run on a prefix, with the logits and parameter gradients of the stacks run
  over the whole buffer (`prefix_lengths` giving one length)."""
  from tokjax.models import hierarchical  # pylint: disable=g-import-not-at-top

  policy = lambda capacity: bd.BoundaryPolicy(target_rate=0.2, window=1, capacity=capacity)
  levels = (hierarchical.Level(policy(256), 256, encoder_layers=1, decoder_layers=1, window=8),)
  if stages == 2:
    levels += (hierarchical.Level(policy(256), 256, encoder_layers=1, decoder_layers=1),)
  model = hierarchical.HierarchicalByteLM(
      vocab_size=258, d_model=32, num_heads=2, main_layers=1, levels=levels
  )
  tokens, key = _tokens(jax.random.PRNGKey(0), b=2, l=256), jax.random.PRNGKey(1)
  params = nn.unbox(jit_call(model.init, key, tokens, key))

  def loss(params):
    out = model.apply(params, tokens, key)
    return jnp.mean(jax.nn.log_softmax(out.logits)[..., 0]), out

  ran, real = [], layers.on_occupied_prefix
  spy = lambda *args: ran.append(args[-1]) or real(*args)
  monkeypatch.setattr(layers, 'on_occupied_prefix', spy)
  prefix = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  # The main network over the last buffer; with two stages level 1's encoder and decoder too.
  assert ran == [layers.prefix_lengths(256)] * (3 if stages == 2 else 1)
  for st, level in zip(prefix[0][1].stages, levels):  # Every chunk buffer fits a shorter prefix.
    assert int(st.chunk_valid.sum(axis=1).max()) <= layers.prefix_lengths(level.capacity)[-2]
  monkeypatch.setattr(layers, 'prefix_lengths', lambda slots, **_: (slots,))
  whole = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  np.testing.assert_allclose(prefix[0][1].logits, whole[0][1].logits, atol=2e-5, rtol=0)
  chex.assert_trees_all_close(prefix[1], whole[1], atol=2e-5, rtol=1e-4)
