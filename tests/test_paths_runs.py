"""Runs whose workdir, checkpoints and outputs are URLs (file:// here; gs:// needs gcsfs and a
bucket), on a prepared corpus; the metrics writer's path for filesystems without append; and the
one-line error for a URL whose filesystem package is missing."""

import glob
import json
import math
import os
import struct

from conftest import tiny_config
import pytest
from tensorboardX.proto import event_pb2

from tokjax import checkpointing, evaluate, inspection, segment, train
from tokjax.data import shards
from tokjax.errors import UserError
from tokjax.metric_writers import MetricWriter, read_metrics


def _events(folder) -> list[tuple[str, int, float]]:
  """(tag, step, value) of every scalar in the TensorBoard event files of `folder` (TFRecords)."""
  out = []
  for name in sorted(glob.glob(os.path.join(folder, 'events.out.tfevents.*'))):
    data = open(name, 'rb').read()
    i = 0
    while i < len(data):
      (n,) = struct.unpack('<Q', data[i : i + 8])
      event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
      out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
      i += 12 + n + 4
  return sorted(out)


def _train_rows(workdir: str) -> dict:
  rows = read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  steps = [r['step'] for r in rows if r['split'] == 'train']
  assert steps == sorted(set(steps)), steps  # Each step once, in order.
  return {r['step']: r for r in rows if r['split'] == 'train'}


def test_file_url_run_on_a_prepared_corpus_resumes_and_evaluates(tmp_path):
  """A whole run with file:// workdir on a prepared corpus: train 6 steps, drop the last checkpoint,
  resume (bitwise the same losses, each step logged once), then evaluate and segment into file://
  outputs."""
  prepared = tmp_path / 'prepared'
  shards.write_prepared(
      'stdlib',
      str(prepared),
      max_bytes=200_000,
      val_fraction=0.1,
      test_fraction=0.1,
      progress=False,
  )
  local = str(tmp_path / 'run')
  c = tiny_config('file://' + local)
  c.data.corpus = f'prepared:{prepared}'
  c.train.log_every, c.train.checkpoint_every = 1, 3
  train.train(c)
  uninterrupted = _train_rows(local)
  assert sorted(uninterrupted) == [1, 2, 3, 4, 5, 6]
  assert os.path.getsize(os.path.join(local, 'curves.png')) > 0
  assert ('train/loss', 6, pytest.approx(uninterrupted[6]['loss'])) in _events(
      os.path.join(local, 'tensorboard')
  )
  mgr = checkpointing.manager(c.train.workdir)
  assert str(mgr.directory) == os.path.join(local, 'checkpoints')  # No 'file:' folder in the cwd.
  mgr.delete(6)
  assert sorted(mgr.all_steps()) == [3]

  train.train(c, resume=True)
  resumed = _train_rows(local)
  for step in range(1, 7):
    assert resumed[step]['loss'] == uninterrupted[step]['loss'], step
  assert sorted(checkpointing.manager(c.train.workdir).all_steps()) == [3, 6]

  report = evaluate.run_evaluation(
      c.train.workdir,
      corpus=None,
      split='test',
      out='file://' + str(tmp_path / 'eval' / 'out'),
      max_batches=2,
      bpe=False,
      step=None,
  )
  assert report['step'] == 6 and report['checkpoint'] == local
  written = json.loads((tmp_path / 'eval' / 'out.json').read_text())
  assert (
      math.isfinite(written['modes']['sample']['bpb']) and (tmp_path / 'eval' / 'out.md').exists()
  )
  text = tmp_path / 'sample.py'
  text.write_text('def f(x):\n  return x + 1\n')
  res = segment.segment_file(c.train.workdir, str(text))  # Default output under the run folder.
  for suffix in ('txt', 'json', 'html', 'png'):
    assert os.path.getsize(os.path.join(local, 'segment', f'sample.py.{suffix}')) > 0
  assert res['paths']['txt'] == os.path.join(local, 'segment', 'sample.py.txt')


def _write_rows(workdir, remote, restored_step=None, steps=range(1, 7)):
  w = MetricWriter(workdir, restored_step=restored_step, remote=remote)
  for s in steps:
    w.write(s, 'train', {'loss': 1.0 / s})
    if s % 3 == 0:
      w.write(s, 'val', {'bpb': 2.0 / s})
  w.close()


def test_writer_without_append_matches_the_appending_writer(tmp_path):
  """The path taken for cloud workdirs (no append: rows rewritten whole; TensorBoard events written
  locally and copied) gives the same metrics.jsonl and events as the local path, resume included."""
  outputs = {}
  for remote in (False, True):
    workdir = str(tmp_path / f'remote_{remote}')
    _write_rows(workdir, remote)
    _write_rows(workdir, remote, restored_step=3, steps=range(4, 9))  # Steps 4-6 again, then 7-8.
    outputs[remote] = (
        read_metrics(os.path.join(workdir, 'metrics.jsonl')),
        _events(os.path.join(workdir, 'tensorboard')),
    )
  rows, events = outputs[True]
  assert outputs[True] == outputs[False]
  assert [r['step'] for r in rows if r['split'] == 'train'] == list(range(1, 9))
  assert ('val/bpb', 6, pytest.approx(2.0 / 6)) in events
  assert [e for e in events if e[0] == 'train/loss'] == [
      ('train/loss', s, pytest.approx(1.0 / s)) for s in range(1, 9)
  ]
  assert not glob.glob(os.path.join(tmp_path, '*', 'metrics.jsonl.tmp'))
  assert len(events) == 8 + 2


@pytest.mark.parametrize('scheme,package', [('gs', 'gcsfs'), ('s3', 's3fs')])
def test_url_without_its_filesystem_package_is_one_line_before_any_work(tmp_path, scheme, package):
  try:
    __import__(package)
    pytest.skip(f'{package} is installed; this checks the message shown without it')
  except ImportError:
    pass
  c = tiny_config(f'{scheme}://some-bucket/run')
  c.data.corpus = 'prepared:' + str(tmp_path / 'no-such-folder')  # Never reached.
  with pytest.raises(UserError, match=f'needs the {package} package for {scheme}:// paths'):
    train.train(c)
  with pytest.raises(UserError, match=f'needs the {package} package'):
    inspection.load_checkpoint(f'{scheme}://some-bucket/run')
