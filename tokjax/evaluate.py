r"""Evaluate a trained checkpoint: bits-per-byte per document and per corpus, and boundary quality.

  python -m tokjax.evaluate --checkpoint DIR [--corpus SPEC] [--split test] [--out FILE_PREFIX]

Reads the run folder DIR (config.train.workdir of `python -m tokjax.train`), rebuilds the model from the
config saved with the checkpoint and evaluates the split (of the saved corpus, or of --corpus, split
the same way) with sampled and with greedy boundaries. Writes FILE_PREFIX.json and FILE_PREFIX.md
(default DIR/eval_<split>):
  - bpb: corpus-level (all bytes pooled) and mean +- standard error over documents;
  - rate (boundaries per byte), a histogram of bytes per chunk;
  - boundary precision / recall / F1 against whitespace bytes and against BPE token starts (a byte-level
    BPE tokenizer trained on the train split to about the target rate by
    `tokjax.models.rivals.bpe.fit_tokenizer`; a boundary at t matches when byte t starts a token, the
    same shift as the BPE-guided rival).

Evaluation runs the eval batches of `tokjax.data.pipeline.make_eval_batches` (the packed stream of the
split, windows of seq_len bytes, the same layout and order as the trainer's validation) and tracks the
document of every target byte, so per-document figures are exact sums of the same per-byte CEs; with the
same key, `--split val` reproduces the trainer's own val bpb. Context crosses document starts exactly as
in training (the packed stream holds [BOS] + document for each document).

Boundary statistics count real input bytes only and leave out each window's first and last position,
whose boundaries are forced by the convention (see tokjax/models/boundaries.py), not chosen.
"""

import dataclasses
import json
import math
import os

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from tokjax import checkpointing, cli, config_defaults, losses, sharding, train_state
from tokjax.data import PAD_ID, pipeline
from tokjax.errors import UserError

HIST_MAX = 32  # Chunks of HIST_MAX bytes or more share the last histogram bin.


# ------------------------------------------------------------------------------------ checkpoints


@dataclasses.dataclass
class Checkpoint:
  """A restored run: its saved config, a Trainer rebuilt from it, the params and the step."""

  config: object
  trainer: train_state.Trainer
  params: dict
  step: int
  path: str
  forwards: dict = dataclasses.field(default_factory=dict, repr=False)  # Compiled once per mode.

  @property
  def model(self):
    return self.trainer.model


def _checkpoint_root(path: str) -> str:
  if not os.path.exists(path):
    raise UserError(
        f'checkpoint folder {path} does not exist; pass the run folder '
        '(config.train.workdir) of a training run.'
    )
  if not os.path.isdir(path):
    raise UserError(f'--checkpoint {path} is a file; pass the run folder (config.train.workdir).')
  sub = os.path.join(path, 'checkpoints')
  return sub if os.path.isdir(sub) else path


def _step_problem(step_dir: str) -> str | None:
  """Why a step folder is not a complete tokjax checkpoint, or None when it is."""
  if not os.path.exists(os.path.join(step_dir, 'commit_success.txt')):
    return 'has no commit_success.txt marker (the save did not finish)'
  for item in ('state', 'config'):
    if not os.path.isdir(os.path.join(step_dir, item)):
      return f'lacks its "{item}" item'
  return None


def inspection_mesh(config):
  """The run's own mesh when this machine's devices can form it, else all of them on the data axis.

  A run trained on a pod slice (say data 16 x fsdp 4) is often inspected on a workstation: inspection
  needs only the parameters, and the state restores onto any mesh (tests/test_sharding.py), so the
  layout falls back instead of failing. config.mesh is updated to the mesh used.
  """
  try:
    return sharding.make_mesh(config.mesh)
  except UserError as e:
    print(
        f"note: the run's mesh does not fit {jax.device_count()} device(s) here ({e}); "
        'using data=-1, fsdp=1, tensor=1.'
    )
    config.mesh.update(data=-1, fsdp=1, tensor=1)
    return sharding.make_mesh(config.mesh)


def load_checkpoint(path: str, step: int | None = None, mesh=None) -> Checkpoint:
  """Restores the params of `step` (default: latest) of the run folder `path`.

  Raises UserError when the folder is missing or empty, when the chosen step is partly written, and
  when the saved state does not fit the saved config (a config from another run).
  """
  root = _checkpoint_root(path)
  steps = sorted(
      int(d) for d in os.listdir(root) if d.isdigit() and os.path.isdir(os.path.join(root, d))
  )
  if not steps:
    raise UserError(
        f'{path} holds no checkpoint (no step folders in {root}); train first with '
        '`python -m tokjax.train --config.train.workdir=DIR`.'
    )
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise UserError(f'{path} has no checkpoint of step {step}; it has steps {steps}.')
  problem = _step_problem(os.path.join(root, str(step)))
  if problem:
    complete = [s for s in steps if not _step_problem(os.path.join(root, str(s)))]
    hint = (
        f'pass --step={complete[-1]} (complete steps: {complete})'
        if complete
        else 'no step in it is complete: train again'
    )
    raise UserError(f'checkpoint step {step} in {root} is partly written: it {problem}; {hint}.')
  config, mgr, _ = checkpointing.load_config(path)
  try:
    config_defaults.validate(config)
    mesh = inspection_mesh(config) if mesh is None else mesh
    trainer = train_state.Trainer(config, mesh)
  except (KeyError, AttributeError, TypeError) as e:
    raise UserError(
        f'the config saved in {path} does not describe a tokjax model ({e}); it may come '
        'from another version of tokjax: retrain with this one.'
    ) from None
  try:
    state, step = checkpointing.restore(mgr, trainer.abstract_state, step=step)
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    raise UserError(
        f'the state saved in {path} (step {step}) does not fit its saved config: '
        f'{str(e).splitlines()[0][:300]}. The folder mixes runs: use the run folder as '
        'written by one training run.'
    ) from None
  want = jax.tree.map(lambda x: x.shape, trainer.abstract_state.params)
  got = jax.tree.map(lambda x: x.shape, state.params)
  if want != got:
    raise UserError(
        f'the parameters saved in {path} (step {step}) have other shapes than its saved '
        'config builds; the folder mixes runs: use a folder written by one training run.'
    )
  return Checkpoint(config=config, trainer=trainer, params=state.params, step=int(step), path=path)


def eval_key(config):
  """The key the trainer evaluates with (train.train splits PRNGKey(seed) into init, train, eval)."""
  return jax.random.split(jax.random.PRNGKey(config.seed), 3)[2]


# --------------------------------------------------------------------------------- BPE reference


def bpe_token_starts(tokenizer, doc: bytes) -> np.ndarray:
  """bool[len(doc)]: True at the first byte of each BPE token of doc."""
  starts = np.zeros(len(doc), bool)
  for begin, end in tokenizer.encode(doc.decode('latin-1')).offsets:
    if end > begin:
      starts[begin] = True
  return starts


# ------------------------------------------------------------------------------------ evaluation


def document_ids(docs) -> np.ndarray:
  """int32[len(packed stream)]: the document each position of `pipeline.pack_documents(docs)` is in."""
  return np.repeat(np.arange(len(docs), dtype=np.int32), [len(d) + 1 for d in docs])


def eval_order(stream, seq_len: int, batch_size: int, max_batches: int | None) -> np.ndarray:
  """The example indices of `pipeline.make_eval_batches`, batch by batch (checked against it)."""
  order = np.random.default_rng(0).permutation(pipeline.num_examples(stream, seq_len))
  if max_batches is not None:
    order = order[: max_batches * batch_size]
  return order


def make_forward(model, kind: str, mode: str):
  """jit (params, inputs, targets, mask, key) -> (ce nats float32[B, L], actions, probs)."""

  def forward(params, inputs, targets, mask, key):
    if kind == 'flat':
      out = model.apply({'params': params}, inputs)
      actions = probs = jnp.zeros(inputs.shape)
    else:
      out = model.apply({'params': params}, inputs, key, mode=mode)
      actions, probs = out['boundaries'].actions, out['boundaries'].probs
    return losses.cross_entropy(out['logits'], targets) * mask, actions, probs

  return jax.jit(forward)


def _prf(hit, pred, ref) -> dict:
  p, r = hit / max(pred, 1), hit / max(ref, 1)
  return {'precision': p, 'recall': r, 'f1': 2 * p * r / max(p + r, 1e-12)}


def evaluate_docs(
    ckpt: Checkpoint,
    docs,
    key,
    modes=('sample', 'greedy'),
    batch_size=None,
    max_batches=None,
    bpe_starts=None,
) -> dict:
  """Evaluates documents (one split) with each boundary mode.

  bpe_starts: optional list of bool[len(doc)] per document (BPE token starts) to score against.
  Returns {mode: metrics} with bpb (corpus-level), bpb_doc_mean, bpb_doc_se, num_docs, bytes and,
  for a hierarchical model, rate, chunk_hist and whitespace / BPE precision, recall, F1.
  """
  config, seq_len = ckpt.config, ckpt.config.data.seq_len
  batch_size = batch_size or config.eval.batch_size
  hierarchical = config.model.kind == 'hierarchical'
  batches = pipeline.make_eval_batches(
      docs, seq_len=seq_len, batch_size=batch_size, max_batches=max_batches
  )
  stream = pipeline.pack_documents(docs)
  doc_of = document_ids(docs)
  order = eval_order(stream, seq_len, batch_size, max_batches)
  bpe_stream = None
  if bpe_starts is not None:
    bpe_stream = np.concatenate([np.concatenate([[False], s]) for s in bpe_starts])
  n = len(stream)
  results = {}
  for mode in (modes if hierarchical else ('sample',)):
    if mode not in ckpt.forwards:
      ckpt.forwards[mode] = make_forward(ckpt.model, config.model.kind, mode)
    forward = ckpt.forwards[mode]
    ce_doc, bytes_doc = np.zeros(len(docs)), np.zeros(len(docs))
    counts = dict(valid=0, bnd=0, ws=0, ws_hit=0, bpe=0, bpe_hit=0)
    hist = np.zeros(HIST_MAX + 1, np.int64)
    for i, batch in enumerate(batches):
      idx = order[i * batch_size : (i + 1) * batch_size]
      pos = idx[:, None] * seq_len + np.arange(seq_len)  # Stream position of each input byte.
      rows = len(idx)
      expected = np.where(pos + 1 < n, stream[np.minimum(pos + 1, n - 1)], PAD_ID)
      if not np.array_equal(expected, batch['targets'][:rows]):
        raise RuntimeError('eval_order no longer matches pipeline.make_eval_batches; update it.')
      ce, actions, probs = jax.device_get(
          forward(
              ckpt.params,
              batch['inputs'],
              batch['targets'],
              batch['mask'],
              jax.random.fold_in(key, i),
          )
      )
      ce, actions, mask = ce[:rows], actions[:rows], batch['mask'][:rows] > 0
      tdoc = doc_of[np.minimum(pos + 1, n - 1)]
      ce_doc += np.bincount(tdoc[mask], weights=ce[mask], minlength=len(docs))
      bytes_doc += np.bincount(tdoc[mask], minlength=len(docs))
      if not hierarchical:
        continue
      inputs = batch['inputs'][:rows]
      valid = inputs < 256
      valid[:, [0, -1]] = False  # Forced boundaries are the convention's, not the policy's.
      a = (actions > 0.5) & valid
      ws = np.isin(inputs, losses.WHITESPACE) & valid
      counts['valid'] += valid.sum()
      counts['bnd'] += a.sum()
      counts['ws'] += ws.sum()
      counts['ws_hit'] += (a & ws).sum()
      if bpe_stream is not None:
        ref = bpe_stream[np.minimum(pos, n - 1)] & valid & (pos < n)
        counts['bpe'] += ref.sum()
        counts['bpe_hit'] += (a & ref).sum()
      for row in a:
        lengths = np.diff(np.flatnonzero(row))
        hist += np.bincount(np.minimum(lengths, HIST_MAX), minlength=HIST_MAX + 1)
    seen = bytes_doc > 0
    doc_bpb = ce_doc[seen] / bytes_doc[seen] / math.log(2)
    m = {
        'bpb': float(ce_doc.sum() / max(bytes_doc.sum(), 1.0) / math.log(2)),
        'bpb_doc_mean': float(doc_bpb.mean()) if doc_bpb.size else float('nan'),
        'bpb_doc_se': (
            float(doc_bpb.std(ddof=1) / math.sqrt(doc_bpb.size))
            if doc_bpb.size > 1
            else float('nan')
        ),
        'num_docs': int(seen.sum()),
        'bytes': int(bytes_doc.sum()),
    }
    if hierarchical:
      m['rate'] = float(counts['bnd'] / max(counts['valid'], 1))
      m['bytes_per_chunk'] = 1.0 / m['rate'] if m['rate'] > 0 else None  # None: no free boundary.
      m['chunk_hist'] = {
          (f'{k}+' if k == HIST_MAX else str(k)): int(c) for k, c in enumerate(hist) if c
      }
      m['whitespace'] = _prf(counts['ws_hit'], counts['bnd'], counts['ws'])
      if bpe_stream is not None:
        m['bpe'] = _prf(counts['bpe_hit'], counts['bnd'], counts['bpe'])
    results[mode] = m
  return results


def load_split(config, corpus: str | None, split: str):
  """The documents of corpus (default: the checkpoint's) split as in training (config.data fractions
  and split_seed): {'train', 'val', 'test'} -> list[bytes]."""
  splits = pipeline.load_splits(config.data, corpus)
  if not splits[split]:
    raise UserError(
        f'the {split} split of {corpus or config.data.corpus!r} is empty; use a bigger corpus.'
    )
  return splits


def to_markdown(report: dict) -> str:
  """A human-readable summary of `run_evaluation`'s report."""
  lines = [
      f"# Evaluation of {report['checkpoint']} (step {report['step']})",
      '',
      f"Split `{report['split']}` of corpus `{report['corpus']}`: {report['num_docs']} documents, "
      f"{report['bytes']} bytes.",
      '',
  ]
  modes = report['modes']
  lines += [
      '| boundaries | bpb (corpus) | bpb (doc mean +- s.e.) | rate | bytes/chunk | '
      'ws P / R / F1 | BPE P / R / F1 |',
      '|---|---|---|---|---|---|---|',
  ]
  for mode, m in modes.items():
    prf = lambda d: f"{d['precision']:.3f} / {d['recall']:.3f} / {d['f1']:.3f}" if d else '-'
    lines.append(
        f"| {mode} | {m['bpb']:.4f} | {m['bpb_doc_mean']:.4f} +- {m['bpb_doc_se']:.4f} | "
        f"{m.get('rate', float('nan')):.3f} | {m.get('bytes_per_chunk') or float('nan'):.2f} | "
        f"{prf(m.get('whitespace'))} | {prf(m.get('bpe'))} |"
    )
  if report.get('bpe'):
    b = report['bpe']
    lines += [
        '',
        f"BPE reference: byte-level BPE, vocabulary {b['vocab_size']}, trained on the train "
        f"split; {b['rate']:.3f} tokens per byte on val (target rate {b['target_rate']}).",
    ]
  for mode, m in modes.items():
    if 'chunk_hist' in m:
      total = max(sum(m['chunk_hist'].values()), 1)
      lines += [
          '',
          f'Bytes per chunk, {mode} boundaries (chunks between two free boundaries):',
          '',
          '| bytes | share |',
          '|---|---|',
      ]
      lines += [f'| {k} | {c / total:.3f} |' for k, c in m['chunk_hist'].items()]
  return '\n'.join(lines) + '\n'


def run_evaluation(
    checkpoint: str,
    corpus: str | None = None,
    split: str = 'test',
    out: str | None = None,
    max_batches: int = 0,
    bpe: bool = True,
    step: int | None = None,
) -> dict:
  """Evaluates a run folder and writes OUT.json and OUT.md; returns the report dict."""
  if split not in pipeline.SPLITS:
    raise UserError(f'--split={split!r} is not a split; use one of {pipeline.SPLITS}.')
  ckpt = load_checkpoint(checkpoint, step)
  config = ckpt.config
  splits = load_split(config, corpus, split)
  docs = splits[split]
  bpe_info, starts = None, None
  if bpe and config.model.kind == 'hierarchical':
    from tokjax.models.rivals import bpe as bpe_rival  # pylint: disable=g-import-not-at-top

    tok, vocab, rate = bpe_rival.fit_tokenizer(
        splits['train'], splits['val'], config.boundary.target_rate
    )
    bpe_info = {'vocab_size': vocab, 'rate': rate, 'target_rate': config.boundary.target_rate}
    starts = [bpe_token_starts(tok, d) for d in docs]
  modes = evaluate_docs(
      ckpt, docs, eval_key(config), max_batches=max_batches or None, bpe_starts=starts
  )
  first = next(iter(modes.values()))
  report = {
      'checkpoint': os.path.abspath(checkpoint),
      'step': ckpt.step,
      'split': split,
      'corpus': corpus or config.data.corpus,
      'num_docs': first['num_docs'],
      'bytes': first['bytes'],
      'max_batches': max_batches,
      'bpe': bpe_info,
      'modes': modes,
  }
  out = out or os.path.join(checkpoint, f'eval_{split}')
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + '.json', 'w') as f:
    json.dump(report, f, indent=1)
  with open(out + '.md', 'w') as f:
    f.write(to_markdown(report))
  report['paths'] = (out + '.json', out + '.md')
  return report


def define_flags():
  """The command-line flags (defined only when this module is the entry point, so that the other
  tools can import it without clashing flag names)."""
  flags.DEFINE_string('checkpoint', None, 'Run folder of a training run (its workdir).')
  flags.DEFINE_string('corpus', None, "Corpus spec to evaluate on (default: the run's).")
  flags.DEFINE_string('split', 'test', 'Split: train | val | test.')
  flags.DEFINE_string('out', None, 'Output prefix for .json and .md (default DIR/eval_SPLIT).')
  flags.DEFINE_integer('max_batches', 0, 'Evaluate at most this many batches (0: all).')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_bool('bpe', True, 'Score boundaries against BPE token starts (trains a BPE).')


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.checkpoint:
    raise UserError('--checkpoint is required: pass the run folder of a training run.')
  report = run_evaluation(f.checkpoint, f.corpus, f.split, f.out, f.max_batches, f.bpe, f.step)
  print(to_markdown(report))
  print('wrote', *report['paths'])


if __name__ == '__main__':
  define_flags()
  cli.run(main)
