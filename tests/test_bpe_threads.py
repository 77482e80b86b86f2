"""BPE-guided training and evaluation with one XLA thread on one core do not hang.

The BPE rival tokenizes on the host inside the step. With `jax.pure_callback` this hung: the CPU
client copies a host array of more than about 100 KiB that it cannot alias on its worker pool, a
step dispatched before such inputs are ready runs on that pool, and pure_callback's own copy of the
callback's argument was queued behind the callback that waited for it. It takes one worker, which a
process pinned to one core gets (the ladder's runs are), so the steps run in a subprocess pinned to
one core with the ladder's XLA threading flags, from unaliasable host batches over that size.
"""

import os
import subprocess
import sys
import textwrap

from conftest import XLA_FAST_COMPILE
import pytest

from tokjax.data import corpora
from tokjax.lab import ladder
from tokjax.models.rivals import bpe

pytest.importorskip('tokenizers')

# B * L int32 tokens = 128 KiB: above the size the CPU client copies on its pool.
B, L, ROUNDS = 32, 1024, 6
TIMEOUT_S = 300  # A cold compile on a busy machine takes about a minute; a hang never ends.

_WORKER = textwrap.dedent("""
    import os, sys
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # Before JAX starts its threads.
    import jax
    import numpy as np
    from tokjax import sharding, trainer as trainer_lib
    from tokjax.config import files
    from tokjax.data import BOS_ID, PAD_ID, corpora

    tokenizer, b, l, rounds = sys.argv[1], *map(int, sys.argv[2:])
    c = files.load('compare', 'bpe,tiny')
    c.boundary.bpe.tokenizer = tokenizer
    c.data.update(seq_len=l, batch_size=b)
    c.eval.batch_size = b
    c.model.capacity = l // 4
    mesh = sharding.make_mesh(c.mesh)
    trainer = trainer_lib.Trainer(c, mesh)
    state = trainer.init(jax.random.PRNGKey(0))
    text = b''.join(corpora.load_documents('shakespeare', max_bytes=400_000))

    def batch(i):
      # One element past an aligned allocation: an array the CPU client must copy, not alias.
      inputs = np.empty(b * l + 1, np.int32)[1:].reshape(b, l)
      for r in range(b):
        start = (i * b + r) * (l - 1) % (len(text) - l)
        inputs[r, 0] = BOS_ID
        inputs[r, 1:] = np.frombuffer(text[start : start + l - 1], np.uint8)
        inputs[r, l - r :] = PAD_ID  # Rows of every length: segments end at PAD too.
      mask = np.empty(b * l + 1, np.float32)[1:].reshape(b, l)
      mask[:] = inputs != PAD_ID
      host = {'inputs': inputs, 'targets': inputs, 'mask': mask}
      return sharding.global_batch(host, mesh)

    for i in range(rounds):
      state, metrics = trainer.train_step(state, batch(i), jax.random.PRNGKey(i))
      val = trainer.eval_step(state.params, batch(rounds + i), jax.random.PRNGKey(i))
      metrics, val = jax.device_get((metrics, val))
      assert np.isfinite(metrics['loss']) and val['bytes'] > 0, (metrics, val)
      print('round', i, 'loss', float(metrics['loss']), flush=True)
    """)


def test_bpe_train_and_eval_steps_finish_with_one_xla_thread_on_one_core(tmp_path):
  path = str(tmp_path / 'bpe.json')
  bpe.train_tokenizer(corpora.load_documents('shakespeare', max_bytes=300_000), 512).save(path)
  env = dict(os.environ)
  # Last: XLA drops the flags after ONE_THREAD's bare 'intra_op_parallelism_threads=1'.
  env['XLA_FLAGS'] = f'{XLA_FAST_COMPILE} {ladder.ONE_THREAD}'
  args = [sys.executable, '-c', _WORKER, path, str(B), str(L), str(ROUNDS)]
  try:
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f'BPE steps hung with one XLA thread; output so far:\n{e.stdout}\n{e.stderr}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.count('round') == ROUNDS, done.stdout
