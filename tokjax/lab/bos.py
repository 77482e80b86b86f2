r"""Does BOS before text cut from the left help or hurt? Measured on a trained checkpoint.

  python -m tokjax.lab.bos --checkpoint runs/default --split test

Training packs documents as `BOS + bytes` into one stream and cuts windows anywhere in it: BOS only
ever precedes a document's first byte, and a window that starts inside a document starts with a
plain byte at position 0. Scoring a context cut from the left (lm-eval's long contexts and rolling
windows, sliding generation) could read the cut text either way. For windows c = doc[s : s + L]
taken inside held-out documents (s >= L, one every L bytes), both readings score the same bytes
c[1:L] with the same text visible:
  with_bos:  inputs BOS, c[0], ..., c[L-2]   (BOS, then the cut text; positions shift by one)
  as_trained: inputs c[0], ..., c[L-1]       (the cut text from position 0, as a training window)
The difference (with_bos - as_trained, bits per byte) is paired per window and clustered by
document (`significance.paired_difference`), for greedy and sampled boundaries.
"""

import functools
import json
import os
from typing import Any

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from tokjax import cli, evaluator, inspection, significance
from tokjax.data import BOS_ID, pipeline
from tokjax.errors import UserError


def cut_windows(docs, length: int, max_windows: int) -> tuple[np.ndarray, np.ndarray]:
  """(windows uint8[N, length], their documents int[N]): doc[s : s + length] for s = length,
  2 * length, ... (never a document's start), at most max_windows in document order."""
  out, owner = [], []
  for d, doc in enumerate(docs):
    for s in range(length, len(doc) - length + 1, length):
      out.append(np.frombuffer(doc[s : s + length], np.uint8))
      owner.append(d)
      if len(out) == max_windows:
        return np.stack(out), np.asarray(owner)
  if not out:
    raise UserError(f'no document is longer than {2 * length} bytes: nothing is cut from the left.')
  return np.stack(out), np.asarray(owner)


def readings(windows: np.ndarray) -> dict:
  """{'with_bos', 'as_trained'}: batches {inputs, targets, mask} int32/float32[N, L] that score
  the same bytes windows[:, 1:] (see the module docstring)."""
  c = windows.astype(np.int32)
  n, length = c.shape
  with_bos = {
      'inputs': np.concatenate([np.full((n, 1), BOS_ID, np.int32), c[:, :-1]], axis=1),
      'targets': c,
      'mask': np.concatenate([np.zeros((n, 1)), np.ones((n, length - 1))], axis=1),
  }
  as_trained = {
      'inputs': c,
      'targets': np.concatenate([c[:, 1:], np.zeros((n, 1), np.int32)], axis=1),
      'mask': np.concatenate([np.ones((n, length - 1)), np.zeros((n, 1))], axis=1),
  }
  return {
      name: {k: jnp.asarray(v, jnp.float32 if k == 'mask' else jnp.int32) for k, v in b.items()}
      for name, b in (('with_bos', with_bos), ('as_trained', as_trained))
  }


def measure(ckpt, docs, key, max_windows: int = 512, batch_size: int = 16) -> dict:
  """{mode: {'with_bos', 'as_trained' (bpb), 'paired': with_bos - as_trained}} over cut windows of
  docs, for every boundary mode of the checkpoint's model."""
  model, params = ckpt.model, ckpt.params
  length = ckpt.config.data.seq_len
  windows, owner = cut_windows(docs, length, max_windows)
  batches = readings(windows)
  out: dict[str, Any] = {'windows': int(len(windows)), 'documents': int(len(set(owner.tolist())))}
  for mode in model.boundary_modes:
    forward = jax.jit(functools.partial(evaluator._forward, model, mode))  # pylint: disable=protected-access
    ce = {}
    for name, batch in batches.items():
      rows = []
      for b in range(0, len(windows), batch_size):
        part = {k: v[b : b + batch_size] for k, v in batch.items()}
        rows.append(np.asarray(forward(params, part, jax.random.fold_in(key, b))[0]))
      ce[name] = np.concatenate(rows).sum(axis=1)  # Nats per window over the same L - 1 bytes.
    nbytes = np.full(len(windows), length - 1)
    p = significance.paired_difference(ce['with_bos'], ce['as_trained'], nbytes, owner)
    out[mode] = {name: float(v.sum() / nbytes.sum() / np.log(2)) for name, v in ce.items()} | {
        'paired': {k: p[k] for k in ('diff', 'se', 'clustered_se')}
    }
  return out


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.checkpoint:
    raise UserError('--checkpoint is required: a run folder that tokjax.train wrote.')
  ckpt = inspection.load_checkpoint(f.checkpoint)
  docs = pipeline.load_splits(ckpt.config.data, ckpt.config.data.corpus)[f.split]
  result = measure(ckpt, docs, jax.random.PRNGKey(f.seed), f.max_windows)
  result.update(checkpoint=f.checkpoint, split=f.split, seq_len=int(ckpt.config.data.seq_len))
  for mode in ckpt.model.boundary_modes:
    r = result[mode]
    p = r['paired']
    print(
        f'{mode}: with BOS {r["with_bos"]:.4f} bpb, as trained {r["as_trained"]:.4f} bpb, '
        f'difference {p["diff"]:+.4f} (window s.e. {p["se"]:.4f}, clustered {p["clustered_se"]:.4f}) '
        f'over {result["windows"]} windows of {result["documents"]} documents'
    )
  if f.out:
    os.makedirs(os.path.dirname(os.path.abspath(f.out)), exist_ok=True)
    with open(f.out, 'w') as fh:
      json.dump(result, fh, indent=1)


def define_flags():
  flags.DEFINE_string('checkpoint', None, 'Run folder of a trained model.')
  flags.DEFINE_enum('split', 'test', ['val', 'test'], 'Held-out split to cut windows from.')
  flags.DEFINE_integer('max_windows', 512, 'At most this many cut windows.')
  flags.DEFINE_integer('seed', 0, 'Boundary key.')
  flags.DEFINE_string('out', None, 'Also write the numbers to this JSON file.')


if __name__ == '__main__':
  define_flags()
  cli.run(main)
