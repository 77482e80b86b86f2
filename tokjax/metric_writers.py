"""Where metrics go: a JSONL file, TensorBoard event files, the console, and a PNG of the curves."""

import json
import math
import os
import shutil
import tempfile

from tensorboardX import SummaryWriter

from tokjax import paths

# Fields measured from the wall clock (Reporter.throughput): they differ between two runs of the same
# config, so comparisons of runs (resume, chaos) leave them out.
WALL_CLOCK_FIELDS = ('bytes_per_s', 'model_tflops', 'mfu')


def is_wall_clock(key: str) -> bool:
  return key in WALL_CLOCK_FIELDS or key.endswith(('_per_s', '_seconds')) or key in ('time', 'wall')


class MetricWriter:
  """Appends {'step', 'split', **scalars} rows to workdir/metrics.jsonl and to TensorBoard.

  Only one process of a multi-host run should write (enabled=False elsewhere): they all hold the same
  numbers, and the workdir is shared.

  restored_step: the checkpoint step a resumed run continues from. The rows after it (logged by the
  interrupted run after its last checkpoint, which the resumed run logs again) are dropped from
  metrics.jsonl, and TensorBoard's events are rewritten from the rows kept, so each step appears once.

  The workdir may be a URL (gs://...; see tokjax.paths). Cloud filesystems cannot append and
  tensorboardX writes local files only, so for a URL (or remote=True) the rows are kept in memory
  and metrics.jsonl is rewritten whole at each write (each write is one atomic object upload), and
  TensorBoard's events are written to a local temporary folder that is copied to
  workdir/tensorboard after each val row and at close.
  """

  def __init__(
      self,
      workdir: str,
      enabled: bool = True,
      restored_step: int | None = None,
      remote: bool | None = None,
  ):
    self.path = paths.join(workdir, 'metrics.jsonl')
    self.enabled = enabled
    self.remote = not paths.is_local(workdir) if remote is None else remote
    self.tb: SummaryWriter | None = None
    self.rows: list[dict] = []
    self._local_tb: str | None = None
    if not enabled:
      return
    paths.makedirs(workdir)
    tb_dir = self.tb_dir = paths.join(workdir, 'tensorboard')
    if self.path.exists() and (restored_step is not None or self.remote):
      self.rows = read_metrics(self.path)
    if restored_step is not None:
      self.rows = [r for r in self.rows if r.get('step', 0) <= restored_step]
      self._rewrite()
      paths.rmtree(tb_dir)
    if self.remote:
      self._local_tb = tempfile.mkdtemp(prefix='tokjax_tb_')
    self.tb = SummaryWriter(self._local_tb or os.fspath(tb_dir))
    for r in self.rows if restored_step is not None else ():
      self._tb_write(r)
    self._flush(mirror=restored_step is not None)

  def _rewrite(self) -> None:
    """metrics.jsonl := self.rows, atomically: a crash leaves the old or the new log, never half."""
    text = ''.join(json.dumps(r) + '\n' for r in self.rows)
    if self.remote:
      self.path.write_text(text)  # One object upload: atomic on cloud storage.
      return
    tmp = self.path.with_name(self.path.name + '.tmp')
    tmp.write_text(text)
    os.replace(tmp, self.path)

  def _tb_write(self, row: dict) -> None:
    # Only called while enabled and open: __init__ sets tb then, and only close() unsets it.
    assert self.tb is not None, 'MetricWriter written after close'
    for k, v in row.items():
      if k not in ('step', 'split') and math.isfinite(v):
        self.tb.add_scalar(f'{row["split"]}/{k}', v, row['step'])

  def _flush(self, mirror: bool) -> None:
    assert self.tb is not None, 'MetricWriter flushed after close'
    self.tb.flush()
    self._mirror(mirror)

  def _mirror(self, wanted: bool) -> None:
    """Copies the local event files of a remote workdir to workdir/tensorboard."""
    if self._local_tb and wanted:
      self.tb_dir.mkdir(parents=True, exist_ok=True)
      for name in os.listdir(self._local_tb):
        paths.resolve(os.path.join(self._local_tb, name)).copy(self.tb_dir / name, overwrite=True)

  def write(self, step: int, split: str, scalars: dict) -> None:
    if not self.enabled:
      return
    row = {'step': int(step), 'split': split}
    row.update({k: float(v) for k, v in scalars.items()})
    if self.remote:
      self.rows.append(row)
      self._rewrite()
    else:
      with self.path.open('a') as f:
        f.write(json.dumps(row) + '\n')
    self._tb_write(row)
    self._flush(mirror=split != 'train')

  def close(self):
    if self.enabled and self.tb is not None:
      self.tb.close()
      self.tb = None
      self._mirror(True)
      if self._local_tb:
        shutil.rmtree(self._local_tb, ignore_errors=True)
        self._local_tb = None


def read_metrics(path) -> list[dict]:
  """The rows of a metrics.jsonl (a local path or URL)."""
  with paths.resolve(path).open() as f:
    return [json.loads(line) for line in f if line.strip()]


def curve_rows(rows: list[dict]) -> list[dict]:
  """Rows with each (split, step) once (the last logged wins), ordered by step."""
  last = {(r['split'], r['step']): r for r in rows}
  return sorted(last.values(), key=lambda r: r['step'])


def plot_curves(metrics_path: str, out_png: str, keys=('bpb', 'rate', 'whitespace_recall')) -> str:
  """Train and val curves of `keys` (those present) against step, one panel each."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = curve_rows(read_metrics(metrics_path))
  keys = [k for k in keys if any(k in r for r in rows)]
  fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.4), squeeze=False)
  for ax, key in zip(axes[0], keys):
    for split in sorted({r['split'] for r in rows}):
      pts = [(r['step'], r[key]) for r in rows if r['split'] == split and key in r]
      if pts:
        ax.plot(*zip(*pts), label=split, marker='.' if split != 'train' else None)
    ax.set_xlabel('step')
    ax.set_title(key)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  with paths.resolve(out_png).open('wb') as f:  # A local path or URL.
    fig.savefig(f, format='png', dpi=110)
  plt.close(fig)
  return out_png
