r"""Start-up time and host memory of training on a prepared corpus, at growing corpus sizes.

  python -m tokjax.lab.benchmarks.prepared_data --sizes 10e6,1e9,5e9 --scratch /tmp/tokjax-bench \
      --out results/data/startup.json

For each size it writes a folder of synthetic text documents (lowercase letters, a newline every 64
bytes, 1 MiB files) under --scratch, prepares it (`python -m tokjax.data.prepare ... --out`, timed:
the prepare throughput), then measures start-to-first-step: from just before a fresh process is
spawned to the end of its first training step of a tiny model on --config.data.corpus=prepared:DIR
(imports, build_data, model init, compile, one step), and that process's peak RSS; with
--in_memory_max_bytes the same for the in-memory path on the source folder, for contrast. Both
folders are deleted afterwards. The model is the same at every size, so only the data side can make
start-up grow; set JAX_COMPILATION_CACHE_DIR so that compile time (load-dependent) does not swamp
the comparison. prepare_mb_per_s is the prepare command's own throughput (manifest.json: reading the
source, hashing, writing and checksumming shards, the reference bpb); prepare_command_s adds
interpreter start-up.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

_FILE_BYTES = 2**20


def write_synthetic(folder: str, nbytes: int, seed: int = 0) -> int:
  """Writes ~nbytes of synthetic text as 1 MiB files; returns the bytes written."""
  os.makedirs(folder)
  rng = np.random.default_rng(seed)
  written, i = 0, 0
  while written < nbytes:
    size = min(_FILE_BYTES, nbytes - written)
    text = rng.integers(ord('a'), ord('z') + 1, size, np.uint8)
    text[63::64] = ord('\n')
    sub = os.path.join(folder, f'{i // 1000:04d}')  # 1000 files a folder.
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f'{i:07d}.txt'), 'wb') as f:
      f.write(text.tobytes())
    written, i = written + size, i + 1
  return written


def first_step(corpus: str, t0: float) -> dict:
  """Runs in a fresh process spawned at time t0: seconds from t0 to the first finished step."""
  import resource  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from tokjax import sharding  # pylint: disable=g-import-not-at-top
  from tokjax import trainer as trainer_lib
  from tokjax.config import defaults as config_defaults
  from tokjax.config import validation as config_validation
  from tokjax.data import pipeline  # pylint: disable=g-import-not-at-top

  c = config_defaults.base_config()
  c.data.corpus = corpus
  c.model.d_model, c.model.capacity = 32, 32
  c.data.seq_len, c.data.batch_size = 256, 8
  c.eval.batch_size, c.eval.max_batches = 8, 4
  config_validation.validate(c)
  mesh = sharding.make_mesh(c.mesh)
  t = time.time()
  data = pipeline.build_data(c)
  build_data_s = time.time() - t
  trainer = trainer_lib.Trainer(c, mesh)
  state = trainer.init(jax.random.PRNGKey(0))
  batch = sharding.global_batch(next(data.train_iter), mesh)
  state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(1))
  jax.block_until_ready(metrics)
  return {
      'start_to_first_step_s': round(time.time() - t0, 2),
      'build_data_s': round(build_data_s, 3),
      'peak_rss_mb': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
      'train_bytes': data.num_bytes('train'),
  }


def _first_step_row(corpus: str) -> dict:
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'tokjax.lab.benchmarks.prepared_data',
          '--first_step',
          corpus,
          '--t0',
          repr(time.time()),
      ],
      check=True,
      capture_output=True,
      text=True,
  ).stdout
  return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m tokjax.lab.benchmarks.prepared_data')
  parser.add_argument('--sizes', default='10e6,1e9,5e9', help='corpus bytes, comma separated')
  parser.add_argument('--scratch', default='/tmp/tokjax-bench', help='local disk for the corpora')
  parser.add_argument('--out', default=None, help='also write the rows as JSON here')
  parser.add_argument(
      '--in_memory_max_bytes',
      type=float,
      default=0,
      help='also time the in-memory path (corpus = the source folder) up to this size',
  )
  parser.add_argument('--first_step', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--t0', type=float, default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.first_step:
    print(json.dumps(first_step(args.first_step, args.t0 or time.time())))
    return 0
  rows = []
  for size in (int(float(s)) for s in args.sizes.split(',')):
    source, prepared = os.path.join(args.scratch, 'source'), os.path.join(args.scratch, 'prepared')
    shutil.rmtree(args.scratch, ignore_errors=True)
    try:
      write_synthetic(source, size)
      t = time.time()
      subprocess.run(
          [sys.executable, '-m', 'tokjax.data.prepare', source, '--out', prepared, '--no_progress'],
          check=True,
      )
      prepare_s = time.time() - t
      with open(os.path.join(prepared, 'manifest.json')) as f:
        manifest = json.load(f)
      row = dict(
          corpus_bytes=size,
          prepare_command_s=round(prepare_s, 1),
          prepare_mb_per_s=round(manifest['prepare_bytes_per_s'] / 1e6, 2),
          prepared=_first_step_row(f'prepared:{prepared}'),
      )
      if size <= args.in_memory_max_bytes:
        row['in_memory'] = _first_step_row(source)
    finally:
      shutil.rmtree(args.scratch, ignore_errors=True)
    print(json.dumps(row), flush=True)
    rows.append(row)
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
