"""Where metrics go: a JSONL file, TensorBoard event files, the console, and a PNG of the curves."""

import json
import math
import os

from tensorboardX import SummaryWriter


class MetricWriter:
  """Appends {'step', 'split', **scalars} rows to workdir/metrics.jsonl and to TensorBoard.

  Only one process of a multi-host run should write (enabled=False elsewhere): they all hold the same
  numbers, and the workdir is shared.
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.enabled = enabled
    self.tb = SummaryWriter(os.path.join(workdir, 'tensorboard')) if enabled else None

  def write(self, step: int, split: str, scalars: dict) -> None:
    if not self.enabled:
      return
    row = {'step': int(step), 'split': split}
    row.update({k: float(v) for k, v in scalars.items()})
    with open(self.path, 'a') as f:
      f.write(json.dumps(row) + '\n')
    for k, v in row.items():
      if k not in ('step', 'split') and math.isfinite(v):
        self.tb.add_scalar(f'{split}/{k}', v, step)
    self.tb.flush()

  def close(self):
    if self.enabled:
      self.tb.close()


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_curves(metrics_path: str, out_png: str, keys=('bpb', 'rate', 'whitespace_recall')) -> str:
  """Train and val curves of `keys` (those present) against step, one panel each."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = read_metrics(metrics_path)
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
