"""`python -m tokjax.evaluate --split val` reproduces the trainer's logged val bpb by default."""

import json
import os
import subprocess
import sys

import numpy as np

from tokjax import evaluate, inspection
from tokjax.data import pipeline

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_evaluate_split_val_reproduces_the_logged_val_bpb_by_default(tiny_run, tmp_path):
  rows = [json.loads(l) for l in open(os.path.join(tiny_run, 'metrics.jsonl'))]
  val = [r for r in rows if r['split'] == 'val'][-1]
  config = inspection.load_checkpoint(tiny_run).config
  assert val['step'] == config.train.steps  # The last checkpoint's own validation.
  # The split holds more batches than the trainer validates on, so the default is what matches.
  docs = evaluate.load_split(config, None, 'val')['val']
  whole = pipeline.make_eval_batches(
      docs, seq_len=config.data.seq_len, batch_size=config.eval.batch_size
  )
  assert len(whole) > config.eval.max_batches
  out = tmp_path / 'val'
  proc = subprocess.run(
      [sys.executable, '-m', 'tokjax.evaluate', f'--checkpoint={tiny_run}', '--split=val']
      + ['--nobpe', f'--out={out}'],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.load(open(f'{out}.json'))
  for mode, prefix in (('sample', ''), ('greedy', 'greedy_')):
    for k in ('bpb', 'bpb_se', 'rate'):
      np.testing.assert_equal(report['modes'][mode][k], val[prefix + k], err_msg=f'{mode} {k}')
  assert report['max_batches'] == config.eval.max_batches
