"""compile_check: the real train step compiled ahead of time for simulated CPU devices and, when libtpu
is installed, for a TPU topology; memory and FLOPs reported, bad input reported on one line."""

import importlib.util
import json
import os
import subprocess
import sys

from conftest import XLA_FAST_COMPILE
import pytest

from tokjax import compile_check
from tokjax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    '--config=configs/default.py',
    '--config.model.d_model=32',
    '--config.model.capacity=32',
    '--config.model.main_layers=1',
    '--config.data.seq_len=64',
    '--config.data.batch_size=8',
]


def _run(args, tmp_path):
  out = tmp_path / 'report.json'
  env = dict(os.environ, PYTHONPATH=ROOT)
  # The command must set the simulated device count itself.
  env['XLA_FLAGS'] = XLA_FAST_COMPILE
  proc = subprocess.run(
      [sys.executable, '-m', 'tokjax.compile_check', *TINY, f'--out={out}', *args],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      check=False,
  )
  report = json.loads(out.read_text()) if out.exists() else None
  return proc, report


def test_cpu8_fsdp_report_and_require_fit(tmp_path):
  # FSDP over 8 simulated devices: each holds about 1/8 of the parameters; a 1 MiB budget fails.
  proc, r = _run(
      [
          '--topology=cpu:8',
          '--config.mesh.data=1',
          '--config.mesh.fsdp=-1',
          '--hbm_gib=0.001',
          '--require_fit',
      ],
      tmp_path,
  )
  assert r is not None, proc.stderr[-2000:]
  assert r['topology_devices'] == 8 and r['mesh'] == {'data': 1, 'fsdp': 8, 'tensor': 1}
  assert r['per_device_batch'] == 1
  full = r['params_M'] * 1e6 * 4  # float32 parameters, unsharded.
  assert full / 8 <= r['param_bytes'] < full / 2, (r['param_bytes'], full)
  assert r['opt_state_bytes'] >= 2 * r['param_bytes'] * 0.9  # Adam's two moments.
  assert r['temp_bytes'] > 0 and r['total_bytes'] > r['param_bytes'] + r['opt_state_bytes']
  assert r['xla_flops_per_device'] > 0 and r['analytic_flops_per_device'] > 0
  assert r['fits'] is False and r['headroom_bytes'] < 0
  assert set(r['eval']) == {'sample', 'greedy'} and r['eval']['sample']['compile_s'] > 0
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error:') and 'does not fit' in last


@pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None,
    reason='libtpu is not installed (pip install -e ".[tpu]"); the TPU compile is not checked',
)
def test_tpu_topology_compiles(tmp_path):
  proc, r = _run(['--topology=v5p:2x2x1', '--require_fit', '--noeval'], tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert r['topology_devices'] == 4 and r['device_kind'].startswith('TPU')
  assert r['fits'] and r['hbm_bytes'] == 95 * 2**30 and r['total_bytes'] < r['hbm_bytes']
  assert r['xla_flops_per_device'] > 0


def test_unknown_topology_is_one_line(tmp_path):
  proc, r = _run(['--topology=h100:8'], tmp_path)
  assert proc.returncode != 0 and r is None
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and 'valid examples' in lines[0] and 'v5p:2x2x1' in lines[0]


def test_parse_topology():
  assert compile_check.parse_topology('cpu:8') == ('cpu', 8)
  assert compile_check.parse_topology('v4:2x2x4') == ('tpu', 16)
  for bad in ('cpu:0', 'v5p', 'tpu-v5p-8', ''):
    with pytest.raises(UserError, match='valid examples'):
      compile_check.parse_topology(bad)


def test_missing_libtpu_gives_install_command():
  # libtpu made unimportable in a fresh interpreter: the message carries the install command.
  code = (
      'import sys; sys.modules["libtpu"] = None\n'
      'from tokjax import compile_check\n'
      'from tokjax.errors import UserError\n'
      'try:\n'
      '  compile_check.topology_devices("v5p:2x2x1")\n'
      'except UserError as e:\n'
      '  print(e)\n'
  )
  proc = subprocess.run(
      [sys.executable, '-c', code],
      cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT),
      capture_output=True,
      text=True,
      check=True,
  )
  assert 'needs libtpu' in proc.stdout and 'pip install' in proc.stdout
