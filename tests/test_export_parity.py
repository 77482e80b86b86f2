"""The PyTorch port against tokjax one component at a time: each component of the port is fed the
input tokjax's own component got and must give its output, so a drift names the component (the gate
of tokjax/export/exporter.py compares only the whole model)."""

import conftest
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import models, stages
from tokjax.export import exporter, spec
from tokjax.models import chunking

torch = pytest.importorskip('torch')


def _torch(x):
  return torch.from_numpy(np.array(x))


def _components(config):
  """{component: largest |difference|} between tokjax and the port for each component of config's
  hierarchical model (one stage, fresh weights, its policy's logits spread) on the gate's bytes."""
  from tokjax.export import modeling_tokjax  # pylint: disable=g-import-not-at-top

  model = models.build_model(config, levels=stages.resolve(config))
  init = lambda *a: nn.unbox(model.init(*a))
  params = conftest.jit_call(init, jax.random.PRNGKey(3), *model.init_args(2, 64))['params']
  kernel = params['boundary']['proj']['kernel'] * 50  # About half the decisions each way.
  params = {**params, 'boundary': {'bias': jnp.zeros(()), 'proj': {'kernel': kernel}}}
  fields = spec.hf_config(config, levels=stages.resolve(config))
  pt = exporter.torch_model(fields, exporter.torch_state(fields, params))
  tokens = exporter.probe(int(config.data.seq_len))
  positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
  capacity = model.levels[0].capacity

  def tokjax(fn, *args):
    return jax.device_get(
        jax.jit(lambda p, *a: model.apply({'params': p}, *a, method=fn))(params, *args)
    )

  diffs = {}

  def check(name, ours, theirs):
    diffs[name] = float(np.max(np.abs(np.asarray(ours, np.float32) - theirs.detach().numpy())))

  with torch.no_grad():
    x = tokjax(lambda m, t: m.embed(t), tokens)
    check('embedding', x, pt.embed(_torch(tokens).long()))
    h = tokjax(lambda m, x, p: m.encoder(x, p), x, positions)
    check('encoder (byte layers)', h, pt.encoder(_torch(x), _torch(positions).long()))
    early = tokjax(lambda m, h: m.early_head(h), h)
    check('early-exit head', early, pt.early_head(_torch(h)))
    bnd = tokjax(lambda m, h: m.boundary(h, jax.random.PRNGKey(0), mode='greedy'), h)
    pt_bnd = pt.boundary(_torch(h), 'greedy', tokens=_torch(tokens).long(), early_logits=None)
    check('boundary method: logits', bnd.logits, pt_bnd.logits)
    check('boundary method: greedy actions', bnd.actions, pt_bnd.actions)
    chunks, ends, valid = jax.device_get(chunking.downsample(h, bnd.actions, capacity))
    got = modeling_tokjax.downsample(_torch(h), _torch(bnd.actions), capacity)
    check('downsample: chunks', chunks, got[0])
    check('downsample: chunk ends', np.minimum(ends, tokens.shape[1]), got[1].float())
    out = tokjax(lambda m, c, e, v: m.main(c, e, v), chunks, ends, valid)
    check('main network', out, pt.main(_torch(chunks), _torch(ends).long(), _torch(valid)))
    up = jax.device_get(chunking.upsample(h, out, bnd.actions))
    check('upsample', up, modeling_tokjax.upsample(_torch(h), _torch(out), _torch(bnd.actions)))
    y = tokjax(lambda m, u, p: m.decoder(u, p), up, positions)
    check('decoder (byte layers)', y, pt.decoder(_torch(up), _torch(positions).long()))
    logits = tokjax(lambda m, y: m.head(y), y)
    check('head', logits, pt.head(_torch(y)))
  assert 0 < bnd.actions[:, 1:-1].mean() < 1  # The boundary paths are exercised both ways.
  return diffs


@pytest.mark.parametrize('window', [1, 3])
def test_each_component_of_the_port_matches_tokjax(window, tmp_path):
  c = conftest.tiny_config(str(tmp_path))
  c.model.byte_window = 16  # Shorter than the rows: the sliding window is exercised.
  c.boundary.policy.window = window
  diffs = _components(c)
  drifted = {name: d for name, d in diffs.items() if d > exporter.TOLERANCE}
  assert not drifted, f'components of the port that drifted from tokjax: {drifted}'
  assert len(diffs) == 11


def test_a_changed_block_exports_once_both_sides_change(tmp_path, monkeypatch):
  """docs/extending.md, "Changing the main network", on a toy change of the block: the MLP's GeLU
  made a ReLU. Made in tokjax only, the component parity names every stack built of that block and
  nothing else; made in the port too (modeling_tokjax's `gelu`), every component and the gate agree.
  """
  import flax.linen as flax_nn  # pylint: disable=g-import-not-at-top

  from tokjax.export import modeling_tokjax  # pylint: disable=g-import-not-at-top

  c = conftest.tiny_config(str(tmp_path))
  monkeypatch.setattr(flax_nn, 'gelu', jax.nn.relu)  # The block's MLP (tokjax/models/layers.py).
  drifted = {n for n, d in _components(c).items() if d > exporter.TOLERANCE}
  assert drifted == {'encoder (byte layers)', 'main network', 'decoder (byte layers)'}, drifted
  monkeypatch.setattr(modeling_tokjax, 'gelu', torch.nn.functional.relu)
  diffs = _components(c)
  assert max(diffs.values()) <= exporter.TOLERANCE, diffs
  model = models.build_model(c, levels=stages.resolve(c))
  params = conftest.jit_call(
      lambda k, *a: nn.unbox(model.init(k, *a)), jax.random.PRNGKey(3), *model.init_args(2, 64)
  )['params']
  fields = spec.hf_config(c, levels=stages.resolve(c))
  pt = exporter.torch_model(fields, exporter.torch_state(fields, params))
  found = exporter.gate(model, params, pt, int(c.data.seq_len))
  assert found['given'] <= exporter.TOLERANCE
