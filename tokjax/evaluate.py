r"""Evaluate a trained checkpoint: bits-per-byte per document and per corpus, and boundary quality.

  python -m tokjax.evaluate --checkpoint DIR [--corpus SPEC] [--split test] [--out FILE_PREFIX]

Reads the run folder DIR (config.train.workdir of `python -m tokjax.train`), rebuilds the model from the
config saved with the checkpoint and evaluates the split (of the saved corpus, or of --corpus, split
the same way) with sampled and with greedy boundaries. Writes FILE_PREFIX.json and FILE_PREFIX.md
(default DIR/eval_<split>):
  - bpb pooled over bytes, with its standard error by the ratio estimator over documents;
  - doc_bpb: the mean over documents of each document's own bpb, every document cut to its first
    seq_len - 1 bytes and scored alone in one row from BOS (the form of per-document test tables),
    with its standard error (s.d. over documents / sqrt(D)); `one_row_documents`;
  - reference_bpb: the split's bits per byte under gzip -9 and xz -9 and, on val and test, under
    PPMd and a byte n-gram LM that have seen the training split (`tokjax.data.baselines`, cached);
  - rate (boundaries per byte), a histogram of bytes per chunk;
  - boundary precision / recall / F1 against whitespace bytes and against BPE token starts (a byte-level
    BPE tokenizer trained on the train split to about the target rate by
    `tokjax.models.rivals.bpe.fit_tokenizer`);
  - for a model with S > 1 stages, a table with one line per level and boundary mode: rate, bytes per
    chunk, whitespace precision / recall / F1 and line precision / recall of the chunk ends of every
    stage, and at stage s >= 1 the whitespace and line lift over stage s - 1 (its precision minus
    the chance level that stage s - 1's ends set; the report's stage{s}_* entries; see
    `tokjax.evaluator`).
The statistics and their exact definitions are `tokjax.evaluator`'s, the same code the trainer's
validation runs: with the same key and, by default, the saved config's eval.max_batches of val
batches, `--split val` reproduces the trainer's own val bpb exactly (--max_batches=0: the whole
split).
The checkpoint is restored by `tokjax.inspection.load_checkpoint`: a damaged latest step is reported
and the previous one used, unless --step demands one.
"""

import json
import os

from absl import flags
import numpy as np

from tokjax import cli, evaluator, inspection, paths, significance, stages
from tokjax.data import baselines, compression, pipeline
from tokjax.errors import UserError

# --------------------------------------------------------------------------------- BPE reference


def bpe_token_starts(tokenizer, doc: bytes) -> np.ndarray:
  """bool[len(doc)]: True at the first byte of each BPE token of doc."""
  starts = np.zeros(len(doc), bool)
  for begin, end in tokenizer.encode(doc.decode('latin-1')).offsets:
    if end > begin:
      starts[begin] = True
  return starts


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
  ref = report.get('reference_bpb')
  if ref:
    how = (
        f" (PPMd of order {ref['ppmd_order']} primed with the train split, an interpolated "
        f"Witten-Bell byte {ref['ngram_order']}-gram fitted on it; orders chosen on val)"
        if 'ppmd' in ref
        else ''
    )
    lines += [
        'Classical references on the same split (its first '
        f'{compression.SPLIT_MAX_BYTES // 2**20} MiB at most), bits per byte: '
        f'{baselines.describe(ref)}{how}.',
        '',
    ]
  modes = report['modes']
  lines += [
      f'| boundaries | bpb (pooled over bytes) {significance.SE_LABEL} | per-document bpb '
      '(documents cut to seq_len - 1 bytes, mean +- s.e.) | rate | bytes/chunk | '
      'ws P / R / F1 | BPE P / R / F1 |',
      '|---|---|---|---|---|---|---|',
  ]

  def prf(m, name):
    if f'{name}_f1' not in m:
      return '-'
    return ' / '.join(f"{m[f'{name}_{k}']:.3f}" for k in ('precision', 'recall', 'f1'))

  for mode, m in modes.items():
    lines.append(
        f"| {mode} | {m['bpb']:.4f} +- {m['bpb_se']:.4f} | "
        f"{m.get('doc_bpb', float('nan')):.4f} +- {m.get('doc_bpb_se', float('nan')):.4f} | "
        f"{m.get('rate', float('nan')):.3f} | {m.get('bytes_per_chunk', float('nan')):.2f} | "
        f"{prf(m, 'whitespace')} | {prf(m, 'bpe')} |"
    )
  if report.get('stages', 1) > 1:
    lines += [
        '',
        'Boundaries per level (rate: chunk ends per byte at stage 0, per chunk of stage s - 1 at '
        'stage s):',
        '',
        '| boundaries | stage | rate | bytes/chunk | ws P / R / F1 | line P / R | ws / line lift '
        'over the stage below (P minus its P, unforced ends, +- s.e. over documents) |',
        '|---|---|---|---|---|---|---|',
    ]
    for mode, m in modes.items():
      for s in range(report['stages']):
        p = f'stage{s}_' if s else ''
        ws = ' / '.join(f"{m[f'{p}whitespace_{k}']:.3f}" for k in ('precision', 'recall', 'f1'))
        line = ' / '.join(f"{m[f'{p}line_{k}']:.3f}" for k in ('precision', 'recall'))
        lift = ' / '.join(
            f"{m[f'{p}{name}_lift']:+.3f} +- {m[f'{p}{name}_lift_se']:.3f}"
            for name in evaluator.LIFT_REFERENCES
            if s
        )
        lines.append(
            f"| {mode} | {s} | {m[f'{p}rate']:.3f} | {m[f'{p}bytes_per_chunk']:.2f} | {ws} | "
            f"{line} | {lift or '-'} |"
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


def one_row_documents(docs, seq_len: int) -> list[bytes]:
  """The documents cut to seq_len - 1 bytes, each followed by empty documents so that every one
  starts a row of `pipeline.make_eval_batches` (BOS and the document fill at most one row of seq_len
  positions; an empty document is a lone BOS, which is never a target): each document is scored
  alone, from its start, as when documents are cut to the model's context."""
  out = []
  for d in docs:
    d = d[: seq_len - 1]
    out += [d] + [b''] * (seq_len - 1 - len(d))
  return out


def per_document_bpb(unit_ce, unit_bytes) -> tuple[float, float, int]:
  """(mean over documents of each one's bits-per-byte, its standard error s.d. / sqrt(D), D) from the
  Evaluator's per-document 'unit_ce' (nats) and 'unit_bytes'; documents without bytes left out."""
  ce, nbytes = np.asarray(unit_ce, np.float64), np.asarray(unit_bytes, np.float64)
  keep = nbytes > 0
  x = ce[keep] / nbytes[keep] / np.log(2)
  if not len(x):
    return float('nan'), float('nan'), 0
  se = float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float('nan')
  return float(x.mean()), se, len(x)


def has_tokenizers() -> bool:
  """Whether the optional `tokenizers` package (the BPE reference) can be imported."""
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  except ImportError:
    return False
  return True


def run_evaluation(
    checkpoint: str,
    *,
    corpus: str | None = None,
    split: str = 'test',
    out: str | None = None,
    max_batches: int | None = None,
    bpe: bool = True,
    step: int | None = None,
) -> dict:
  """Evaluates a run folder and writes OUT.json and OUT.md; returns the report dict.

  max_batches: eval batches at most (0: all); None: the saved config's eval.max_batches for the val
  split, the batches the trainer's val bpb was measured on, and all of them for train and test.
  """
  if split not in pipeline.SPLITS:
    raise UserError(f'--split={split!r} is not a split; use one of {pipeline.SPLITS}.')
  if max_batches is not None and max_batches < 0:
    raise UserError(f'--max_batches={max_batches} must be 0 (every batch) or more.')
  # A local path or URL prefix; checked before the work, not after it.
  out = os.fspath(paths.join(checkpoint, f'eval_{split}') if out is None else out)
  paths.check_writable(out, '--out', '.json')
  ckpt = inspection.load_checkpoint(checkpoint, step)
  config = ckpt.config
  if max_batches is None:
    max_batches = config.eval.max_batches if split == 'val' else 0
  splits = load_split(config, corpus, split)
  docs = splits[split]
  bpe_info, starts = None, None
  has_boundaries = ckpt.model.num_stages > 0
  if bpe and has_boundaries and not has_tokenizers():
    print('note: the `tokenizers` package is not installed: the BPE columns are skipped.')
  elif bpe and has_boundaries:
    from tokjax.models.rivals import bpe as bpe_rival  # pylint: disable=g-import-not-at-top

    target = ckpt.levels[0].target_rate
    tok, vocab, rate = bpe_rival.fit_tokenizer(splits['train'], splits['val'], target)
    bpe_info = {'vocab_size': vocab, 'rate': rate, 'target_rate': target}
    starts = [bpe_token_starts(tok, d) for d in docs]
  modes = ckpt.evaluator.run(
      ckpt.params,
      docs,
      inspection.eval_key(config),
      max_batches=max_batches or None,
      bpe_starts=starts,
  )
  # The form of the paper's table: each document cut to the context, its own bpb, averaged.
  seq_len = config.data.seq_len
  cut = ckpt.evaluator.run(
      ckpt.params,
      one_row_documents(docs, seq_len),
      inspection.eval_key(config),
      max_batches=max_batches or None,
  )
  for mode, m in modes.items():
    mean, se, n = per_document_bpb(cut[mode]['unit_ce'], cut[mode]['unit_bytes'])
    m.update(doc_bpb=mean, doc_bpb_se=se, doc_bpb_documents=n, doc_bpb_bytes=seq_len - 1)
  first = next(iter(modes.values()))
  report = {
      'checkpoint': paths.absolute(checkpoint),
      'step': ckpt.step,
      'split': split,
      'corpus': corpus or config.data.corpus,
      'stages': stages.count(config),
      'num_docs': first['documents'],
      'bytes': first['bytes'],
      'max_batches': max_batches,
      'bpe': bpe_info,
      'reference_bpb': baselines.reference(splits, split, config.data.data_dir or None),
      'modes': modes,
  }
  paths.resolve(out).parent.mkdir(parents=True, exist_ok=True)
  paths.write_text(out + '.json', json.dumps(report, indent=1))
  paths.write_text(out + '.md', to_markdown(report))
  report['paths'] = (out + '.json', out + '.md')
  return report


def define_flags():
  """The command-line flags (defined only when this module is the entry point, so that the other
  tools can import it without clashing flag names)."""
  flags.DEFINE_string('checkpoint', None, 'Run folder of a training run (its workdir).')
  flags.DEFINE_string('corpus', None, "Corpus spec to evaluate on (default: the run's).")
  flags.DEFINE_string('split', 'test', 'Split: train | val | test.')
  flags.DEFINE_string('out', None, 'Output prefix for .json and .md (default DIR/eval_SPLIT).')
  flags.DEFINE_integer(
      'max_batches',
      None,
      "Evaluate at most this many batches (0: all; default: the saved config's eval.max_batches "
      'for --split val, as the trainer validates, else all).',
      lower_bound=0,
  )
  flags.DEFINE_integer(
      'step',
      None,
      'Checkpoint step that must load (default: the latest step that loads).',
      lower_bound=0,
  )
  flags.DEFINE_bool('bpe', True, 'Score boundaries against BPE token starts (trains a BPE).')


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.checkpoint:
    raise UserError('--checkpoint is required: pass the run folder of a training run.')
  report = run_evaluation(
      f.checkpoint,
      corpus=f.corpus,
      split=f.split,
      out=f.out,
      max_batches=f.max_batches,
      bpe=f.bpe,
      step=f.step,
  )
  print(to_markdown(report))
  print('wrote', *report['paths'])


if __name__ == '__main__':
  define_flags()
  cli.run(main)
