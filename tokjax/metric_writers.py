"""Where metrics go: a JSONL file, TensorBoard event files, the console, and a PNG of the curves."""

import json
import math
import os
import shutil

from tensorboardX import SummaryWriter


class MetricWriter:
  """Appends {'step', 'split', **scalars} rows to workdir/metrics.jsonl and to TensorBoard.

  Only one process of a multi-host run should write (enabled=False elsewhere): they all hold the same
  numbers, and the workdir is shared.

  restored_step: the checkpoint step a resumed run continues from. The rows after it (logged by the
  interrupted run after its last checkpoint, which the resumed run logs again) are dropped from
  metrics.jsonl, and TensorBoard's events are rewritten from the rows kept, so each step appears once.
  """

  def __init__(self, workdir: str, enabled: bool = True, restored_step: int | None = None):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.enabled = enabled
    self.tb = None
    if not enabled:
      return
    tb_dir = os.path.join(workdir, 'tensorboard')
    kept = []
    if restored_step is not None and os.path.exists(self.path):
      kept = [r for r in read_metrics(self.path) if r.get('step', 0) <= restored_step]
      tmp = self.path + '.tmp'
      with open(tmp, 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in kept)
      os.replace(tmp, self.path)  # Atomic: a crash here leaves the old or the new log, never half.
      shutil.rmtree(tb_dir, ignore_errors=True)
    self.tb = SummaryWriter(tb_dir)
    for r in kept:
      self._tb_write(r)
    self.tb.flush()

  def _tb_write(self, row: dict) -> None:
    for k, v in row.items():
      if k not in ('step', 'split') and math.isfinite(v):
        self.tb.add_scalar(f'{row["split"]}/{k}', v, row['step'])

  def write(self, step: int, split: str, scalars: dict) -> None:
    if not self.enabled:
      return
    row = {'step': int(step), 'split': split}
    row.update({k: float(v) for k, v in scalars.items()})
    with open(self.path, 'a') as f:
      f.write(json.dumps(row) + '\n')
    self._tb_write(row)
    self.tb.flush()

  def close(self):
    if self.enabled:
      self.tb.close()


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
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
  fig.savefig(out_png, dpi=110)
  plt.close(fig)
  return out_png
