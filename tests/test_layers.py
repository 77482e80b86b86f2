"""The block's memory and speed options: remat, scanned layers and dot_product_attention change no
number beyond float rounding; bad option values are one-line user errors."""

from conftest import jit_call
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import decoding, losses, models, stages
from tokjax.config import defaults as config_defaults
from tokjax.errors import UserError
from tokjax.models import layers


def _config(kind='hierarchical', depth=1, **model):
  """`depth` layers per stack (the flat model one more): one suffices where layers do not interact,
  and each layer adds compile time; scanning needs a stack of several."""
  c = config_defaults.base_config()
  c.model.update(d_model=32, capacity=24, encoder_layers=depth, main_layers=depth)
  c.model.update(decoder_layers=depth, num_layers=depth + 1, byte_window=8)
  c.model.update(model)
  c.model.kind = kind
  return c


def _batch(b=2, l=40, seed=3):
  rng = np.random.default_rng(seed)
  return {
      'inputs': jnp.asarray(rng.integers(0, 256, (b, l)), jnp.int32),
      'targets': jnp.asarray(rng.integers(0, 256, (b, l)), jnp.int32),
      'mask': jnp.ones((b, l), jnp.float32),
  }


def _params(config, b=2, l=40):
  model = models.build_model(config, levels=stages.resolve(config))
  return (
      model,
      nn.unbox(jit_call(model.init, jax.random.PRNGKey(0), *models.init_args(config, b, l)))[
          'params'
      ],
  )


def _loss_and_grads(config, params, batch):
  model = models.build_model(config, levels=stages.resolve(config))
  objective = losses.objective(config, model, 'sample', levels=stages.resolve(config))
  fn = jax.jit(jax.value_and_grad(lambda p: objective(p, batch, jax.random.PRNGKey(5), 0)[0]))
  return fn(params)


def _assert_trees_close(a, b, rtol, atol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


@pytest.mark.parametrize('kind', ['hierarchical', 'flat'])
def test_remat_changes_no_loss_or_gradient(kind):
  base = _config(kind)
  _, params = _params(base)
  batch = _batch()
  loss0, grads0 = _loss_and_grads(base, params, batch)
  assert (
      float(
          jnp.abs(
              grads0['encoder' if kind == 'hierarchical' else 'layers']['block_0']['mlp']['up'][
                  'kernel'
              ]
          ).max()
      )
      > 0
  )  # The compared gradients are not trivially zero.
  # Hierarchical: both policies in one compile (a stack each); flat has one stack, so one per policy.
  if kind == 'hierarchical':
    remats = [dict(encoder='dots', main='full', decoder='dots')]
  else:
    remats = [dict(encoder='none', main=policy, decoder='none') for policy in ('dots', 'full')]
  for remat in remats:
    c = _config(kind, remat=remat)
    assert models.build_model(c, levels=stages.resolve(c)) != models.build_model(
        base, levels=stages.resolve(base)
    )
    loss, grads = _loss_and_grads(c, params, batch)
    np.testing.assert_allclose(loss, loss0, rtol=1e-6)
    _assert_trees_close(grads, grads0, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('kind', ['hierarchical', 'flat'])
def test_scanned_layers_equal_unrolled_layers_with_mapped_parameters(kind):
  unrolled = _config(kind, depth=2)
  scanned = _config(
      kind, depth=2, scan_layers=True, remat=dict(encoder='full', main='dots', decoder='none')
  )
  _, params = _params(unrolled)
  model_s, params_s_init = _params(scanned)
  mapped = layers.scan_params(params)
  # The mapping lands on the scanned model's own tree: same structure, shapes and dtypes.
  assert jax.tree.structure(mapped) == jax.tree.structure(params_s_init)
  jax.tree.map(lambda a, b: np.testing.assert_equal(a.shape, b.shape), mapped, params_s_init)
  _assert_trees_close(layers.unscan_params(mapped), params, rtol=0, atol=0)
  batch = _batch()
  loss_u, grads_u = _loss_and_grads(unrolled, params, batch)
  loss_s, grads_s = _loss_and_grads(scanned, mapped, batch)
  np.testing.assert_allclose(loss_s, loss_u, rtol=1e-6)
  _assert_trees_close(layers.unscan_params(grads_s), grads_u, rtol=1e-5, atol=1e-7)
  # And with other parameters the outputs differ: the comparison is not vacuous.
  other = jax.tree.map(lambda x: x * 1.5, mapped)
  assert abs(float(_loss_and_grads(scanned, other, batch)[0]) - float(loss_u)) > 1e-4


def test_cached_generation_runs_the_scanned_stacks():
  """Decoding calls the stacks with caches; scanned stacks give what unrolled ones give."""
  unrolled, scanned = _config(depth=2), _config(depth=2, scan_layers=True)
  model_u, params = _params(unrolled, 1, 32)
  model_s = models.build_model(scanned, levels=stages.resolve(scanned))
  prompt = decoding.encode_prompt(b'def f(x):', batch=1)
  gen = lambda m, p: jax.device_get(
      decoding.generate(
          m,
          p,
          prompt,
          jax.random.PRNGKey(0),
          8,
          mode='sample',
          temperature=1.0,
          top_k=0,
          cached=True,
      )
  )
  a, b = gen(model_u, params), gen(model_s, layers.scan_params(params))
  np.testing.assert_allclose(a['logits'], b['logits'], atol=1e-5)
  np.testing.assert_array_equal(a['tokens'], b['tokens'])


def test_blocked_attention_paths_equal_dense_attention():
  """Smaller query blocks (local) and the skipped upper triangle (sorted) change no result."""
  q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 45, 2, 8))
  pos = jnp.broadcast_to(jnp.arange(45), (2, 45))
  for window, splits in [(8, 1), (8, 2), (8, 4), (6, 4), (16, 2)]:
    np.testing.assert_allclose(
        jit_call(layers.local_causal_attention, q, k, v, window, splits),
        jit_call(layers.full_causal_attention, q, k, v, pos, pos, None, window=window),
        atol=1e-5,
    )
  valid = jnp.arange(45)[None, :] < jnp.array([[30], [7]])
  ends = jnp.where(valid, pos * 3, 200)
  for block in (8, 16, 64):
    for window in (0, 10):
      # Padding queries that see no key at all (possible only with a window) are left out: their
      # output is a uniform average over whatever keys were scored, read by nothing.
      rows = valid[..., None, None] if window else True
      np.testing.assert_allclose(
          jnp.where(
              rows,
              jit_call(
                  layers.sorted_causal_attention, q, k, v, ends, valid, window=window, block=block
              ),
              0,
          ),
          jnp.where(
              rows,
              jit_call(layers.full_causal_attention, q, k, v, ends, ends, valid, window=window),
              0,
          ),
          atol=1e-5,
      )


def test_dot_product_attention_equals_blocked_attention():
  q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 45, 2, 8))
  pos = jnp.broadcast_to(jnp.arange(45), (2, 45))
  for window in (0, 4, 8, 16):
    blocked = (
        jit_call(layers.local_causal_attention, q, k, v, window)
        if window
        else jit_call(layers.full_causal_attention, q, k, v, pos, pos)
    )
    np.testing.assert_allclose(
        jit_call(layers.dot_product_causal_attention, q, k, v, window=window), blocked, atol=1e-5
    )
  # Chunk buffers: increasing positions, a prefix of valid slots, invalid slots at position L.
  num_keys = jnp.array([30, 7])
  valid = jnp.arange(45)[None, :] < num_keys[:, None]
  ends = jnp.where(valid, jnp.cumsum(jnp.array([[1, 3] * 23])[:, :45].repeat(2, 0), axis=1), 200)
  np.testing.assert_allclose(
      jit_call(layers.dot_product_causal_attention, q, k, v, window=0, num_keys=num_keys),
      jit_call(layers.full_causal_attention, q, k, v, ends, ends, valid),
      atol=1e-5,
  )


@pytest.mark.parametrize('kind', ['hierarchical', 'flat'])
def test_dot_product_model_equals_blocked_model_and_is_causal(kind):
  blocked, dpa = _config(kind), _config(kind, attention='dot_product')
  _, params = _params(blocked, 2, 48)  # 48 > 2 * byte_window: the blocked path runs block-locally.
  batch = _batch(2, 48)
  loss_b, grads_b = _loss_and_grads(blocked, params, batch)
  loss_d, grads_d = _loss_and_grads(dpa, params, batch)
  np.testing.assert_allclose(loss_d, loss_b, rtol=1e-5)
  _assert_trees_close(grads_d, grads_b, rtol=1e-4, atol=1e-6)
  model = models.build_model(dpa, levels=stages.resolve(dpa))
  args = () if kind == 'flat' else (jax.random.PRNGKey(1), 'greedy')
  logits = jax.jit(lambda p, t: model.apply({'params': p}, t, *args).logits)
  t = 20
  tokens = batch['inputs']
  later = tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 101) % 256)
  a, b = logits(params, tokens), logits(params, later)
  np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-6)
  assert np.abs(a[:, t + 1 :] - b[:, t + 1 :]).max() > 1e-3


def test_bad_option_values_are_user_errors():
  for field, value, match in [
      ('remat', dict(encoder='some'), 'remat.encoder'),
      ('remat', dict(middle='full'), 'unknown stack'),
      ('attention', 'flash', 'config.model.attention'),
  ]:
    c = _config()
    c.model[field] = value
    with pytest.raises(UserError, match=match):
      models.build_model(c, levels=stages.resolve(c))
  if jax.default_backend() != 'gpu':
    with pytest.raises(UserError, match='cudnn'):
      c = _config(attention='cudnn')
      models.build_model(c, levels=stages.resolve(c))
