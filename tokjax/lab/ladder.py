r"""A budget ladder: every boundary method trained at growing byte budgets, scored paired on the same units.

  python -m tokjax.lab.ladder --corpus shakespeare --budgets 1e6,4e6 \
      --methods policy,hnet,bpe,uniform,whitespace,stride,flat --seeds 0,1,2 --jobs 2 \
      --out results/ladder/shakespeare

A run is (method, budget, seed, seq_len, lr): configs/compare.py:METHOD (the default CPU model; 'flat'
gets the layer count that matches the hierarchical parameter count) trained for
steps = budget / (batch * seq_len), with warmup and cosine decay over its own steps. Each run lives in
OUT/runs/NAME: spec.json (what it is), train.log, metrics.jsonl, orbax checkpoints and, once trained
and scored, result.json. Every run is scored on the whole val and test splits with boundaries sampled
with the same key for every method, per unit (fixed windows of --unit_bytes bytes of each document,
`evaluation.unit_ids`), so that differences between methods are paired on the same bytes.

Idempotent and resumable: a run with result.json is read back, never retrained; a run that was stopped
(Ctrl-C, SIGTERM, a killed session) resumes from its last checkpoint with --resume, exactly (the
trainer's resume restores the data iterator and RNG). Without --resume the command refuses to touch
unfinished runs. Ctrl-C or SIGTERM stops every job after its checkpoint is saved. --report writes the
tables and plot of the runs finished so far and runs nothing.

--jobs N runs N runs side by side, each pinned to its own core (of the cores this process may use)
with one XLA thread: on a small machine that beats one multi-threaded run. --cores_per_job K gives
each job K cores as K host devices, one XLA thread each, over which the trainer's mesh splits the
batch (data parallel): the same run up to the order of floating-point sums, in less wall time, for a
run too long for one core (results/ladder/README.md has the measured speed-up).
One progress line per running job every --progress_s seconds (budget, step, bytes/s, ETA).

OUT gets results.md, results.json (every run and every paired difference) and ladder.png (test bpb
against training bytes, one line per method; second panel: paired difference to the reference method;
third: test bpb against realised training FLOPs). With several --lrs the table also names the lr
each method does best with on val (OUT/lr.json), for later ladders' --lr_table.
"""

import dataclasses
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time

from absl import flags, logging
import numpy as np

from tokjax import cli, config_validation, evaluation, flops
from tokjax.errors import Interrupted, UserError
from tokjax.lab import common
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

  @property
  def name(self) -> str:
    extra = '-o' + _short_hash(self.overrides) if self.overrides else ''
    tiny = '-tiny' if self.tiny else ''
    return f'{self.method}-b{self.budget:g}-s{self.seed}-L{self.seq_len}-lr{self.lr:g}{extra}{tiny}'


@dataclasses.dataclass(frozen=True)
class Scoring:
  """How every run is scored (not part of a run's identity: changing it rescores, never retrains)."""

  unit_bytes: int = 2048  # Paired units: windows of this many bytes of each document.
  cross: tuple = ()  # Corpora whose test split every run is also scored on (out of domain).


def _short_hash(items) -> str:
  return hashlib.blake2b(repr(tuple(items)).encode(), digest_size=3).hexdigest()


def build_config(run: Run):
  """The run's config: configs/compare.py:METHOD with its corpus, seed, seq_len, lr and budget."""

  def variant(method):
    c = common.compare_config(method, run.corpus, tiny=run.tiny, seed=run.seed)
    c.data.seq_len = run.seq_len
    # Room for twice the target rate's chunks, as the default config has at L = 256.
    c.model.capacity = max(c.model.capacity, int(math.ceil(run.seq_len * 0.5)))
    c.optim.lr = run.lr
    return c

  c = variant(run.method)
  if run.method == 'flat':
    c.model.num_layers = common.match_flat_layers(c, common.param_count(variant('policy')))
  steps = steps_of(run, c.data.batch_size)
  common.schedule(c, steps, evals=4)
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
  from tokjax import checkpointing  # pylint: disable=g-import-not-at-top
  from tokjax import train as train_lib  # pylint: disable=g-import-not-at-top

  run, scoring = read_spec(run_dir)
  spec = dataclasses.asdict(run)
  result_path = os.path.join(run_dir, 'result.json')
  result = None
  if os.path.exists(result_path):
    with open(result_path) as f:
      result = json.load(f)
  config = build_config(run)
  config.train.workdir = run_dir
  if result is None:
    t0 = time.time()
    resume = _has_checkpoint(run_dir)
    try:
      train_lib.train(config, resume=resume, overwrite=not resume)
    except Interrupted as e:  # The trainer's own hint names this worker's command line.
      raise Interrupted(
          f'{run.name} stopped, checkpoint saved; continue with the ladder command and --resume',
          e.exit_code - 128,
      ) from None
    result = {'run': spec, 'train_wall_s': time.time() - t0, 'train_devices': _device_count()}
  ckpt = checkpointing.load_checkpoint(run_dir)
  splits = _splits(config, run.corpus)
  key = _eval_key()
  if result.get('unit_bytes') != scoring.unit_bytes:
    result.update(unit_bytes=scoring.unit_bytes, cross={})
    result.pop('val', None)
    result.pop('test', None)
  for split in ('val', 'test'):
    if split not in result:
      result[split] = common.evaluate_documents(ckpt, splits[split], key, scoring.unit_bytes)
  for corpus in scoring.cross:
    if corpus not in result['cross'] and corpus != run.corpus:
      docs = _splits(config, corpus)['test']
      result['cross'][corpus] = common.evaluate_documents(ckpt, docs, key, scoring.unit_bytes)
  result.update(_training_summary(config, run_dir))
  result['params'] = int(ckpt.trainer.num_params)
  common.write_json(result_path, result, indent=None)
  return result


def _splits(config, corpus):
  from tokjax.data import pipeline  # pylint: disable=g-import-not-at-top

  data = config.data.copy_and_resolve_references()
  data.corpus = corpus
  return pipeline.load_splits(data, corpus)


def _device_count() -> int:
  import jax  # pylint: disable=g-import-not-at-top

  return jax.device_count()


def _eval_key():
  import jax  # pylint: disable=g-import-not-at-top

  return jax.random.PRNGKey(1234)  # The same boundary key for every method and run.


def write_spec(run_dir: str, run: Run, scoring: Scoring) -> None:
  common.write_json(
      os.path.join(run_dir, 'spec.json'),
      {'run': dataclasses.asdict(run), 'scoring': dataclasses.asdict(scoring)},
      indent=None,
  )


def read_spec(run_dir: str) -> tuple[Run, Scoring]:
  with open(os.path.join(run_dir, 'spec.json')) as f:
    spec = json.load(f)
  tup = lambda d: {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
  return Run(**tup(spec['run'])), Scoring(**tup(spec['scoring']))


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
      'train_flops': flops.step_flops(config, rate) * steps,
      'train_bytes_per_s': common.median_bytes_per_s(rows),
  }


# -- the scheduler ---------------------------------------------------------------------------------


def plan(corpus, budgets, methods, seeds, seq_lens, lrs, overrides, tiny=False) -> list[Run]:
  """Every run of the grid, cheapest first. lrs: {method: [lr, ...]}; overrides: {method: (...)}."""
  runs = [
      Run(m, float(b), int(s), int(L), float(lr), tuple(overrides.get(m, ())), corpus, tiny)
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
    with open(os.path.join(d, 'result.json')) as f:
      r = json.load(f)
    missing = [c for c in scoring.cross if c != run.corpus and c not in r.get('cross', {})]
    return 'rescore' if missing or r.get('unit_bytes') != scoring.unit_bytes else 'done'
  if os.path.isdir(d) and (_has_checkpoint(d) or os.path.exists(os.path.join(d, 'metrics.jsonl'))):
    return 'stopped'
  return 'new'


def _progress(out_dir, run: Run, started: float, batch_size: int) -> str:
  path = os.path.join(out_dir, 'runs', run.name, 'metrics.jsonl')
  rows = read_metrics(path) if os.path.exists(path) else []
  train = [r for r in rows if r['split'] == 'train']
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
  host devices, one XLA thread each). -> failures."""
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
  running = {}  # Popen -> (run, cores, start time)
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


# -- results ----------------------------------------------------------------------------------------


def load_results(out_dir, runs) -> list[dict]:
  out = []
  for run in runs:
    path = os.path.join(out_dir, 'runs', run.name, 'result.json')
    if os.path.exists(path):
      with open(path) as f:
        out.append(json.load(f))
  return out


def _key(r):
  s = r['run']
  return (s['budget'], s['seq_len'], s['method'], s['lr'])


def summarize(results, reference: str) -> list[dict]:
  """One row per (budget, seq_len, method, lr): means over seeds, and the paired difference to the
  reference method on test (per unit, averaged over the seeds both have), with its s.e."""
  groups = {}
  for r in results:
    groups.setdefault(_key(r), []).append(r)
  ref_lr = {}  # The reference's best lr on val at each (budget, seq_len).
  for (b, L, m, lr), rs in groups.items():
    if m == reference:
      v = np.mean([r['val']['bpb'] for r in rs])
      if (b, L) not in ref_lr or v < ref_lr[(b, L)][1]:
        ref_lr[(b, L)] = (lr, v)
  rows = []
  for (b, L, m, lr), rs in groups.items():
    rs = sorted(rs, key=lambda r: r['run']['seed'])
    row = {
        'budget': b,
        'seq_len': L,
        'method': m,
        'lr': lr,
        'seeds': [r['run']['seed'] for r in rs],
        'params': rs[0]['params'],
        'test_bpb': float(np.mean([r['test']['bpb'] for r in rs])),
        'test_bpb_se': float(np.mean([r['test']['bpb_se'] for r in rs])),
        'seed_sd': float(np.std([r['test']['bpb'] for r in rs], ddof=1)) if len(rs) > 1 else None,
        'val_bpb': float(np.mean([r['val']['bpb'] for r in rs])),
        'rate': _mean(r['test'].get('rate') for r in rs),
        'train_rate': _mean(r.get('train_rate') for r in rs),
        'whitespace_recall': _mean(r['test'].get('whitespace_recall') for r in rs),
        'whitespace_precision': _mean(r['test'].get('whitespace_precision') for r in rs),
        'train_flops': float(np.mean([r['train_flops'] for r in rs])),
        'train_bytes': rs[0]['train_bytes'],
        'bytes_per_s': float(np.mean([r['train_bytes_per_s'] for r in rs])),
    }
    ref = groups.get((b, L, reference, ref_lr.get((b, L), (None,))[0]))
    if ref is not None and m != reference:
      row['paired'] = paired_over_seeds(rs, ref, 'test')
      row['cross_paired'] = {
          c: paired_over_seeds(rs, ref, c)
          for c in rs[0].get('cross', {})
          if all(c in x.get('cross', {}) for x in rs + ref)
      }
    row['cross_bpb'] = {
        c: float(np.mean([x['cross'][c]['bpb'] for x in rs]))
        for c in rs[0].get('cross', {})
        if all(c in x.get('cross', {}) for x in rs)
    }
    rows.append(row)
  return sorted(rows, key=lambda r: (r['budget'], r['seq_len'], r['test_bpb']))


def _mean(xs):
  xs = [x for x in xs if x is not None]
  return float(np.mean(xs)) if xs else None


def paired_over_seeds(runs_a, runs_b, split) -> dict | None:
  """a - b on the same units: per-unit CE averaged over the seeds both have, then
  `evaluation.paired_difference`; 'seed_se' is the s.e. of the per-seed differences (>= 2 seeds)."""
  get = lambda r: r[split] if split in ('val', 'test') else r['cross'][split]
  by_seed_b = {r['run']['seed']: r for r in runs_b}
  pairs = [(a, by_seed_b[a['run']['seed']]) for a in runs_a if a['run']['seed'] in by_seed_b]
  if not pairs:
    pairs = [(a, b) for a in runs_a for b in runs_b][:1]  # Unmatched seeds: first pair only.
  ce_a = np.mean([get(a)['unit_ce'] for a, _ in pairs], axis=0)
  ce_b = np.mean([get(b)['unit_ce'] for _, b in pairs], axis=0)
  out = evaluation.paired_difference(ce_a, ce_b, get(pairs[0][0])['unit_bytes'])
  per_seed = [get(a)['bpb'] - get(b)['bpb'] for a, b in pairs]
  out['seeds'] = len(pairs)
  out['seed_se'] = (
      float(np.std(per_seed, ddof=1) / math.sqrt(len(pairs))) if len(pairs) > 1 else None
  )
  return out


# The ordering of the paper's table: the reference at or below these (not worse by 2 s.e.) ...
PAPER_AT_OR_BELOW = ('bpe',)
# ... and below these by a paired difference of at least two standard errors.
PAPER_BELOW = ('hnet', 'uniform')


def _paired_se(p) -> float:
  """A paired difference's s.e. over units and, where there are seeds, over seeds."""
  return math.hypot(p['se'], p['seed_se'] or 0.0)


def trend(rows, reference: str) -> dict:
  """How each method's paired difference to the reference moves with the budget.

  rows: `summarize`'s, one lr per (method, budget, seq_len) kept (the best on val). Per seq_len:
  'rungs': {budget: {method: (diff, se)}} and 'ordering': {budget: True/False/None}, whether the
  paper's ordering holds there (reference not 2 s.e. worse than PAPER_AT_OR_BELOW and 2 s.e. better
  than PAPER_BELOW; None: a method is missing). 'fits': {method: (slope, crossing)} for methods at
  >= 2 budgets: the least-squares slope of the difference per 4x budget, and the budget at which
  that line reaches 0 beyond the top rung (None if it moves away from 0). A straight line in log
  budget through a few rungs is an extrapolation, not a prediction.
  """
  out = {}
  for L in sorted({r['seq_len'] for r in rows}):
    best = [r for r in rows if r['seq_len'] == L and r.get('paired') and _is_best_lr(r, rows)]
    rungs = {}
    for r in best:
      rungs.setdefault(r['budget'], {})[r['method']] = (
          r['paired']['diff'],
          _paired_se(r['paired']),
      )
    ordering = {}
    for b, ds in rungs.items():
      if any(m not in ds for m in PAPER_AT_OR_BELOW + PAPER_BELOW):
        ordering[b] = None
        continue
      ordering[b] = all(ds[m][0] >= -2 * ds[m][1] for m in PAPER_AT_OR_BELOW) and all(
          ds[m][0] >= 2 * ds[m][1] for m in PAPER_BELOW
      )
    fits = {}
    for m in sorted({m for ds in rungs.values() for m in ds}):
      pts = sorted((b, ds[m][0]) for b, ds in rungs.items() if m in ds)
      if len(pts) < 2:
        continue
      x = np.log([b for b, _ in pts]) / math.log(4.0)
      y = np.array([d for _, d in pts])
      slope, intercept = np.polyfit(x, y, 1)
      top_d = pts[-1][1]
      crossing = None
      if slope != 0 and top_d * slope < 0:  # Moving towards 0 from the top rung.
        crossing = float(4.0 ** (-intercept / slope))
      fits[m] = (float(slope), crossing)
    out[L] = {'rungs': rungs, 'ordering': ordering, 'fits': fits}
  return out


def _trend_lines(trends, meta) -> list[str]:
  """The report's Trend sections: one per sequence length of `trend`'s output with >= 2 budgets."""
  ref = meta['reference']
  lines = []
  for L, t in trends.items():
    budgets = sorted(t['rungs'])
    methods = sorted({m for ds in t['rungs'].values() for m in ds})
    if len(budgets) < 2:
      continue
    cell = lambda d: f'{d[0]:+.4f} +- {d[1]:.4f}' if d else '-'
    lines += [
        '',
        f'## Trend (L = {L})',
        '',
        f'Paired difference to `{ref}` (method minus {ref}, s.e. over units and seeds) at each '
        'budget, its least-squares slope per 4x budget, and the budget at which that line reaches '
        '0 (an extrapolation of a straight line in log budget: "-" where it moves away from 0). '
        f"The paper's ordering ({ref} not worse than {', '.join(PAPER_AT_OR_BELOW)} by 2 s.e., "
        f'better than {", ".join(PAPER_BELOW)} by 2 s.e.): '
        + ', '.join(
            f'{b:.3g}: ' + {True: 'holds', False: 'does not hold', None: 'not all run'}[o]
            for b, o in sorted(t['ordering'].items())
        )
        + '.',
        '',
        *common.table(
            'method | '
            + ' | '.join(f'{b:.3g} B' for b in budgets)
            + ' | slope / 4x | reaches 0 at',
            (
                f'{m} | '
                + ' | '.join(cell(t['rungs'][b].get(m)) for b in budgets)
                + (
                    f' | {t["fits"][m][0]:+.4f} | '
                    + (f'{t["fits"][m][1]:.2g} B' if t['fits'][m][1] else '-')
                    if m in t['fits']
                    else ' | - | -'
                )
                for m in methods
            ),
        ),
    ]
  return lines


RATE_TOLERANCE = (
    0.02  # A chunked method's realised rate counts as matched within this of the target.
)


def _rate_cell(rate, meta) -> str:
  """The test rate, marked '(off)' when it misses the target by more than RATE_TOLERANCE."""
  if rate is None or rate >= 0.999:  # The flat model: one position per byte, no chunks.
    return '-'
  off = abs(rate - meta['target_rate']) > RATE_TOLERANCE
  return f'{rate:.3f}' + (' (off)' if off else '')


def write_outputs(out_dir, rows, meta) -> None:
  """results.json, results.md and ladder.png."""
  fmt = common.fmt
  ref = meta['reference']
  lines = [
      f'# Budget ladder on `{meta["corpus"]}`',
      '',
      'Command:',
      '',
      f'    {meta["command"]}',
      '',
      f'Model: configs/compare.py (0.86M parameters, batch 16; flat: layer count matched). Each run '
      f'trains for budget / (16 x seq_len) steps with warmup and cosine over its own steps. Test bpb '
      f'is pooled over the bytes of the whole test split (boundaries sampled, one key for every run), '
      f'mean over seeds, {evaluation.SE_LABEL}; "paired" is the method minus `{ref}` on the same '
      f'units ({meta["unit_bytes"]}-byte windows of each document; per-unit CE averaged over seeds), '
      'with its paired s.e. (ratio estimator on per-unit differences); "seed s.e." the s.e. of the '
      f'per-seed differences. "better" is the share of units on which the method beats `{ref}`. '
      'rate and ws (whitespace recall: share of whitespace bytes that end a chunk) are on test '
      f'("(off)": more than {RATE_TOLERANCE} from the target {meta["target_rate"]}); '
      'train rate is the mean over logged training steps; FLOPs are training FLOPs at that rate.',
      '',
      *common.table(
          'budget B | L | method | lr | seeds | test bpb +- s.e. | paired vs ref +- s.e. | '
          'seed s.e. | better | rate | train rate | ws recall | ws prec | train FLOPs',
          (
              f'{r["budget"]:.3g} | {r["seq_len"]} | {r["method"]} | {r["lr"]:g} | '
              f'{len(r["seeds"])} | {fmt(r["test_bpb"], 3)} +- {fmt(r["test_bpb_se"], 3)} | '
              + (
                  f'{p["diff"]:+.4f} +- {p["se"]:.4f} | {fmt(p["seed_se"], 4)} | '
                  f'{p["a_better"]:.2f} | '
                  if p
                  else '(ref) | - | - | '
              )
              + f'{_rate_cell(r["rate"], meta)} | {fmt(r["train_rate"], 3)} | '
              f'{fmt(r["whitespace_recall"], 3)} | {fmt(r["whitespace_precision"], 3)} | '
              f'{r["train_flops"]:.3g}'
              for r, p in ((r, r.get('paired')) for r in rows)
          ),
      ),
  ]
  cross = sorted({c for r in rows for c in r.get('cross_bpb', {})})
  if cross:

    def paired(r, c):
      p = r.get('cross_paired', {}).get(c)
      return f'{p["diff"]:+.4f} +- {p["se"]:.4f}' if p else '(ref)'

    lines += [
        '',
        '## Out of domain',
        '',
        'The same checkpoints scored on the test split of other corpora (paired vs the reference).',
        '',
        *common.table(
            'budget B | L | method | ' + ' | '.join(f'{c} bpb | paired' for c in cross),
            (
                f'{r["budget"]:.3g} | {r["seq_len"]} | {r["method"]} | '
                + ' | '.join(f'{fmt(r["cross_bpb"].get(c), 3)} | {paired(r, c)}' for c in cross)
                for r in rows
                if r.get('cross_bpb')
            ),
        ),
    ]
  trends = trend(rows, meta['reference'])
  lines += _trend_lines(trends, meta)
  common.write_results(out_dir, {'meta': meta, 'rows': rows, 'trend': trends}, lines)
  _plot(out_dir, rows, meta)


def _plot(out_dir, rows, meta) -> None:
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top

  plt = common.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
  methods = sorted({r['method'] for r in rows}, key=lambda m: (m != meta['reference'], m))
  seq_lens = sorted({r['seq_len'] for r in rows})
  for m in methods:
    for L in seq_lens:
      rs = sorted(
          [r for r in rows if r['method'] == m and r['seq_len'] == L and _is_best_lr(r, rows)],
          key=lambda r: r['budget'],
      )
      if not rs:
        continue
      label = m if len(seq_lens) == 1 else f'{m} L={L}'
      err = [
          math.sqrt(r['test_bpb_se'] ** 2 + (r['seed_sd'] or 0) ** 2 / len(r['seeds'])) for r in rs
      ]
      line = axes[0].errorbar(
          [r['train_bytes'] for r in rs],
          [r['test_bpb'] for r in rs],
          yerr=err,
          marker='o',
          capsize=3,
          label=label,
          ls='-' if L == seq_lens[0] else '--',
      )
      axes[2].plot(
          [r['train_flops'] for r in rs],
          [r['test_bpb'] for r in rs],
          marker='o',
          color=line[0].get_color(),
          ls='-' if L == seq_lens[0] else '--',
          label=label,
      )
      ps = [r for r in rs if r.get('paired')]
      if ps:
        axes[1].errorbar(
            [r['train_bytes'] for r in ps],
            [r['paired']['diff'] for r in ps],
            yerr=[2 * _paired_se(r['paired']) for r in ps],
            marker='o',
            capsize=3,
            color=line[0].get_color(),
            ls='-' if L == seq_lens[0] else '--',
            label=label,
        )
  axes[1].axhline(0, color='k', lw=0.8)
  for ax, title, xl in zip(
      axes,
      (
          'test bpb (+- s.e.)',
          f'paired difference to {meta["reference"]} (+- 2 s.e., units and seeds)',
          'test bpb',
      ),
      ('training bytes', 'training bytes', 'training FLOPs (realised rate)'),
  ):
    ax.set_xscale('log')
    lo, hi = ax.get_xlim()
    # Over a decade the major labels suffice; within one the minor ones are needed.
    if hi > 10 * lo:
      ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(xl)
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('bits per byte')
  axes[0].legend(fontsize=7)
  fig.suptitle(f'budget ladder, {meta["corpus"]}')
  common.save_figure(fig, os.path.join(out_dir, 'ladder.png'))


def _is_best_lr(row, rows) -> bool:
  same = [
      r
      for r in rows
      if (r['method'], r['budget'], r['seq_len']) == (row['method'], row['budget'], row['seq_len'])
  ]
  return row is min(same, key=lambda r: r['val_bpb'])


def best_lrs(rows) -> dict:
  """{method: lr with the lowest val bpb} over the rows (a sweep at one budget)."""
  out = {}
  for r in rows:
    if r['method'] not in out or r['val_bpb'] < out[r['method']][1]:
      out[r['method']] = (r['lr'], r['val_bpb'])
  return {m: lr for m, (lr, _) in out.items()}


# -- the command ------------------------------------------------------------------------------------


def _parse_map(items, what) -> dict:
  out = {}
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
  base = common.compare_config('policy', f.corpus, tiny=f.tiny)
  batch_size = base.data.batch_size
  lrs = {m: lrs_grid or [base.optim.lr] for m in f.methods}
  if f.lr_table:
    lrs.update({m: [lr] for m, lr in read_lr_table(f.lr_table).items() if m in f.methods})
  per_method = _parse_map(f.override, 'override')
  overrides = {m: tuple(f.set) + tuple(per_method.get(m, ())) for m in f.methods}
  for m, items in overrides.items():
    for item in items:
      if '=' not in item:
        raise UserError(f'override {item!r} of {m} must be FIELD=VALUE, e.g. train.log_every=10.')
  seq_lens = [int(x) for x in f.seq_lens] or [base.data.seq_len]
  seeds = [int(s) for s in f.seeds]
  runs = plan(f.corpus, budgets, f.methods, seeds, seq_lens, lrs, overrides, f.tiny)
  scoring = Scoring(f.unit_bytes, tuple(f.cross))
  for run in {dataclasses.replace(r, seed=0, budget=1e6) for r in runs}:
    c = build_config(run)  # Bad overrides stop here with one line, before any run starts.
    for batch in (c.data.batch_size, c.eval.batch_size):
      if batch % f.cores_per_job:
        raise UserError(
            f'--cores_per_job={f.cores_per_job} must divide the batch of {batch} sequences '
            '(each core takes an equal share), e.g. 1, 2 or 4.'
        )
  os.makedirs(os.path.join(f.out, 'runs'), exist_ok=True)
  os.environ.setdefault(
      'JAX_COMPILATION_CACHE_DIR', os.path.expanduser('~/.cache/tokjax/xla-ladder')
  )
  failures = 0
  if not f.report:
    failures = execute(
        f.out, runs, scoring, f.jobs, f.resume, f.progress_s, batch_size, f.cores_per_job
    )
  results = load_results(f.out, runs)
  meta = {
      'corpus': f.corpus,
      # The command that trains these runs (a --report of them runs the same grid).
      'command': 'python -m tokjax.lab.ladder '
      + ' '.join(a for a in sys.argv[1:] if a not in ('--report', '--resume')),
      'reference': f.reference,
      'unit_bytes': f.unit_bytes,
      'target_rate': float(base.boundary.target_rate),
      'runs': len(runs),
      'finished': len(results),
  }
  if results:
    rows = summarize(results, f.reference)
    write_outputs(f.out, rows, meta)
    if len(lrs_grid) > 1:
      common.write_json(os.path.join(f.out, 'lr.json'), best_lrs(rows), indent=None)
    print(f'wrote {f.out}/results.md, results.json, ladder.png ({len(results)}/{len(runs)} runs)')
  if failures:
    raise UserError(
        f'{failures} run(s) failed; their train.log says why. Fix and rerun with --resume.'
    )


def define_flags():
  flags.DEFINE_string('corpus', 'shakespeare', 'Corpus spec (see tokjax/data/corpora.py).')
  flags.DEFINE_list('budgets', ['1e6', '4e6'], 'Training bytes per run.')
  flags.DEFINE_list(
      'methods', ['policy', 'hnet', 'bpe', 'uniform', 'whitespace', 'stride', 'flat'], 'Methods.'
  )
  flags.DEFINE_list('seeds', ['0'], 'Seeds of every (method, budget).')
  flags.DEFINE_list('seq_lens', [], "Sequence lengths in bytes (default: the config's, 256).")
  flags.DEFINE_list('lrs', [], 'Learning rates (a sweep grid); default: the config lr.')
  flags.DEFINE_string('lr_table', None, "A sweep's lr.json: per-method learning rates.")
  flags.DEFINE_multi_string(
      'override',
      [],
      'METHOD:FIELD=VALUE config override, e.g. hnet:boundary.hnet.ratio_weight=0.3.',
  )
  flags.DEFINE_multi_string('set', [], 'FIELD=VALUE config override for every method.')
  flags.DEFINE_list('cross', [], 'Also score every run on the test split of these corpora.')
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
  flags.DEFINE_float('progress_s', 60.0, 'Seconds between progress lines.')
  flags.DEFINE_string('out', 'results/ladder/run', 'Results folder.')
  flags.DEFINE_string('worker', None, 'Internal: train and score the run in this folder.')
  flags.DEFINE_list('cores', [], 'Internal: the cores a worker runs on.')


if __name__ == '__main__':
  define_flags()
  cli.run(main)
