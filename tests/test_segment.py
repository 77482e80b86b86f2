"""Tests of the learned tokenizer on files: offsets tile the input, windows leave no seams, greedy is
deterministic, and bad input gets a clear message."""

import json
import subprocess
import sys

from conftest import jit_call
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import models, segment, tokenization
from tokjax.config import defaults as config_defaults
from tokjax.data import BOS_ID, PAD_ID
from tokjax.errors import UserError

TEXT = (
    b'def add(a, b):\n    """Adds two numbers."""\n    return a + b\n\n' * 12
    + 'caf\u00e9 na\u00efve \u2603 snow\n'.encode()
)


def _fresh_model(byte_window=8, seq_len=48):
  c = config_defaults.base_config()
  c.model.d_model, c.model.byte_window, c.model.capacity = 32, byte_window, seq_len
  c.data.seq_len = seq_len
  c.boundary.policy.scale = 4.0  # Spread the untrained policy's probabilities so boundaries vary.
  model = models.build_model(c)
  params = nn.unbox(
      jit_call(model.init, jax.random.PRNGKey(3), *models.init_args(c, 1, seq_len))['params']
  )
  params['boundary']['bias'] = jnp.zeros(())  # p near 0.5: greedy boundaries on some bytes only.
  return c, model, params


def test_offsets_tile_the_input_exactly_once(tiny_run, tmp_path):
  path = tmp_path / 'in.txt'
  path.write_bytes(TEXT)
  assert len(TEXT) > 5 * 64  # Several windows of the tiny model's seq_len.
  for mode in ('greedy', 'sample'):
    res = segment.segment_file(
        tiny_run, str(path), str(tmp_path / mode), mode=mode, delimiter='\x00'
    )
    offsets = json.load(open(res['paths']['json']))['offsets']
    assert offsets[0][0] == 0 and offsets[-1][1] == len(TEXT)
    assert all(e > s for s, e in offsets)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))
    assert b''.join(TEXT[s:e] for s, e in offsets) == TEXT
    txt = open(res['paths']['txt'], encoding='utf-8').read()
    assert txt.replace('\x00', '') == TEXT.decode()
    assert txt.count('\x00') in (len(offsets), len(offsets) - 1)  # No delimiter after an open tail.
    for k in ('html', 'png'):
      assert (tmp_path / f'{mode}.{k}').stat().st_size > 1000


def test_windows_leave_no_seams():
  """With overlap = the encoder's receptive field, windowed probabilities equal one long pass."""
  c, model, params = _fresh_model()
  overlap = tokenization.window_overlap(c)
  assert overlap == 7
  text = TEXT[:300]
  actions, probs = tokenization.segment_text(
      model, params, text, c.data.seq_len, jax.random.PRNGKey(0), 'greedy', overlap
  )
  long = jnp.asarray([[BOS_ID] + list(text) + [PAD_ID]], jnp.int32)
  big = model.clone(capacity=long.shape[1], boundary=model.boundary.clone(capacity=long.shape[1]))
  ref = jit_call(big.apply, {'params': params}, long, jax.random.PRNGKey(0), mode='greedy')
  ref = ref.boundaries
  assert actions.shape == probs.shape == (1, len(text))  # [levels, bytes]: one stage.
  actions, probs = actions[0], probs[0]
  np.testing.assert_allclose(probs, np.asarray(ref.probs[0, 1:-1]), atol=1e-5)
  np.testing.assert_array_equal(actions, np.asarray(ref.actions[0, 1:-1]))
  assert 0 < actions.sum() < len(text)
  # Too little overlap does leave seams: the check above can fail.
  _, probs0 = tokenization.segment_text(
      model, params, text, c.data.seq_len, jax.random.PRNGKey(0), 'greedy', 0
  )
  assert np.abs(probs0[0] - np.asarray(ref.probs[0, 1:-1])).max() > 1e-4


def test_greedy_is_deterministic_and_sampling_is_not():
  c, model, params = _fresh_model()
  run = lambda mode, seed: tokenization.segment_text(
      model, params, TEXT, c.data.seq_len, jax.random.PRNGKey(seed), mode, 7
  )[0]
  np.testing.assert_array_equal(run('greedy', 0), run('greedy', 1))
  assert not np.array_equal(run('sample', 0), run('sample', 1))


def test_bad_input(tiny_run, tmp_path):
  (tmp_path / 'empty.txt').write_bytes(b'')
  with pytest.raises(UserError, match='empty'):
    segment.segment_file(tiny_run, str(tmp_path / 'empty.txt'))
  with pytest.raises(UserError, match='not a file'):
    segment.segment_file(tiny_run, str(tmp_path / 'nope.txt'))
  (tmp_path / 'a.txt').write_bytes(b'some text')
  with pytest.raises(UserError, match='does not exist'):
    segment.segment_file(str(tmp_path / 'norun'), str(tmp_path / 'a.txt'))


def test_command_line_takes_file_positionally(tiny_run, tmp_path):
  (tmp_path / 'a.txt').write_bytes(TEXT[:200])
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'tokjax.segment',
          '--checkpoint',
          tiny_run,
          str(tmp_path / 'a.txt'),
          '--out',
          str(tmp_path / 'cli'),
      ],
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert (tmp_path / 'cli.json').exists()
  empty = tmp_path / 'e.txt'
  empty.write_bytes(b'')
  out = subprocess.run(
      [sys.executable, '-m', 'tokjax.segment', '--checkpoint', tiny_run, str(empty)],
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert out.returncode == 2 and 'is empty' in out.stderr.strip().splitlines()[-1]
