"""Executes the notebooks in notebooks/ on tiny settings (TOKJAX_TINY=1); a failing cell fails the test."""

import pathlib

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / 'notebooks').glob('*.ipynb'))


def test_all_notebooks_are_tested():
  assert {p.stem for p in NOTEBOOKS} >= {'quickstart', 'compare', 'estimator'}


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
  monkeypatch.setenv('TOKJAX_TINY', '1')
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  monkeypatch.setenv('TOKJAX_RESULTS', str(tmp_path / 'no_results'))
  nb = nbformat.read(path, as_version=4)
  nbclient.NotebookClient(
      nb, timeout=300, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}
  ).execute()
  errors = [
      o
      for c in nb.cells
      if c.cell_type == 'code'
      for o in c.get('outputs', [])
      if o.get('output_type') == 'error'
  ]
  assert not errors
