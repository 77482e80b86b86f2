r"""Train every boundary method at the same parameter count, target rate and byte budget, and compare.

  python -m tokjax.lab.compare --corpus shakespeare --bytes 2e6 --out results/compare/shakespeare

Methods: the variants of configs/compare.py, i.e. every boundary method of the registry
(tokjax/models/registry.py: 'policy', the score-function method, and the rivals) and 'flat' (its layer
count chosen to match the hierarchical parameter count); `python -m tokjax.lab.compare
--helpfull` lists them. Each trains with `tokjax.train.train` for
steps = bytes / (batch * seq_len) in its own workdir OUT/METHOD (its console output goes to
OUT/METHOD/train.log); a method whose OUT/METHOD/result.json exists is not retrained. Then the last
checkpoint is evaluated on val and test (bits-per-byte with the standard error over documents,
boundaries sampled as in training, per window of UNIT_BYTES bytes of each document) and OUT gets:
  results.md, results.json   the table (+ the exact command) and every method's paired difference
                             to the policy (`paired_rows`: per window, clustered by document)
  curves.png                 val bits-per-byte against training bytes, per method
  segmentations.md           one held-out paragraph segmented by every method (greedy boundaries)
  heatmap.png                boundary probabilities of every method on that paragraph
"""

import os
import sys

from absl import flags, logging
import jax
import numpy as np

from tokjax import cli, significance
from tokjax.data import pipeline
from tokjax.errors import UserError
from tokjax.lab import common
from tokjax.lab.common import fmt
from tokjax.metric_writers import read_metrics

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CORPUS = flags.DEFINE_string(
      'corpus', 'shakespeare', 'Corpus spec (see tokjax/data/corpora.py).'
  )
  _BYTES = flags.DEFINE_float(
      'bytes', 2e6, 'Training byte budget per method (steps = bytes / (B * L)).'
  )
  _OUT = flags.DEFINE_string('out', 'results/compare/run', 'Results folder.')
  _METHODS = flags.DEFINE_list(
      'methods',
      ','.join(common.method_names()),
      'Methods to train, from ' + ','.join(common.method_names()),
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


UNIT_BYTES = 2048  # Paired units: windows of this many bytes of each document.


def paired_rows(results, docs_by_split, reference='policy') -> list[dict]:
  """Each method minus `reference` on the same val/test windows, clustered by document, judged by
  `significance.judge` with one seed (`common.paired_one_seed`) and Holm-adjusted over the
  methods of each split (one family a split): one dict per (method, split)."""
  by = {r['method']: r for r in results}
  if reference not in by:
    return []
  rows = [
      {'method': r['method'], 'reference': reference, 'split': split}
      | common.paired_one_seed(r[split], by[reference][split], docs, r.get('unit_bytes', 0))
      for r in results
      if r['method'] != reference
      for split, docs in docs_by_split.items()
  ]
  return common.judge_families(rows, lambda p: f'{p["split"]} vs {reference}')


def write_outputs(out_dir, results, meta, passage, paired=()):
  """results.md / results.json (the table), curves.png, segmentations.md and heatmap.png."""
  lines = [
      f'# Boundary methods compared on `{meta["corpus"]}`',
      '',
      'Command:',
      '',
      f'    {meta["command"]}',
      '',
      f'{meta["steps"]} steps of {meta["batch"]} x {meta["seq_len"]} bytes = {meta["train_bytes"]:.3g} '
      f'training bytes per method, target rate {meta["target_rate"]}. Bits-per-byte are pooled over '
      f'the bytes of the val/test documents, {significance.SE_LABEL} (boundaries sampled as in training) '
      f'documents (first {meta["eval_docs"] or "all"} documents, first {meta["eval_doc_bytes"] or "all"} '
      'bytes of each). Rate, bytes/chunk and whitespace fraction (fraction of '
      'whitespace bytes that end a chunk) are on test, sampled. Train B/s: median over log '
      'intervals (on the machine and cores the command ran on).',
      '',
      *common.table(
          'method | params | val bpb +- s.e. | test bpb +- s.e. | rate | bytes/chunk | '
          'ws fraction | train B/s | wall s',
          (
              f'{r["method"]} | {r["params"]:,} | {fmt(v["bpb"])} +- {fmt(v["bpb_se"])} | '
              f'{fmt(t["bpb"])} +- {fmt(t["bpb_se"])} | {fmt(t.get("rate"), 3)} | '
              f'{fmt(t.get("bytes_per_chunk"), 2)} | {fmt(t.get("whitespace_recall"), 3)} | '
              f'{r["train_bytes_per_s"]:,.0f} | {r["wall_s"]:.0f}'
              for r, v, t in ((r, r['val'], r['test']) for r in results)
          ),
      ),
      '',
      f'Val/test documents: {results[0]["val"]["documents"]} / {results[0]["test"]["documents"]}.'
      ' Standard errors are per method; differences between methods on the same bytes are paired '
      '(next table).',
      '',
  ]
  if paired:
    lines += [
        f'## Paired differences to {paired[0]["reference"]}',
        '',
        f'Method minus {paired[0]["reference"]} in bits-per-byte on the same bytes, paired per '
        f'window of {UNIT_BYTES} bytes of each document, with the standard error over windows and '
        'over documents (clustered: the window differences summed per document; ratio estimator). '
        f'A difference is {significance.RULE}.',
        '',
        *common.table(
            'method | split | windows | documents | difference (bpb) | window s.e. | '
            'clustered s.e. | df | p | p (Holm) | verdict',
            (
                f'{p["method"]} | {p["split"]} | {p["units"]} | {p["clusters"]} | '
                f'{p["diff"]:+.4f} | {fmt(p["se"])} | {fmt(p["clustered_se"])} | {fmt(p["df"], 1)} | '
                f'{significance.format_p(p["p"])} | {significance.format_p(p["p_holm"])} | '
                f'{p["verdict"]}'
                for p in paired
            ),
        ),
        '',
    ]
  common.write_results(out_dir, {'meta': meta, 'methods': results, 'paired': list(paired)}, lines)
  plt = common.pyplot()

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
  common.save_figure(fig, os.path.join(out_dir, 'curves.png'))

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
    common.save_figure(fig, os.path.join(out_dir, 'heatmap.png'))


def compare(
    corpus, total_bytes, out_dir, methods, tiny=False, eval_cap=(0, 0), evals=4, command='', seed=0
):
  """Runs the comparison; returns the list of per-method result dicts (also written to out_dir)."""
  known = common.method_names()
  bad = [m for m in methods if m not in known]
  if bad or not methods:
    raise UserError(f'unknown method(s) {bad}; --methods takes some of {",".join(known)}.')
  os.makedirs(out_dir, exist_ok=True)
  configs = {m: common.compare_config(m, corpus, tiny, seed) for m in methods}
  base = common.compare_config('policy', corpus, tiny, seed)
  steps = common.steps_for(total_bytes, base.data.batch_size, base.data.seq_len)
  hier_params = common.param_count(base)
  if 'flat' in configs:
    configs['flat'].model.num_layers = common.match_flat_layers(configs['flat'], hier_params)
  for c in configs.values():
    common.schedule(c, steps, evals)
  splits = pipeline.load_splits(base.data, corpus)
  passage = common.paragraph(splits['test'], base.data.seq_len - 1)
  key = jax.random.PRNGKey(1234)
  results = []
  for m in methods:
    print(f'[compare] {m}: training {steps} steps ({configs[m].model.kind})', flush=True)
    r = common.train_or_load(m, configs[m], out_dir)
    if 'test' not in r:
      r = common.evaluate_splits(
          os.path.join(out_dir, m), r, splits, key, eval_cap, passage, unit_bytes=UNIT_BYTES
      )
      r['unit_bytes'] = UNIT_BYTES
      common.save_result(out_dir, m, r)
    print(
        f'[compare] {m}: params {r["params"]:,} | test bpb '
        f'{significance.format_bpb(r["test"]["bpb"], r["test"]["bpb_se"])} | rate {r["test"].get("rate", 1.0):.3f} | '
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
  docs = {s: common.capped(splits[s], *eval_cap) for s in ('val', 'test')}
  write_outputs(out_dir, results, meta, passage, paired_rows(results, docs))
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
