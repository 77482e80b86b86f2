r"""Train every boundary method at the same parameter count, target rate and byte budget, and compare.

  python -m tokjax.lab.compare --corpus shakespeare --bytes 2e6 --out results/compare/shakespeare

Methods: the variants of configs/compare.py, i.e. every boundary method of the registry
(tokjax/models/registry.py: 'policy', the score-function method, and the rivals) and 'flat' (its layer
count chosen to match the hierarchical parameter count); `python -m tokjax.lab.compare
--helpfull` lists them. Each trains with `tokjax.train.train` for
steps = bytes / (batch * seq_len) in its own workdir OUT/METHOD (its console output goes to
OUT/METHOD/train.log); a method whose OUT/METHOD/result.json exists is not retrained. Then the last
checkpoint is evaluated per document on val and test (bits-per-byte with the standard error over
documents, boundaries sampled as in training) and OUT gets:
  results.md, results.json   the table (+ the exact command)
  curves.png                 val bits-per-byte against training bytes, per method
  segmentations.md           one held-out paragraph segmented by every method (greedy boundaries)
  heatmap.png                boundary probabilities of every method on that paragraph
"""

import contextlib
import json
import math
import os
import shutil
import sys
import time

from absl import flags, logging
import jax
import numpy as np

from tokjax import checkpointing, cli, config_defaults, evaluation, models, segmentation
from tokjax import train as train_lib
from tokjax.data import pipeline
from tokjax.errors import UserError
from tokjax.metric_writers import read_metrics


def method_names() -> tuple[str, ...]:
  """The variants of configs/compare.py: every registered boundary method, then 'flat'."""
  return tuple(config_defaults.load_module('compare').VARIANTS)


def variant_config(method: str, corpus: str, tiny: bool, seed: int = 0):
  """configs/compare.py:METHOD[,tiny] with the command's corpus and seed (before budget and workdir)."""
  c = config_defaults.load('compare', f'{method},tiny' if tiny else method)
  c.data.corpus = corpus
  c.seed = seed
  return c


if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CORPUS = flags.DEFINE_string(
      'corpus', 'shakespeare', 'Corpus spec (see tokjax/data/corpora.py).'
  )
  _BYTES = flags.DEFINE_float(
      'bytes', 2e6, 'Training byte budget per method (steps = bytes / (B * L)).'
  )
  _OUT = flags.DEFINE_string('out', 'results/compare/run', 'Results folder.')
  _METHODS = flags.DEFINE_list(
      'methods', ','.join(method_names()), 'Methods to train, from ' + ','.join(method_names())
  )
  _TINY = flags.DEFINE_bool('tiny', False, 'Tiny model and eval (smoke tests).')
  _EVAL_DOCS = flags.DEFINE_integer(
      'eval_docs', 0, 'Evaluate at most this many val and test documents ' '(0 = all).'
  )
  _EVAL_DOC_BYTES = flags.DEFINE_integer(
      'eval_doc_bytes',
      0,
      'Evaluate at most this many bytes of each ' 'document (its start; 0 = whole documents).',
  )
  _EVAL_EVERY = flags.DEFINE_integer('evals', 4, 'Val evaluations during training (curve points).')
  _SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')


def param_count(config) -> int:
  model = models.build_model(config)
  shapes = jax.eval_shape(
      lambda k: model.init(k, *models.init_args(config, 1, config.data.seq_len)),
      jax.random.PRNGKey(0),
  )
  return sum(x.size for x in jax.tree.leaves(shapes['params']))


def match_flat_layers(flat_config, target: int) -> int:
  """The flat layer count (1..16) whose parameter count is closest to `target`."""

  def count(n):
    flat_config.model.num_layers = n
    return param_count(flat_config)

  return min(range(1, 17), key=lambda n: abs(count(n) - target))


def steps_for(budget: float, batch_size: int, seq_len: int) -> int:
  """Training steps that spend a byte budget at batch_size x seq_len bytes per step (at least 1)."""
  return max(1, round(budget / (batch_size * seq_len)))


def median_bytes_per_s(rows) -> float:
  """Median training bytes/s over a run's logged intervals (metrics.jsonl rows). The first interval
  includes compilation: it is left out when there is more than one; 0 when none was logged."""
  speeds = [r['bytes_per_s'] for r in rows if r['split'] == 'train' and 'bytes_per_s' in r]
  return float(np.median(speeds[1:] if len(speeds) > 1 else speeds)) if speeds else 0.0


def schedule(config, steps: int, evals: int) -> None:
  """Sets a run of `steps` steps in place: `evals` val evaluations, about 8 log lines, one
  checkpoint at the end; then validates the config."""
  config.train.steps = steps
  config.train.eval_every = max(1, steps // max(evals, 1))
  config.train.log_every = max(1, min(25, steps // 8))
  config.train.checkpoint_every = steps
  config_defaults.validate(config)


def capped(docs, max_docs: int, doc_bytes: int):
  """The first max_docs documents (0: all), each cut to its first doc_bytes bytes (0: whole)."""
  docs = docs[:max_docs] if max_docs else docs
  return [d[:doc_bytes] for d in docs] if doc_bytes else list(docs)


def evaluate_documents(ckpt, docs, key) -> dict:
  """`tokjax.evaluation` statistics of docs with sampled boundaries (as in training): bpb pooled over
  bytes with its ratio-estimator standard error over documents, and the boundary statistics."""
  return ckpt.evaluator.run(ckpt.params, docs, key, modes=('sample',))['sample']


def paragraph(docs, length: int) -> bytes:
  """A held-out passage: `length` bytes of the first test document, starting at a line start."""
  doc = docs[0]
  start = doc.find(b'\n', min(len(doc) // 3, 2000)) + 1
  return doc[start : start + length] if len(doc) - start >= length // 2 else doc[:length]


def run_method(method, config, out_dir):
  """Trains (unless OUT/METHOD/result.json exists) and evaluates one method -> result dict."""
  workdir = os.path.join(out_dir, method)
  result_path = os.path.join(workdir, 'result.json')
  if os.path.exists(result_path):
    with open(result_path) as f:
      return json.load(f)
  if os.path.isdir(workdir):
    shutil.rmtree(workdir)  # An unfinished earlier run of this command.
  os.makedirs(workdir)
  config.train.workdir = workdir
  log = os.path.join(workdir, 'train.log')
  t0 = time.time()
  with open(log, 'w') as f, contextlib.redirect_stdout(f):
    val = train_lib.train(config)
  wall = time.time() - t0
  speed = median_bytes_per_s(read_metrics(os.path.join(workdir, 'metrics.jsonl')))
  return {
      'method': method,
      'train_bytes_per_s': speed,
      'wall_s': wall,
      'final_val_sample_bpb': val.get('bpb'),
      'greedy_val_bpb': val.get('greedy_bpb'),
      'log': log,
  }


def evaluate_method(method, config, result, data_splits, key, eval_cap, passage):
  """Adds per-document val/test numbers, parameter count and the passage's boundaries to result."""
  del method
  ckpt = checkpointing.load_checkpoint(config.train.workdir)
  for i, split in enumerate(('val', 'test')):
    result[split] = evaluate_documents(
        ckpt, capped(data_splits[split], *eval_cap), jax.random.fold_in(key, i)
    )
  if ckpt.model.num_stages:
    shown, actions, probs = segmentation.boundaries_for(
        ckpt.model, ckpt.params, passage, config.data.seq_len, key, 'greedy'
    )
    result['passage'] = {  # Stage 0's boundaries; the rendering shows every level.
        'actions': [float(a) for a in actions[0]],
        'probs': [float(p) for p in probs[0]],
        'rendered': segmentation.render(shown, actions),
    }
  result['params'] = int(ckpt.trainer.num_params)
  return result


def fmt(x, digits=4):
  return '-' if x is None or (isinstance(x, float) and math.isnan(x)) else f'{x:.{digits}f}'


def write_outputs(out_dir, results, meta, passage):
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  with open(os.path.join(out_dir, 'results.json'), 'w') as f:
    json.dump({'meta': meta, 'methods': results}, f, indent=1)
  lines = [
      f'# Boundary methods compared on `{meta["corpus"]}`',
      '',
      'Command:',
      '',
      f'    {meta["command"]}',
      '',
      f'{meta["steps"]} steps of {meta["batch"]} x {meta["seq_len"]} bytes = {meta["train_bytes"]:.3g} '
      f'training bytes per method, target rate {meta["target_rate"]}. Bits-per-byte are pooled over '
      f'the bytes of the val/test documents, {evaluation.SE_LABEL} (boundaries sampled as in training) '
      f'documents (first {meta["eval_docs"] or "all"} documents, first {meta["eval_doc_bytes"] or "all"} '
      'bytes of each). Rate, bytes/chunk and whitespace fraction (fraction of '
      'whitespace bytes that end a chunk) are on test, sampled. Train B/s: median over log '
      'intervals (on the machine and cores the command ran on).',
      '',
      '| method | params | val bpb +- s.e. | test bpb +- s.e. | rate | bytes/chunk | ws fraction | '
      'train B/s | wall s |',
      '|---|---|---|---|---|---|---|---|---|',
  ]
  for r in results:
    t, v = r['test'], r['val']
    lines.append(
        f'| {r["method"]} | {r["params"]:,} | {fmt(v["bpb"])} +- {fmt(v["bpb_se"])} | '
        f'{fmt(t["bpb"])} +- {fmt(t["bpb_se"])} | {fmt(t.get("rate"), 3)} | '
        f'{fmt(t.get("bytes_per_chunk"), 2)} | {fmt(t.get("whitespace_recall"), 3)} | '
        f'{r["train_bytes_per_s"]:,.0f} | {r["wall_s"]:.0f} |'
    )
  lines += [
      '',
      f'Val/test documents: {results[0]["val"]["documents"]} / {results[0]["test"]["documents"]}.'
      ' Standard errors are per method; differences between methods on the same documents are '
      'paired, so compare them with care (see results.json for the per-method numbers).',
      '',
  ]
  with open(os.path.join(out_dir, 'results.md'), 'w') as f:
    f.write('\n'.join(lines))

  fig, ax = plt.subplots(figsize=(7, 4.2))
  for r in results:
    rows = [
        x
        for x in read_metrics(os.path.join(out_dir, r['method'], 'metrics.jsonl'))
        if x['split'] == 'val'
    ]
    ax.plot(
        [x['step'] * meta['batch'] * meta['seq_len'] for x in rows],
        [x['bpb'] for x in rows],
        marker='.',
        label=r['method'],
    )
  ax.set_xlabel('training bytes')
  ax.set_ylabel('val bits-per-byte (sampled boundaries)')
  ax.set_title(meta['corpus'])
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, 'curves.png'), dpi=110)
  plt.close(fig)

  hier = [r for r in results if 'passage' in r]
  seg = [
      f'# One held-out paragraph segmented by every method (`{meta["corpus"]}`)',
      '',
      'Greedy boundaries; `|` follows the last byte of each chunk.',
      '',
  ]
  for r in hier:
    seg += [f'## {r["method"]}', '', '```', r['passage']['rendered'], '```', '']
  with open(os.path.join(out_dir, 'segmentations.md'), 'w') as f:
    f.write('\n'.join(seg))
  if hier:
    n = min(len(hier[0]['passage']['probs']), 120)
    mat = np.array([r['passage']['probs'][:n] for r in hier])
    fig, ax = plt.subplots(figsize=(max(6, n * 0.13), 0.45 * len(hier) + 1.2))
    ax.imshow(mat, aspect='auto', cmap='viridis', vmin=0, vmax=1)
    ax.set_yticks(range(len(hier)), [r['method'] for r in hier])
    chars = [chr(c) if 32 < c < 127 else '·' for c in passage[:n]]
    ax.set_xticks(range(n), chars, fontsize=7, fontfamily='monospace')
    for i, r in enumerate(hier):
      for j, a in enumerate(r['passage']['actions'][:n]):
        if a > 0.5:
          ax.plot(j, i, 'w|', markersize=9)
    ax.set_title('boundary probability (white tick: greedy boundary)')
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, 'heatmap.png'), dpi=110)
    plt.close(fig)


def compare(
    corpus, total_bytes, out_dir, methods, tiny=False, eval_cap=(0, 0), evals=4, command='', seed=0
):
  """Runs the comparison; returns the list of per-method result dicts (also written to out_dir)."""
  known = method_names()
  bad = [m for m in methods if m not in known]
  if bad or not methods:
    raise UserError(f'unknown method(s) {bad}; --methods takes some of {",".join(known)}.')
  os.makedirs(out_dir, exist_ok=True)
  configs = {m: variant_config(m, corpus, tiny, seed) for m in methods}
  base = variant_config('policy', corpus, tiny, seed)
  steps = steps_for(total_bytes, base.data.batch_size, base.data.seq_len)
  hier_params = param_count(base)
  if 'flat' in configs:
    configs['flat'].model.num_layers = match_flat_layers(configs['flat'], hier_params)
  for c in configs.values():
    schedule(c, steps, evals)
  splits = pipeline.load_splits(base.data, corpus)
  passage = paragraph(splits['test'], base.data.seq_len - 1)
  key = jax.random.PRNGKey(1234)
  results = []
  for m in methods:
    print(f'[compare] {m}: training {steps} steps ({configs[m].model.kind})', flush=True)
    r = run_method(m, configs[m], out_dir)
    if 'test' not in r:
      r = evaluate_method(m, configs[m], r, splits, key, eval_cap, passage)
      with open(os.path.join(out_dir, m, 'result.json'), 'w') as f:
        json.dump(r, f)
    print(
        f'[compare] {m}: params {r["params"]:,} | test bpb '
        f'{evaluation.format_bpb(r["test"]["bpb"], r["test"]["bpb_se"])} | rate {r["test"].get("rate", 1.0):.3f} | '
        f'{r["train_bytes_per_s"]:,.0f} B/s | wall {r["wall_s"]:.0f}s',
        flush=True,
    )
    results.append(r)
  meta = {
      'corpus': corpus,
      'command': command,
      'steps': steps,
      'batch': base.data.batch_size,
      'seq_len': base.data.seq_len,
      'train_bytes': steps * base.data.batch_size * base.data.seq_len,
      'target_rate': float(base.boundary.target_rate),
      'hierarchical_params': hier_params,
      'flat_layers': configs['flat'].model.num_layers if 'flat' in configs else None,
      'tiny': tiny,
      'eval_docs': eval_cap[0],
      'eval_doc_bytes': eval_cap[1],
      'jax_devices': [str(d) for d in jax.devices()],
  }
  write_outputs(out_dir, results, meta, passage)
  return results


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save and restore at INFO.
  if _BYTES.value <= 0:
    raise UserError(f'--bytes={_BYTES.value} must be positive (e.g. --bytes 2e6).')
  command = 'python -m tokjax.lab.compare ' + ' '.join(sys.argv[1:])
  compare(
      _CORPUS.value,
      _BYTES.value,
      _OUT.value,
      _METHODS.value,
      _TINY.value,
      (_EVAL_DOCS.value, _EVAL_DOC_BYTES.value),
      _EVAL_EVERY.value,
      command,
      _SEED.value,
  )
  print(f'wrote {_OUT.value}/results.md, results.json, curves.png, segmentations.md, heatmap.png')


if __name__ == '__main__':
  cli.run(main)
