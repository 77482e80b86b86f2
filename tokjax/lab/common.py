"""What every experiment of the lab does: train or load a run, evaluate it, write its results.

An experiment trains each of its runs with `tokjax.train.train` in its own folder (`train_or_load`,
reused when its result.json exists), scores the last checkpoint on documents through the library's
one evaluator (`evaluate_documents`, `evaluate_splits`), and writes one results table as markdown
and JSON (`write_results`, cells from `fmt`, rows from `table`) beside its plot (`pyplot`,
`save_figure`). The configs of configs/compare.py (`method_names`, `compare_config`) and the budget
arithmetic (`steps_for`, `schedule`) are shared by the experiments that train those methods.
"""

import contextlib
import json
import math
import os
import shutil
import time

import jax
import numpy as np

from tokjax import checkpointing, inspection, models, significance, stages, tokenization
from tokjax import train as train_lib
from tokjax.config import files as config_files
from tokjax.config import validation as config_validation
from tokjax.metric_writers import read_metrics

# -- configs and budgets ---------------------------------------------------------------------------


def method_names() -> tuple[str, ...]:
  """The variants of configs/compare.py: every registered boundary method, then 'flat'."""
  return tuple(config_files.load_module('compare').VARIANTS)


def compare_config(method: str, corpus: str, tiny: bool, seed: int = 0):
  """configs/compare.py:METHOD[,tiny] with the command's corpus and seed (before budget and
  workdir)."""
  c = config_files.load('compare', f'{method},tiny' if tiny else method)
  c.data.corpus = corpus
  c.seed = seed
  return c


def param_count(config) -> int:
  """Parameters of the model `config` builds (shapes only: nothing is initialised)."""
  model = models.build_model(config, levels=stages.resolve(config))
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


# Steps between checkpoints: a stopped lab run resumes (`train_or_load`) and loses at most these.
CHECKPOINT_EVERY = 200


def schedule(config, steps: int, evals: int) -> None:
  """Sets a run of `steps` steps in place: `evals` val evaluations, about 8 log lines, a checkpoint
  every CHECKPOINT_EVERY steps and at the end; then validates the config."""
  config.train.steps = steps
  config.train.eval_every = max(1, steps // max(evals, 1))
  config.train.log_every = max(1, min(25, steps // 8))
  config.train.checkpoint_every = min(steps, CHECKPOINT_EVERY)
  config_validation.validate(config)


def median_bytes_per_s(rows) -> float:
  """Median training bytes/s over a run's logged intervals (metrics.jsonl rows). The first interval
  includes compilation: it is left out when there is more than one; 0 when none was logged."""
  speeds = [r['bytes_per_s'] for r in rows if r['split'] == 'train' and 'bytes_per_s' in r]
  return float(np.median(speeds[1:] if len(speeds) > 1 else speeds)) if speeds else 0.0


# -- training and evaluation -----------------------------------------------------------------------


def train_or_load(name: str, config, out_dir: str) -> dict:
  """Trains config in OUT/NAME (console to OUT/NAME/train.log) and writes OUT/NAME/result.json;
  when that file exists already, returns it and trains nothing.

  A run that was stopped before its result.json (Ctrl-C, SIGTERM, a killed session) resumes from its
  last checkpoint, exactly (the trainer restores the data iterator and RNG), when the config saved
  with that checkpoint is the one asked for; with another config it starts again from scratch.

  The result: name ('method'), median training bytes/s, wall seconds, the trainer's final val bpb
  (sampled and greedy boundaries) and the log's path. Evaluations added later go in the same file
  (`save_result`).
  """
  workdir = os.path.join(out_dir, name)
  result_path = os.path.join(workdir, 'result.json')
  if os.path.exists(result_path):
    with open(result_path) as f:
      return json.load(f)
  config.train.workdir = workdir
  resume = _resumable(workdir, config)
  if not resume and os.path.isdir(workdir):
    shutil.rmtree(workdir)  # An unfinished earlier run of another config.
  os.makedirs(workdir, exist_ok=True)
  log = os.path.join(workdir, 'train.log')
  t0 = time.time()
  with open(log, 'a' if resume else 'w') as f, contextlib.redirect_stdout(f):
    val = train_lib.train(config, resume=resume)
  wall = time.time() - t0
  result = {
      'method': name,
      'train_bytes_per_s': median_bytes_per_s(read_metrics(os.path.join(workdir, 'metrics.jsonl'))),
      'wall_s': wall,  # Of the last session only, when the run was resumed.
      'resumed': resume,
      'final_val_sample_bpb': val.get('bpb'),
      'greedy_val_bpb': val.get('greedy_bpb'),
      'log': log,
  }
  save_result(out_dir, name, result)  # Before any evaluation: a failed one does not retrain.
  return result


def _resumable(workdir: str, config) -> bool:
  """Whether workdir holds a checkpoint of this very config, wherever the folder was when it was
  saved (what train_or_load resumes)."""
  if finished_step(workdir) is None:
    return False
  saved, _, _ = inspection.load_config(workdir)

  def run_of(c):
    c = json.loads(c.to_json_best_effort(sort_keys=True))
    c['train'].pop('workdir')
    return c

  return run_of(saved) == run_of(config)


def save_result(out_dir: str, name: str, result: dict) -> None:
  write_json(os.path.join(out_dir, name, 'result.json'), result, indent=None)


def capped(docs, max_docs: int, doc_bytes: int):
  """The first max_docs documents (0: all), each cut to its first doc_bytes bytes (0: whole)."""
  docs = docs[:max_docs] if max_docs else docs
  return [d[:doc_bytes] for d in docs] if doc_bytes else list(docs)


def evaluate_documents(
    ckpt, docs, key, unit_bytes: int | None = None, references=None, mode: str = 'sample'
) -> dict:
  """`tokjax.evaluator` statistics of docs with boundaries drawn by `mode` ('sample': as in
  training; 'greedy': the policy's most likely pattern): bpb pooled
  over bytes with its ratio-estimator standard error over documents (or over units of unit_bytes
  bytes of each document, with their per-unit CE for paired differences), and the boundary
  statistics (with `references`, {name: reference} of boundary_stats, also against those, and
  the boundary_stats.Counts of every level under 'counts')."""
  kwargs = {} if unit_bytes is None else {'unit_bytes': unit_bytes}
  if references is not None:
    kwargs.update(references=references, counts=True)
  return ckpt.evaluator.run(ckpt.params, docs, key, modes=(mode,), **kwargs)[mode]


def paired_one_seed(a: dict, b: dict, docs, unit_bytes: int, doc_clusters=None) -> dict:
  """Run a minus run b (one seed each) on the same units of one split (`evaluate_documents`
  results over docs): `significance.paired_difference` clustered by document, or by doc_clusters
  (int[len(docs)], the cluster of each document: `corpora.document_clusters`), judged by
  `significance.judge` with one seed (seed_se None). Results scored before the evaluator recorded
  each unit's document get it derived the same way from docs."""
  documents = np.asarray(a.get('unit_documents', significance.unit_documents(docs, unit_bytes)))
  clusters = documents if doc_clusters is None else np.asarray(doc_clusters)[documents]
  p = significance.paired_difference(a['unit_ce'], b['unit_ce'], a['unit_bytes'], clusters)
  return p | {'seed_se': None} | significance.judge(p['diff'], p['clustered_se'], p['clusters'])


def judge_families(rows, family_of) -> list[dict]:
  """rows (dicts with `significance.judge`'s keys) judged within their families
  (`significance.judge_family`), in their order; family_of(row) -> the name of its family."""
  rows = list(rows)
  out = list(rows)
  for name in dict.fromkeys(family_of(r) for r in rows):
    members = [i for i, r in enumerate(rows) if family_of(r) == name]
    for i, j in zip(members, significance.judge_family([rows[i] for i in members], name)):
      out[i] = j
  return out


def paragraph(docs, length: int) -> bytes:
  """A held-out passage: `length` bytes of the first test document, starting at a line start."""
  doc = docs[0]
  start = doc.find(b'\n', min(len(doc) // 3, 2000)) + 1
  return doc[start : start + length] if len(doc) - start >= length // 2 else doc[:length]


def evaluate_splits(
    workdir: str, result: dict, splits, key, eval_cap, passage, references=None, unit_bytes=None
) -> dict:
  """Adds to result the run's per-document val/test numbers (split i with fold_in(key, i); with
  `references` and unit_bytes, see evaluate_documents), its parameter count and, for a chunking
  model, stage 0's greedy boundaries on the passage."""
  ckpt = inspection.load_checkpoint(workdir)
  for i, split in enumerate(('val', 'test')):
    result[split] = evaluate_documents(
        ckpt,
        capped(splits[split], *eval_cap),
        jax.random.fold_in(key, i),
        unit_bytes=unit_bytes,
        references=references,
    )
  if ckpt.model.num_stages:
    shown, actions, probs = tokenization.boundaries_for(
        ckpt.model, ckpt.params, passage, ckpt.config.data.seq_len, key, 'greedy'
    )
    result['passage'] = {  # Stage 0's boundaries; the rendering shows every level.
        'actions': [float(a) for a in actions[0]],
        'probs': [float(p) for p in probs[0]],
        'rendered': tokenization.render(shown, actions),
    }
  result['params'] = int(ckpt.trainer.num_params)
  return result


def finished_step(workdir: str) -> int | None:
  """The latest checkpoint step of a run folder, or None when it has none."""
  if not os.path.isdir(os.path.join(workdir, 'checkpoints')):
    return None
  return checkpointing.manager(workdir, create=False).latest_step()


# -- results ---------------------------------------------------------------------------------------


def fmt(x, digits: int = 4, style: str = 'f', none: str = '-') -> str:
  """A table cell: number x with `digits` decimals (style 'f') or significant digits ('g'), `none`
  for None (say 'inf' where None stands for an unbounded value), '-' for NaN; text as it is."""
  if x is None:
    return none
  if isinstance(x, str):
    return x
  return '-' if isinstance(x, float) and math.isnan(x) else f'{x:.{digits}{style}}'


def table(header: str, rows) -> list[str]:
  """Markdown lines of a table: the header, its rule, one line per row. header and each row: the
  (formatted) cells joined by ' | '."""
  return [f'| {header} |', '|' + '---|' * (header.count(' | ') + 1), *(f'| {r} |' for r in rows)]


def write_json(path: str, obj, indent: int | None = 1) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=indent)
  os.replace(tmp, path)  # A reader never sees half a file, whenever the process dies.


def write_results(
    out_dir: str, data: dict, lines, stem: str = 'results', markdown: str = ''
) -> None:
  """OUT/STEM.json (data) and the markdown page of `lines` (OUT/STEM.md, or OUT/MARKDOWN)."""
  os.makedirs(out_dir, exist_ok=True)
  write_json(os.path.join(out_dir, stem + '.json'), data)
  text = '\n'.join(lines)
  with open(os.path.join(out_dir, markdown or stem + '.md'), 'w') as f:
    f.write(text if text.endswith('\n') else text + '\n')


def pyplot():
  """matplotlib.pyplot drawing to files only (no display needed)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  return plt


def save_figure(fig, path: str, dpi: int = 110) -> None:
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  pyplot().close(fig)
