"""The lab imports from a copy of the package alone, as from a non-editable install: no module of
tokjax.lab may need the repository checkout (configs/, tests/, ...) when it is imported."""

import os
import shutil
import subprocess
import sys

import tokjax

_IMPORT_ALL = """
import importlib, sys, traceback
import tokjax
print('tokjax from', tokjax.__file__)
failed = []
for name in sys.argv[1:]:
  try:
    importlib.import_module(name)
  except Exception:
    failed.append(name)
    print(f'FAILED {name}:', traceback.format_exc(limit=-3))
sys.exit(1 if failed else 0)
"""


def _lab_modules(package_dir: str) -> list[str]:
  """tokjax.lab.X for every module file under package_dir/lab (subpackages included)."""
  out = []
  for folder, _, files in os.walk(os.path.join(package_dir, 'lab')):
    rel = os.path.relpath(folder, os.path.dirname(package_dir)).replace(os.sep, '.')
    out += [rel if f == '__init__.py' else f'{rel}.{f[:-3]}' for f in files if f.endswith('.py')]
  return sorted(out)


def test_every_lab_module_imports_from_a_copy_of_the_package(tmp_path):
  source = os.path.dirname(tokjax.__file__)
  shutil.copytree(source, tmp_path / 'tokjax', ignore=shutil.ignore_patterns('__pycache__'))
  modules = _lab_modules(str(tmp_path / 'tokjax'))
  assert 'tokjax.lab.compare' in modules and 'tokjax.lab.benchmarks.scaling' in modules
  env = dict(os.environ, PYTHONPATH=str(tmp_path), JAX_PLATFORMS='cpu')
  r = subprocess.run(
      [sys.executable, '-c', _IMPORT_ALL, *modules],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  # The copy, not the checkout (nor an editable install of it), is what was imported.
  assert f'tokjax from {tmp_path / "tokjax" / "__init__.py"}' in r.stdout, r.stdout + r.stderr
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
