r"""A budget ladder: every boundary method trained at growing byte budgets, scored paired on the same units.

  python -m tokjax.lab.ladder --corpus shakespeare --budgets 1e6,4e6 \
      --methods policy,hnet,bpe,uniform,whitespace,stride,flat --seeds 0,1,2 --jobs 2 \
      --out results/ladder/shakespeare

A run is (method, budget, seed, seq_len, lr, batch): configs/compare.py:METHOD (the default CPU
model; 'flat' gets the layer count that matches the hierarchical parameter count) at --seq_lens and
--batch_size (default the config's, 256 and 16; the chunk buffer grows with the length) trained for
steps = budget / (batch * seq_len), with warmup and cosine decay over its own steps. --set and
--override change any other field; the batch, the length and the steps only through the flags, so
that a run's name and budget say what it trained. Each run lives in
OUT/runs/NAME: spec.json (what it is), train.log, metrics.jsonl, orbax checkpoints and, once trained
and scored, result.json (its spec embedded). Every run is scored on the whole val and test splits
with boundaries sampled with the same key for every method, per unit (fixed windows of --unit_bytes
bytes of each document, `significance.unit_ids`, with each window's document), so that differences
between methods are paired on the same bytes and clustered by document (tokjax/lab/ladder_report.py
has the statistics and the report).

Idempotent and resumable: a run with result.json is read back, never retrained; a run that was stopped
(Ctrl-C, SIGTERM, a killed session) resumes from its last checkpoint with --resume, exactly (the
trainer's resume restores the data iterator and RNG). Without --resume the command refuses to touch
unfinished runs. Ctrl-C or SIGTERM stops every job after its checkpoint is saved. --report writes the
tables and plot of the runs finished so far and runs nothing. `--pack DIR` shrinks every finished run
folder under DIR to its result.json (what a study commits; the report needs nothing else). A corpus
that does not load is refused before any worker starts.

--jobs N runs N runs side by side, each pinned to its own core (of the cores this process may use)
with one XLA thread: on a small machine that beats one multi-threaded run. --cores_per_job K gives
each job K cores as K host devices, one XLA thread each, over which the trainer's mesh splits the
batch (data parallel): the same run up to the order of floating-point sums, in less wall time, for a
run too long for one core.
One progress line per running job every --progress_s seconds (budget, step, bytes/s, ETA).

OUT gets results.json (every run and every paired difference), results.md (its tables; not with
--nomarkdown) and ladder.png (test bpb against training bytes, one line per method; second panel:
paired difference to the reference method; third: test bpb against realised training FLOPs). With
several --lrs the table also names the lr each method does best with on val (OUT/lr.json), for later
ladders' --lr_table.
"""

import dataclasses
import glob
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable

from absl import flags, logging
import numpy as np

from tokjax import cli, flops, stages
from tokjax.config import validation as config_validation
from tokjax.data import pipeline
from tokjax.errors import Interrupted, UserError
from tokjax.lab import common, ladder_report
from tokjax.metric_writers import read_metrics

ONE_THREAD = '--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of the ladder (its identity: every field)."""

  method: str
  budget: float  # Training bytes.
  seed: int
  seq_len: int
  lr: float
  overrides: tuple = ()  # ('boundary.hnet.ratio_weight=0.3', ...): config fields set for this run.
  corpus: str = 'shakespeare'
  tiny: bool = False  # configs/compare.py's smoke-test size (tests).
  # Sequences per step; None: configs/compare.py's (16; 4 at its tiny size), what every run had
  # before the field (their spec.json lacks it and their names have no '-B').
  batch_size: int | None = None

  @property
  def name(self) -> str:
    extra = '-o' + _short_hash(self.overrides) if self.overrides else ''
    batch = f'-B{self.batch_size}' if self.batch_size is not None else ''
    tiny = '-tiny' if self.tiny else ''
    return (
        f'{self.method}-b{self.budget:g}-s{self.seed}-L{self.seq_len}-lr{self.lr:g}'
        f'{batch}{extra}{tiny}'
    )


def run_batch(batch_size: int | None, corpus: str, tiny: bool) -> int | None:
  """A Run's batch_size for a command's --batch_size: None for the config's own batch (None or
  equal to it), so that a run at the default batch keeps its name whether or not the flag names it.
  """
  default = common.compare_config('policy', corpus, tiny=tiny).data.batch_size
  return None if batch_size in (None, default) else int(batch_size)


@dataclasses.dataclass(frozen=True)
class Scoring:
  """How every run is scored (not part of a run's identity: changing it rescores, never retrains)."""

  unit_bytes: int = 2048  # Paired units: windows of this many bytes of each document.
  cross: tuple = ()  # Corpora whose test split every run is also scored on (out of domain).
  greedy: bool = False  # Also score the test split with greedy boundaries ('test_greedy').


def _short_hash(items) -> str:
  return hashlib.blake2b(repr(tuple(items)).encode(), digest_size=3).hexdigest()


# Fields a run sets from its identity (steps = budget / (batch x seq_len)), which an override would
# change under the run's name: the flag that sets each.
OWN_FIELDS = {
    'data.batch_size': '--batch_size',
    'data.seq_len': '--seq_lens (ladder) or --seq_len (ablation)',
    'train.steps': '--budgets (ladder) or --budget (ablation): steps = budget / (batch x seq_len)',
}


def check_overrides(run: Run) -> None:
  """UserError for an override of one of OWN_FIELDS, before the run trains. Reports still read runs
  trained with such an override before the check existed (their studies say what it changed)."""
  for item in run.overrides:
    field = item.split('=', 1)[0]
    if field in OWN_FIELDS:
      raise UserError(
          f'override {item}: {field} is part of the run (its name and its steps); set it with '
          f'{OWN_FIELDS[field]}.'
      )


def build_config(run: Run):
  """The run's config: configs/compare.py:METHOD with its corpus, seed, seq_len, batch, lr and
  budget, then its overrides (`check_overrides` refuses those that would change the first five)."""

  def variant(method):
    c = common.compare_config(method, run.corpus, tiny=run.tiny, seed=run.seed)
    c.data.seq_len = run.seq_len
    if run.batch_size is not None:
      c.data.batch_size = run.batch_size
    # Room for twice the target rate's chunks, as the default config has at L = 256.
    c.model.capacity = max(c.model.capacity, int(math.ceil(run.seq_len * 0.5)))
    c.optim.lr = run.lr
    return c

  c = variant(run.method)
  if run.method == 'flat':
    c.model.num_layers = common.match_flat_layers(c, common.param_count(variant('policy')))
  # From the config's own batch and length: the overrides below cannot change them (OWN_FIELDS).
  common.schedule(c, common.steps_for(run.budget, c.data.batch_size, c.data.seq_len), evals=4)
  for item in run.overrides:
    field, value = item.split('=', 1)
    _set_field(c, field, value)
  config_validation.validate(c)
  return c


def _set_field(config, field: str, value: str) -> None:
  *path, leaf = field.split('.')
  node = config
  try:
    for p in path:
      node = node[p]
    old = node[leaf]
    node[leaf] = type(old)(value) if not isinstance(old, bool) else value.lower() in ('1', 'true')
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    raise UserError(f'override {field}={value}: not a config field of that type ({e}).') from None


def steps_of(run: Run, batch_size: int) -> int:
  return common.steps_for(run.budget, batch_size, run.seq_len)


# -- one run (in its own process) ------------------------------------------------------------------


def _has_checkpoint(workdir: str) -> bool:
  ckpts = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(ckpts) and any(n.isdigit() for n in os.listdir(ckpts))


def work(run_dir: str) -> dict:
  """Trains (or resumes) the run in run_dir and scores it; writes and returns result.json."""
  from tokjax import inspection  # pylint: disable=g-import-not-at-top
  from tokjax import train as train_lib  # pylint: disable=g-import-not-at-top

  run, scoring = read_spec(run_dir)
  result_path = os.path.join(run_dir, 'result.json')
  result = None
  if os.path.exists(result_path):
    with open(result_path) as f:
      result = json.load(f)
  config = build_config(run)
  config.train.workdir = run_dir
  if result is None:
    check_overrides(run)
    t0 = time.time()
    resume = _has_checkpoint(run_dir)
    try:
      train_lib.train(config, resume=resume, overwrite=not resume)
    except Interrupted as e:  # The trainer's own hint names this worker's command line.
      raise Interrupted(
          f'{run.name} stopped, checkpoint saved; continue with the ladder command and --resume',
          e.exit_code - 128,
      ) from None
    result = {
        'train_wall_s': time.time() - t0,
        'train_devices': _device_count(),
        'commit': source_commit(),
    }
    result.update(_training_summary(config, run_dir))
  if 'curve' not in result and os.path.exists(os.path.join(run_dir, 'metrics.jsonl')):
    result['curve'] = val_curve(os.path.join(run_dir, 'metrics.jsonl'))
  ckpt = inspection.load_checkpoint(run_dir)
  splits = _splits(config, run.corpus)
  key = _eval_key()
  if result.get('unit_bytes') != scoring.unit_bytes:
    result.update(unit_bytes=scoring.unit_bytes, cross={})
    for split in ('val', 'test', 'test_greedy'):
      result.pop(split, None)
  for split in ('val', 'test'):
    if split not in result:
      result[split] = common.evaluate_documents(ckpt, splits[split], key, scoring.unit_bytes)
  if scoring.greedy and 'test_greedy' not in result:
    greedy = common.evaluate_documents(ckpt, splits['test'], key, mode='greedy')
    result['test_greedy'] = {k: v for k, v in greedy.items() if k not in PER_UNIT}
  for corpus in scoring.cross:
    if corpus not in result['cross'] and corpus != run.corpus:
      docs = _splits(config, corpus)['test']
      result['cross'][corpus] = common.evaluate_documents(ckpt, docs, key, scoring.unit_bytes)
  result['params'] = int(ckpt.trainer.num_params)
  # What the result holds, not what this pass asked for: a narrower rescore keeps earlier scores.
  result.update(spec_of(run, held_scoring(result)))
  common.write_json(result_path, result, indent=None)
  return result


def _splits(config, corpus):
  from tokjax.data import pipeline  # pylint: disable=g-import-not-at-top

  data = config.data.copy_and_resolve_references()
  data.corpus = corpus
  return pipeline.load_splits(data, corpus)


def source_commit() -> str | None:
  """The git commit of the tokjax source that runs (with '+dirty' when it has uncommitted changes),
  or None outside a git checkout: what a result.json records as the code that trained it."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    head = subprocess.run(
        ['git', '-C', root, 'rev-parse', 'HEAD'], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ['git', '-C', root, 'status', '--porcelain', '--untracked-files=no', '--', 'tokjax'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None
  return head + ('+dirty' if dirty else '')


def _device_count() -> int:
  import jax  # pylint: disable=g-import-not-at-top

  return jax.device_count()


def _eval_key():
  import jax  # pylint: disable=g-import-not-at-top

  return jax.random.PRNGKey(1234)  # The same boundary key for every method and run.


# 2: 'bpe' names causal BPE boundaries; a spec without a version that says 'bpe' trained the
# whole-window boundaries, today's 'bpe_oracle' (`read_spec` reads it so).
SPEC_VERSION = 2


def spec_of(run: Run, scoring: Scoring) -> dict:
  """{'run', 'scoring', 'version'}: what a run is and how it is scored, as spec.json and result.json
  hold it."""
  return {
      'run': dataclasses.asdict(run),
      'scoring': dataclasses.asdict(scoring),
      'version': SPEC_VERSION,
  }


def _oracle_bpe(run: dict) -> dict:
  """A run spec of version 1 whose method is 'bpe', as today's name of what it trained."""
  if run['method'] != 'bpe':
    return run
  renamed = [
      o.replace('boundary.bpe.', 'boundary.bpe_oracle.', 1) for o in run.get('overrides', ())
  ]
  return dict(run, method='bpe_oracle', overrides=renamed)


def write_spec(run_dir: str, run: Run, scoring: Scoring) -> None:
  common.write_json(os.path.join(run_dir, 'spec.json'), spec_of(run, scoring), indent=None)


def held_scoring(result: dict) -> Scoring:
  """The scoring a result.json holds: its unit, the corpora scored out of domain, greedy or not."""
  return Scoring(
      result['unit_bytes'], tuple(sorted(result.get('cross', {}))), 'test_greedy' in result
  )


def read_spec(run_dir: str) -> tuple[Run, Scoring]:
  """The run and scoring of run_dir: its spec.json, else those embedded in its result.json (a packed
  run, `pack`). A spec.json of the first ladders held the run alone; its scoring is the result's."""
  path = os.path.join(run_dir, 'spec.json')
  if not os.path.exists(path):
    path = os.path.join(run_dir, 'result.json')
  with open(path) as f:
    spec = json.load(f)
  if 'run' not in spec:
    spec = {'run': spec}
  if spec.get('version', 1) < 2:
    spec['run'] = _oracle_bpe(spec['run'])
  if 'scoring' not in spec:
    with open(os.path.join(run_dir, 'result.json')) as f:
      r = json.load(f)
    spec['scoring'] = dataclasses.asdict(held_scoring(r))
  tup: Callable[[dict], dict[str, Any]] = lambda d: {
      k: tuple(v) if isinstance(v, list) else v for k, v in d.items()
  }
  return Run(**tup(spec['run'])), Scoring(**tup(spec['scoring']))


# Per-unit lists of an evaluation, which only paired differences read.
PER_UNIT = ('unit_ce', 'unit_bytes', 'unit_documents', 'chunk_hist')
# The validation metrics a run's curve keeps (sampled and greedy boundaries).
CURVE_KEYS = (
    'bpb',
    'rate',
    'whitespace_recall',
    'greedy_bpb',
    'greedy_rate',
    'greedy_whitespace_recall',
)


def val_curve(metrics_path: str) -> list[dict]:
  """[{'step', CURVE_KEYS...}] of every validation row of a run's metrics.jsonl (what a study plots
  after `pack` has deleted the file)."""
  rows = [r for r in read_metrics(metrics_path) if r['split'] == 'val']
  return [{'step': r['step']} | {k: r[k] for k in CURVE_KEYS if k in r} for r in rows]


def _training_summary(config, run_dir) -> dict:
  """Realised training rate (mean over logged steps), training FLOPs at that rate, bytes/s."""
  rows = [r for r in read_metrics(os.path.join(run_dir, 'metrics.jsonl')) if r['split'] == 'train']
  rates = [r['rate'] for r in rows if 'rate' in r]
  rate = float(np.mean(rates)) if rates else None
  steps = config.train.steps
  return {
      'steps': steps,
      'train_bytes': steps * config.data.batch_size * config.data.seq_len,
      'train_rate': rate,
      'train_flops': flops.step_flops(config, rate, levels=stages.resolve(config)) * steps,
      'train_bytes_per_s': common.median_bytes_per_s(rows),
  }


# -- the scheduler ---------------------------------------------------------------------------------


def plan(
    corpus, budgets, methods, seeds, seq_lens, lrs, overrides, tiny=False, batch_size=None
) -> list[Run]:
  """Every run of the grid, cheapest first. lrs: {method: [lr, ...]}; overrides: {method: (...)};
  batch_size: sequences per step (None: the config's)."""
  batch = run_batch(batch_size, corpus, tiny)
  runs = [
      Run(m, float(b), int(s), int(L), float(lr), tuple(overrides.get(m, ())), corpus, tiny, batch)
      for b in budgets
      for L in seq_lens
      for s in seeds
      for m in methods
      for lr in lrs[m]
  ]
  return sorted(runs, key=lambda r: (r.budget * r.seq_len / 256, r.seed))


def status(out_dir, run: Run, scoring: Scoring) -> str:
  """'done', 'rescore' (trained, scored otherwise than `scoring` asks), 'stopped' or 'new'."""
  d = os.path.join(out_dir, 'runs', run.name)
  if os.path.exists(os.path.join(d, 'result.json')):
    held = read_spec(d)[0]
    if held != run:
      raise UserError(
          f'{d} holds a run of {held.method}, not of {run.method} (a bpe run trained before bpe '
          'became causal saw the whole window: it is bpe_oracle now); rename the folder to '
          f'{held.name} and report it with --methods {held.method}.'
      )
    with open(os.path.join(d, 'result.json')) as f:
      r = json.load(f)
    missing = [c for c in scoring.cross if c != run.corpus and c not in r.get('cross', {})]
    missing += ['test_greedy'] if scoring.greedy and 'test_greedy' not in r else []
    return 'rescore' if missing or r.get('unit_bytes') != scoring.unit_bytes else 'done'
  if os.path.isdir(d) and (_has_checkpoint(d) or os.path.exists(os.path.join(d, 'metrics.jsonl'))):
    return 'stopped'
  return 'new'


def _progress(out_dir, run: Run, started: float, batch_size: int) -> str:
  path = os.path.join(out_dir, 'runs', run.name, 'metrics.jsonl')
  rows = read_metrics(path) if os.path.exists(path) else []
  train = [r for r in rows if r['split'] == 'train']
  batch_size = run.batch_size or batch_size
  total = steps_of(run, batch_size)
  if not train:
    return (
        f'[ladder] {run.name}: budget {run.budget:.3g} B, starting ({time.time() - started:.0f}s)'
    )
  last = train[-1]
  speed = last.get('bytes_per_s', 0.0)
  left = (total - last['step']) * batch_size * run.seq_len / max(speed, 1e-9)
  return (
      f'[ladder] {run.name}: budget {run.budget:.3g} B, step {last["step"]}/{total} '
      f'({100 * last["step"] / total:.0f}%), {speed / 1e3:.1f}k B/s, ETA {left / 60:.0f}m'
  )


def execute(
    out_dir,
    runs,
    scoring: Scoring,
    jobs: int,
    resume: bool,
    progress_s: float,
    batch_size: int,
    cores_per_job: int = 1,
) -> int:
  """Runs every run not done yet, `jobs` at a time, each pinned to `cores_per_job` cores (as many
  host devices, one XLA thread each); batch_size: that of the runs that name none (progress lines).
  -> failures."""
  todo = []
  for run in runs:
    st = status(out_dir, run, scoring)
    if st == 'stopped' and not resume:
      raise UserError(
          f'{os.path.join(out_dir, "runs", run.name)} holds an unfinished run; pass --resume to '
          'continue every unfinished run exactly, or delete that folder to start it again.'
      )
    if st != 'done':
      todo.append(run)
  print(
      f'[ladder] {len(runs) - len(todo)} of {len(runs)} runs done, {len(todo)} to run', flush=True
  )
  cores = sorted(os.sched_getaffinity(0))
  free = [  # One group of cores per job; groups repeat cores only when there are too few.
      tuple(cores[(i * cores_per_job + j) % len(cores)] for j in range(cores_per_job))
      for i in range(jobs)
  ]
  xla_flags = os.environ.get('XLA_FLAGS', '')
  if cores_per_job > 1:
    xla_flags += f' --xla_force_host_platform_device_count={cores_per_job}'
  # Last: XLA drops the flags that follow ONE_THREAD's bare 'intra_op_parallelism_threads=1' (a device
  # count placed after it gave one device).
  xla_flags += ' ' + ONE_THREAD
  running: dict[subprocess.Popen, tuple[Run, tuple[int, ...], float]] = {}  # (run, cores, start)
  stopping = {'signal': None}
  failures = 0

  def stop(signum, frame):
    del frame
    stopping['signal'] = signum
    for p in running:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)  # The trainer saves a checkpoint and exits.

  old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
  last_progress = time.time()
  try:
    while running or (todo and stopping['signal'] is None):
      while todo and free and stopping['signal'] is None:
        run, group = todo.pop(0), free.pop(0)
        names = ','.join(map(str, group))
        d = os.path.join(out_dir, 'runs', run.name)
        os.makedirs(d, exist_ok=True)
        write_spec(d, run, scoring)
        env = dict(os.environ, XLA_FLAGS=xla_flags)
        log = open(os.path.join(d, 'train.log'), 'a')
        # The worker pins itself (no Python between fork and exec: this process runs JAX), in a
        # session of its own so that a Ctrl-C reaches it only through stop() below.
        p = subprocess.Popen(
            [sys.executable, '-m', 'tokjax.lab.ladder', '--worker', d, f'--cores={names}'],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        running[p] = (run, group, time.time())
        print(f'[ladder] start {run.name} on core {names}', flush=True)
      time.sleep(1.0)
      for p in [p for p in running if p.poll() is not None]:
        run, group, t0 = running.pop(p)
        free.append(group)
        if p.returncode == 0:
          print(f'[ladder] done {run.name} ({(time.time() - t0) / 60:.1f}m)', flush=True)
        elif stopping['signal'] is not None:
          print(f'[ladder] stopped {run.name}: resumable with --resume', flush=True)
        else:
          failures += 1
          print(
              f'[ladder] FAILED {run.name} (exit {p.returncode}): see '
              f'{os.path.join(out_dir, "runs", run.name, "train.log")}',
              flush=True,
          )
      if running and time.time() - last_progress >= progress_s:
        last_progress = time.time()
        for run, _, t0 in running.values():
          print(_progress(out_dir, run, t0, batch_size), flush=True)
  finally:
    for s, h in old.items():
      signal.signal(s, h)
  if stopping['signal'] is not None:
    raise UserError(
        f'stopped by {signal.Signals(stopping["signal"]).name}: every unfinished run saved its '
        'checkpoint; rerun the same command with --resume to continue.'
    )
  return failures


# -- finished runs -------------------------------------------------------------------------------


def load_results(out_dir, runs) -> list[dict]:
  """The result.json of every finished run of `runs`, each scored split with its units' documents
  (`ladder_report.with_documents`)."""
  out = []
  splits = _split_cache()
  for run in runs:
    path = os.path.join(out_dir, 'runs', run.name, 'result.json')
    if os.path.exists(path):
      with open(path) as f:
        r = json.load(f)
      r['run'] = dataclasses.asdict(read_spec(os.path.dirname(path))[0])  # In today's names.
      ladder_report.with_documents(r, run, splits)
      out.append(r)
  return out


def _split_cache():
  """(run, corpus) -> that corpus's val and test documents as the run's config splits them, each
  split loaded once."""
  cache = {}

  def splits(run, corpus):
    data = build_config(run).data
    key = (corpus, *(data[k] for k in sorted(data)))
    if key not in cache:
      cache[key] = _splits(build_config(run), corpus)
    return cache[key]

  return splits


KEPT = (
    'result.json',
    'checkpoints',
)  # What `pack` leaves of a run (checkpoints are not committed).


def pack(root: str) -> int:
  """Shrinks every finished run folder under root (any OUT/runs/NAME below it, with a result.json)
  to its result.json: embeds the spec (`spec_of`) and each split's unit documents
  (`ladder_report.with_documents`), then deletes all but KEPT (spec.json, train.log, metrics.jsonl, ...: git
  history keeps them). Checkpoints stay, so a packed run can still be rescored; an unfinished run
  is left alone. -> the number of runs packed."""
  splits = _split_cache()
  packed = 0
  for result_path in sorted(
      glob.glob(os.path.join(root, '**', 'runs', '*', 'result.json'), recursive=True)
  ):
    run_dir = os.path.dirname(result_path)
    run, scoring = read_spec(run_dir)
    with open(result_path) as f:
      result = json.load(f)
    result.update(spec_of(run, scoring))
    ladder_report.with_documents(result, run, splits)
    common.write_json(result_path, result, indent=None)
    for name in set(os.listdir(run_dir)) - set(KEPT):
      path = os.path.join(run_dir, name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    packed += 1
  return packed


def check_corpora(corpora, data) -> None:
  """UserError (one line, from the corpus loader) unless each corpus yields a first document."""
  from tokjax.data import corpora as corpora_lib  # pylint: disable=g-import-not-at-top

  for corpus in corpora:
    next(corpora_lib.iter_documents(corpus, data_dir=data.data_dir or None))


def cross_shared(corpus: str, cross, config, allow: bool) -> dict[str, float]:
  """{cross corpus: share of its test split's windows found verbatim in `corpus`'s training split}
  (`overlap.verbatim_share`). UserError for a share above `overlap.MAX_SHARE` unless `allow`: such a
  set is not out of domain."""
  from tokjax.data import overlap  # pylint: disable=g-import-not-at-top

  if not cross:
    return {}
  train = _splits(config, corpus)['train']
  shares = {}
  for name in cross:
    if name == corpus:
      continue
    share, _ = overlap.verbatim_share(_splits(config, name)['test'], train)
    if share > overlap.MAX_SHARE and not allow:
      raise UserError(
          f'--cross {name}: {share:.1%} of its test windows of {overlap.WINDOW_BYTES} bytes occur '
          f'verbatim in the training split of {corpus} (more than {overlap.MAX_SHARE:.0%}), so it '
          'is not out of domain; drop it from --cross or pass --allow_shared_cross.'
      )
    shares[name] = share
  return shares


# -- the command ------------------------------------------------------------------------------------


def _parse_map(items, what) -> dict:
  out: dict[str, list[str]] = {}
  for item in items:
    if ':' not in item:
      raise UserError(
          f'--{what} {item!r} must be METHOD:FIELD=VALUE, e.g. hnet:boundary.hnet.ratio_weight=0.3.'
      )
    m, v = item.split(':', 1)
    out.setdefault(m, []).append(v)
  return out


def read_lr_table(path) -> dict[str, float]:
  """{method: lr} from a sweep's lr.json (`best_lrs`); UserError if it is missing or malformed."""
  hint = 'pass the lr.json that a --lrs sweep wrote (e.g. results/ladder/shakespeare/lr_4e6.json)'
  try:
    with open(path) as fh:
      table = json.load(fh)
    if not isinstance(table, dict):
      raise ValueError('not a {method: lr} object')
    return {str(m): float(lr) for m, lr in table.items()}
  except FileNotFoundError:
    raise UserError(f'--lr_table={path}: no such file; {hint}.') from None
  except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError.
    raise UserError(
        f'--lr_table={path} is not a {{method: lr}} JSON object ({e}); {hint}.'
    ) from None


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  if f.worker:
    if f.cores:
      # Before JAX starts its threads, which inherit it.
      os.sched_setaffinity(0, {int(c) for c in f.cores})
    work(f.worker)
    return
  if f.pack:
    print(f'packed {pack(f.pack)} finished run(s) under {f.pack} to their result.json')
    return

  known = common.method_names()
  bad = [m for m in f.methods if m not in known]
  if bad or not f.methods:
    raise UserError(f'unknown method(s) {bad}; --methods takes some of {",".join(known)}.')
  if f.reference not in f.methods:
    raise UserError(f'--reference={f.reference} must be one of --methods ({",".join(f.methods)}).')
  try:
    budgets = [float(b) for b in f.budgets]
    lrs_grid = [float(x) for x in f.lrs] if f.lrs else []
  except ValueError as e:
    raise UserError(f'--budgets and --lrs take numbers (e.g. --budgets 1e6,4e6): {e}') from None
  if not budgets or min(budgets) <= 0:
    raise UserError('--budgets must be positive numbers of training bytes, e.g. --budgets 1e6,4e6.')
  if f.jobs < 1:
    raise UserError(f'--jobs={f.jobs} must be at least 1.')
  if f.cores_per_job < 1:
    raise UserError(f'--cores_per_job={f.cores_per_job} must be at least 1.')
  if f.batch_size is not None and f.batch_size < 1:
    raise UserError(f'--batch_size={f.batch_size} must be at least 1 (sequences per step).')
  base = common.compare_config('policy', f.corpus, tiny=f.tiny)
  batch_size = f.batch_size or base.data.batch_size
  lrs = {m: lrs_grid or [base.optim.lr] for m in f.methods}
  if f.lr_table:
    lrs.update({m: [lr] for m, lr in read_lr_table(f.lr_table).items() if m in f.methods})
  per_method = _parse_map(f.override, 'override')
  overrides = {m: tuple(f.set) + tuple(per_method.get(m, ())) for m in f.methods}
  for m, items in overrides.items():
    for item in items:
      if '=' not in item:
        raise UserError(f'override {item!r} of {m} must be FIELD=VALUE, e.g. train.log_every=10.')
  try:
    seq_lens = [int(x) for x in f.seq_lens] or [base.data.seq_len]
  except ValueError:
    raise UserError(
        f'--seq_lens takes integers, e.g. 256,2048 (got {",".join(f.seq_lens)}).'
    ) from None
  seeds = [int(s) for s in f.seeds]
  runs = plan(f.corpus, budgets, f.methods, seeds, seq_lens, lrs, overrides, f.tiny, f.batch_size)
  scoring = Scoring(f.unit_bytes, tuple(f.cross))
  for run in {dataclasses.replace(r, seed=0, budget=1e6) for r in runs}:
    if not f.report:
      check_overrides(run)  # Bad overrides stop here with one line, before any run starts.
    c = build_config(run)
    for batch in (c.data.batch_size, c.eval.batch_size):
      if batch % f.cores_per_job:
        raise UserError(
            f'--cores_per_job={f.cores_per_job} must divide the batch of {batch} sequences '
            '(each core takes an equal share), e.g. 1, 2 or 4.'
        )
  check_corpora([f.corpus, *f.cross], base.data)  # Before any worker starts.
  shared = cross_shared(f.corpus, f.cross, base, f.allow_shared_cross)
  root = f.runs_in or f.out  # Its runs/ holds the run folders.
  os.makedirs(os.path.join(root, 'runs'), exist_ok=True)
  os.makedirs(f.out, exist_ok=True)
  os.environ.setdefault(
      'JAX_COMPILATION_CACHE_DIR', os.path.expanduser('~/.cache/tokjax/xla-ladder')
  )
  failures = 0
  if not f.report:
    failures = execute(
        root, runs, scoring, f.jobs, f.resume, f.progress_s, batch_size, f.cores_per_job
    )
  results = load_results(root, runs)
  meta = {
      'corpus': f.corpus,
      # The command that trains these runs (a --report of them runs the same grid).
      'command': 'python -m tokjax.lab.ladder '
      + ' '.join(a for a in sys.argv[1:] if a not in ('--report', '--resume', '--nomarkdown')),
      'reference': f.reference,
      'unit_bytes': f.unit_bytes,
      'target_rate': float(base.boundary.target_rate),
      'seq_lens': seq_lens,  # Each row's own is its 'seq_len'.
      'batch_size': int(batch_size),  # Of every run (--batch_size, else the config's).
      'runs': len(runs),
      'finished': len(results),
      # Share of each cross set's test windows found verbatim in the training split.
      'cross_shared': shared,
      'baselines': classical_baselines(f.corpus, f.cross, build_config(runs[0]).data),
  }
  if results:
    sweep = len(lrs_grid) > 1 and len(budgets) == len(seq_lens) == 1  # One rung, several lrs.
    ladder_report.report(f.out, results, meta, markdown=f.markdown, lr_sweep=sweep)
  if failures:
    raise UserError(
        f'{failures} run(s) failed; their train.log says why. Fix and rerun with --resume.'
    )


def classical_baselines(corpus: str, cross, data_config) -> dict:
  """{split or 'cross:NAME': `pipeline.classical_bpb`} of the corpus's val and test splits and each
  cross corpus's test split, split as the runs split them (cached after the first report)."""
  out = {s: pipeline.classical_bpb(corpus, s, data_config) for s in ('val', 'test')}
  out.update({f'cross:{c}': pipeline.classical_bpb(c, 'test', data_config) for c in cross})
  return out


def define_flags():
  flags.DEFINE_string('corpus', 'shakespeare', 'Corpus spec (see tokjax/data/corpora.py).')
  flags.DEFINE_list('budgets', ['1e6', '4e6'], 'Training bytes per run.')
  flags.DEFINE_list(
      'methods', ['policy', 'hnet', 'bpe', 'uniform', 'whitespace', 'stride', 'flat'], 'Methods.'
  )
  flags.DEFINE_list('seeds', ['0'], 'Seeds of every (method, budget).')
  flags.DEFINE_list('seq_lens', [], "Sequence lengths in bytes (default: the config's, 256).")
  flags.DEFINE_integer(
      'batch_size', None, "Sequences per step of every run (default: the config's, 16)."
  )
  flags.DEFINE_list('lrs', [], 'Learning rates (a sweep grid); default: the config lr.')
  flags.DEFINE_string('lr_table', None, "A sweep's lr.json: per-method learning rates.")
  flags.DEFINE_multi_string(
      'override',
      [],
      'METHOD:FIELD=VALUE config override, e.g. hnet:boundary.hnet.ratio_weight=0.3.',
  )
  flags.DEFINE_multi_string('set', [], 'FIELD=VALUE config override for every method.')
  flags.DEFINE_list('cross', [], 'Also score every run on the test split of these corpora.')
  flags.DEFINE_bool(
      'allow_shared_cross',
      False,
      'Score on --cross sets that share more than 1% of their text with the training split.',
  )
  flags.DEFINE_bool('tiny', False, 'Smoke-test model size (configs/compare.py:METHOD,tiny).')
  flags.DEFINE_string('reference', 'policy', 'Method the paired differences are taken against.')
  flags.DEFINE_integer(
      'unit_bytes', Scoring.unit_bytes, 'Scoring unit: windows of this many bytes.'
  )
  flags.DEFINE_integer('jobs', 1, 'Runs side by side, each pinned to its own cores.')
  flags.DEFINE_integer(
      'cores_per_job', 1, 'Cores of each job, as host devices over which the batch is split.'
  )
  flags.DEFINE_bool('resume', False, 'Continue unfinished runs from their checkpoints.')
  flags.DEFINE_bool('report', False, 'Only write the tables and plot of the runs finished so far.')
  flags.DEFINE_bool('markdown', True, 'Write results.md beside results.json and ladder.png.')
  flags.DEFINE_string(
      'pack',
      None,
      'Shrink every finished run folder under this folder to its result.json (spec and document ids '
      'embedded; spec.json, train.log and metrics.jsonl deleted), then exit.',
  )
  flags.DEFINE_float('progress_s', 60.0, 'Seconds between progress lines.')
  flags.DEFINE_string('out', 'results/ladder/run', 'Results folder.')
  flags.DEFINE_string(
      'runs_in',
      None,
      'Folder whose runs/ holds the run folders (default: --out), so that a table of some of its '
      'runs (other seeds, a subset of methods) is written to --out apart from its own.',
  )
  flags.DEFINE_string('worker', None, 'Internal: train and score the run in this folder.')
  flags.DEFINE_list('cores', [], 'Internal: the cores a worker runs on.')


if __name__ == '__main__':
  define_flags()
  cli.run(main)
