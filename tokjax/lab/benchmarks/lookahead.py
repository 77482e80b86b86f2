r"""How often each boundary method's boundary at byte t changes once bytes after t are known.

  python -m tokjax.lab.benchmarks.lookahead [--corpus shakespeare] [--seq_len 64] [--windows 16]
      [--methods bpe,bpe_oracle] [--run DIR]

For every registered method (or --methods), the model of `configs/compare.py:METHOD,tiny` at
initialisation (seed 0) reads --windows windows of the corpus's test split (BOS then seq_len - 1
bytes, cut one after another from its first documents), and for each position t compares its greedy
boundaries (every stage, on bytes) drawn from the whole window with those drawn from the window cut
after t (PAD after t): what a generator knows at t. It prints the share of positions 1 .. seq_len - 2
(BOS and the convention's forced last boundary left out) where they differ. A method whose registry
entry has lookahead=False must print 0; one with lookahead=True shows how much it reads ahead. The
rule-based methods need no training; --run DIR measures a trained run instead (its config and
weights; --corpus still picks the text). BPE methods fit (or read from the cache) their tokenizer on
the corpus's training split first.

  python -m tokjax.lab.benchmarks.lookahead --step_time [--corpus shakespeare]

instead times configs/compare.py:bpe (B = 16, L = 256) on this machine: the median over 10 steps
of one training step, and of the host computation of its boundaries alone (`bpe.starts` on the
same batch, what the step's callback runs), after one compiling step.
"""

import time

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tokjax import cli, inspection, models, sharding, stages
from tokjax import trainer as trainer_lib
from tokjax.config import files as config_files
from tokjax.data import pipeline
from tokjax.models import interface, registry
from tokjax.models.rivals import bpe
from tokjax.vocab import BOS_ID, PAD_ID

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CORPUS = flags.DEFINE_string('corpus', 'shakespeare', 'Corpus whose test split is read.')
  _SEQ_LEN = flags.DEFINE_integer('seq_len', 64, 'Positions per window (BOS included).')
  _WINDOWS = flags.DEFINE_integer('windows', 16, 'Windows of the test split.')
  _METHODS = flags.DEFINE_list('methods', None, 'Methods to measure (default: every registered).')
  _RUN = flags.DEFINE_string('run', None, 'A trained run folder to measure instead of --methods.')
  _STEP_TIME = flags.DEFINE_bool('step_time', False, "Time configs/compare.py:bpe's step instead.")


def windows(docs, seq_len: int, count: int) -> np.ndarray:
  """int32[count, seq_len]: BOS then seq_len - 1 bytes, cut one after another from docs."""
  text = b''
  for d in docs:
    text += d
    if len(text) >= count * (seq_len - 1):
      break
  rows = [
      [BOS_ID] + list(text[i * (seq_len - 1) : (i + 1) * (seq_len - 1)])
      for i in range(len(text) // (seq_len - 1))
  ][:count]
  return np.asarray(rows, np.int32)


def disagreement(model, params, rows: np.ndarray, key) -> np.ndarray:
  """float[S]: per stage, the share of positions 1 .. L - 2 whose greedy boundary from the whole row
  differs from the one drawn from the row cut after that position."""
  l = rows.shape[1]

  @jax.jit
  def levels(tokens):
    out = model.apply(params, tokens, key, mode='greedy')
    return interface.levels_on_bytes(out)

  cut = np.arange(l)[:, None] < np.arange(l)[None, :]  # cut[t, s]: position s lies after t.
  differ = []
  for row in rows:
    # L copies of the row, so that row t of both batches gets the same random draws (a draw
    # depends on the key and the batch's shape: 'uniform' draws even in greedy mode).
    copies = np.repeat(row[None, :], l, axis=0)
    whole = np.asarray(levels(jnp.asarray(copies)))[np.arange(l), :, np.arange(l)].T  # [S, L]
    prefixes = np.where(cut, PAD_ID, copies).astype(np.int32)  # Row t: the row cut after t.
    seen = np.asarray(levels(jnp.asarray(prefixes)))  # [L, S, L]
    at_t = seen[np.arange(l), :, np.arange(l)].T  # [S, L]: each prefix's decision at its own end.
    differ.append((whole != at_t)[:, 1 : l - 1])
  return np.mean(np.stack(differ), axis=(0, 2))


def _model_at_init(method: str, corpus: str, seq_len: int):
  c = config_files.load('compare', f'{method},tiny')
  c.data.corpus, c.data.seq_len = corpus, seq_len
  model = models.build_model(c, levels=stages.resolve(c))
  tokens = jnp.full((1, seq_len), BOS_ID, jnp.int32)
  params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), tokens, jax.random.PRNGKey(1)))
  return c, model, params


def step_time(corpus: str, steps: int = 10) -> dict:
  """{'step_ms', 'boundaries_ms'}: medians over `steps` training steps of configs/compare.py:bpe on
  corpus, and of `bpe.starts` on the same batches."""
  c = config_files.load('compare', 'bpe')
  c.data.corpus = corpus
  mesh = sharding.make_mesh(c.mesh)
  trainer = trainer_lib.Trainer(c, mesh)
  state = trainer.init(jax.random.PRNGKey(0))
  b, l = c.data.batch_size, c.data.seq_len
  rows = windows(pipeline.load_splits(c.data)['train'], l, b * (steps + 1))
  tok = bpe._load(bpe.cached_tokenizer_json(c, trainer.levels[0]))  # pylint: disable=protected-access
  step_s, host_s = [], []
  for i in range(steps + 1):
    inputs = rows[i * b : (i + 1) * b]
    batch = sharding.global_batch(
        {'inputs': inputs, 'targets': inputs, 'mask': np.ones(inputs.shape, np.float32)}, mesh
    )
    t0 = time.perf_counter()
    state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(i))
    jax.block_until_ready(metrics)
    t1 = time.perf_counter()
    bpe.starts(tok, inputs, c.boundary.bpe.context)
    t2 = time.perf_counter()
    if i:  # Step 0 compiles.
      step_s.append(t1 - t0)
      host_s.append(t2 - t1)
  return {
      'step_ms': 1e3 * float(np.median(step_s)),
      'boundaries_ms': 1e3 * float(np.median(host_s)),
  }


def main(argv):
  del argv
  if _STEP_TIME.value:
    found = step_time(_CORPUS.value)
    print(
        f'configs/compare.py:bpe on {_CORPUS.value}, B = 16, L = 256, {jax.devices()[0].platform}: '
        f'training step {found["step_ms"]:.1f} ms, of which the boundaries\' host computation alone '
        f'takes {found["boundaries_ms"]:.1f} ms (medians of 10 steps)'
    )
    return
  key = jax.random.PRNGKey(0)
  if _RUN.value:
    ckpt = inspection.load_checkpoint(_RUN.value)
    c = ckpt.config.copy_and_resolve_references()
    c.data.corpus = _CORPUS.value
    method = ckpt.levels[0].method
    cases = [(f'{method} ({_RUN.value})', c, ckpt.model, {'params': ckpt.params})]
    lookahead = [registry.get(method).lookahead]
  else:
    names = _METHODS.value or list(registry.methods())
    cases = [(m, *_model_at_init(m, _CORPUS.value, _SEQ_LEN.value)) for m in names]
    lookahead = [registry.get(m).lookahead for m in names]
  rows = windows(pipeline.load_splits(cases[0][1].data)['test'], _SEQ_LEN.value, _WINDOWS.value)
  print(
      f'greedy boundaries, whole window vs cut after t: share of positions that differ '
      f'({len(rows)} windows of {_SEQ_LEN.value} positions, {_CORPUS.value} test split)'
  )
  for (name, _, model, params), ahead in zip(cases, lookahead):
    shares = disagreement(model, params, rows, key)
    levels = ' '.join(f'stage {s}: {x:.4f}' for s, x in enumerate(shares))
    print(f'  {name:<12} {levels}   (registry lookahead={ahead})', flush=True)


if __name__ == '__main__':
  cli.run(main)
