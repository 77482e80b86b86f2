"""Tests of cached generation: it agrees with recomputing the whole model for every byte."""

import jax
import numpy as np
import pytest
from test_decoding import fresh_model

from tokjax import decoding, inspection, sample
from tokjax.config import defaults as config_defaults
from tokjax.errors import UserError


def _fresh(window: int):
  c = config_defaults.base_config()
  c.model.d_model, c.model.byte_window, c.model.main_layers = 32, 8, 2
  # A sequential policy reads its own history.
  c.boundary.policy.window, c.boundary.policy.scale = window, 4.0
  # The independent policy has no logit scale: spread its logits directly instead.
  return fresh_model(c, spread=100.0 if window == 1 else 1.0)


@pytest.mark.parametrize(
    'window,mode,temperature,top_k', [(3, 'sample', 1.0, 0), (1, 'greedy', 0.8, 5)]
)
def test_cached_and_uncached_generation_agree(window, mode, temperature, top_k):
  model, params = _fresh(window)
  prompt = decoding.encode_prompt(b'def f(x):\n  return', batch=2)
  n = 30  # Prompt + continuation (49 positions) spans several 8-byte windows of the byte layers.
  gen = lambda cached, seed: jax.device_get(
      decoding.generate(
          model,
          params,
          prompt,
          jax.random.PRNGKey(seed),
          n,
          mode=mode,
          temperature=temperature,
          top_k=top_k,
          cached=cached,
      )
  )
  a, b = gen(True, 0), gen(False, 0)
  np.testing.assert_allclose(a['logits'], b['logits'], atol=1e-4)
  np.testing.assert_allclose(a['policy_logits'], b['policy_logits'], atol=1e-4)
  np.testing.assert_array_equal(a['tokens'], b['tokens'])
  np.testing.assert_array_equal(a['actions'], b['actions'])
  np.testing.assert_array_equal(a['tokens'][:, : prompt.shape[1]], prompt)
  assert 0 < a['actions'][:, 1:].sum() < a['actions'][:, 1:].size  # Chunks of varied length.
  assert (a['tokens'] < 256).sum() == a['tokens'].size - 2  # Only the BOS of each row is special.
  c = gen(True, 1)
  assert not np.array_equal(a['tokens'], c['tokens'])  # The key matters: agreement is not vacuous.


def test_a_flat_checkpoint_generates_cached_as_its_forward(flat_run):
  ckpt = inspection.load_checkpoint(flat_run)
  assert ckpt.model.num_stages == 0
  args = (ckpt.model, ckpt.params, b'import os', 40, jax.random.PRNGKey(0))
  settings = {'mode': 'sample', 'temperature': 1.0, 'top_k': 0}
  cached, uncached = (sample.run_generation(*args, **settings, cached=c) for c in (True, False))
  assert cached['text'] == uncached['text'] and cached['text'].startswith(b'import os')
  assert cached['marked'] == cached['text'].decode('utf-8', errors='replace')  # No chunks.
  tokens = np.asarray(cached['out']['tokens'])
  assert len(np.unique(tokens[:, 10:])) > 5  # Sampled bytes, not one repeated.
  out = jax.jit(ckpt.model.apply)({'params': ckpt.params}, tokens)
  for r in (cached, uncached):
    logits = np.asarray(r['out']['logits']).swapaxes(0, 1)
    np.testing.assert_allclose(logits, np.asarray(out.logits), atol=1e-4)


def test_checkpoint_generation_and_bad_prompt(tiny_run):
  ckpt = inspection.load_checkpoint(tiny_run)
  runs = [
      sample.run_generation(
          ckpt.model,
          ckpt.params,
          b'import os',
          20,
          jax.random.PRNGKey(0),
          mode='sample',
          temperature=0.8,
          top_k=40,
          cached=cached,
      )
      for cached in (True, False)
  ]
  assert runs[0]['text'] == runs[1]['text'] and runs[0]['text'].startswith(b'import os')
  assert len(runs[0]['text']) == 29 and runs[0]['marked'].replace('|', '') == runs[0][
      'text'
  ].decode('utf-8', errors='replace').replace('|', '')
  with pytest.raises(UserError, match='prompt is empty'):
    decoding.encode_prompt(b'')
