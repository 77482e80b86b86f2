"""The commands' terminal behaviour: --help exits 0, config syntax errors, unknown config variants and
non-UTF-8 prompts are one `error:` line, third-party INFO logs only with --verbosity, evaluate without
`tokenizers`, and segmentation previews that cannot drive the terminal."""

import os
import subprocess
import sys

from conftest import command_lines
import numpy as np
import pytest

from tokjax import tokenization

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = (
    'tokjax.train',
    'tokjax.evaluate',
    'tokjax.sample',
    'tokjax.segment',
    'tokjax.lab.compare',
    'tokjax.lab.synthetic',
    'tokjax.lab.estimator_training',
    'tokjax.lab.estimators',
)


def _run(*args, env=None):
  return subprocess.run(
      [sys.executable, '-m', *args],
      cwd=REPO,
      capture_output=True,
      timeout=300,
      check=False,
      env=dict(os.environ, **(env or {})),
  )


def _error_lines(proc):
  err = proc.stderr.decode(errors='replace')
  assert 'Traceback' not in err, err[-3000:]
  return [l for l in err.splitlines() if l.startswith('error:')]


def test_help_of_every_command_exits_0():
  procs = {
      m: subprocess.Popen(
          [sys.executable, '-m', m, '--help'],
          cwd=REPO,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
      )
      for m in COMMANDS
  }
  for m, p in procs.items():
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, (m, err[-2000:])
    assert b'--' in out, m  # It listed flags.


def test_config_syntax_error_is_one_line(tmp_path):
  bad = tmp_path / 'bad.py'
  bad.write_text('def get_config(:\n  return None\n')
  proc = _run('tokjax.train', f'--config={bad}', f'--config.train.workdir={tmp_path}/run')
  assert proc.returncode == 2
  (line,) = _error_lines(proc)
  assert 'syntax error' in line and 'line 1' in line


def test_non_utf8_prompt_is_one_line(tmp_path):
  proc = subprocess.run(
      [
          sys.executable.encode(),
          b'-m',
          b'tokjax.sample',
          f'--checkpoint={tmp_path}'.encode(),
          b'--prompt=caf\xe9',
      ],
      cwd=REPO,
      capture_output=True,
      timeout=300,
      check=False,
  )
  assert proc.returncode == 2
  (line,) = _error_lines(proc)
  assert 'not valid UTF-8' in line


def test_evaluate_without_tokenizers_and_quiet_logs(tiny_run, tmp_path):
  shadow = tmp_path / 'shadow' / 'tokenizers'
  shadow.mkdir(parents=True)
  (shadow / '__init__.py').write_text("raise ImportError('tokenizers is not installed')\n")
  env = {
      'PYTHONPATH': os.pathsep.join([str(tmp_path / 'shadow'), os.environ.get('PYTHONPATH', REPO)])
  }
  args = ('tokjax.evaluate', f'--checkpoint={tiny_run}', '--max_batches=1', f'--out={tmp_path}/e')
  proc = _run(*args, env=env)
  out, err = proc.stdout.decode(), proc.stderr.decode()
  assert proc.returncode == 0, err[-3000:]
  assert out.count('`tokenizers` package is not installed') == 1
  assert 'BPE reference' not in out and 's.e. (ratio estimator over documents)' in out
  info = lambda text: [l for l in text.splitlines() if l[:1] == 'I' and l[1:5].isdigit()]
  assert not info(out + err)
  loud = _run(*args, '--verbosity=0', env=env)
  assert loud.returncode == 0 and info(loud.stdout.decode() + loud.stderr.decode())


def test_preview_escapes_non_printable_bytes():
  text = b'ok\x1b[2J\x07\xff\x00 caf\xc3\xa9\tend\nnext'
  actions = np.zeros(len(text))
  actions[1] = 1
  shown = tokenization.preview(text, actions)
  assert not [c for c in shown if ord(c) < 32 and c != '\t']
  assert '\\x1b' in shown and '\\xff' in shown and '\\x00' in shown and 'café' in shown
  assert shown.startswith('ok|') and '⏎next' in shown
  rendered = tokenization.render(text, actions, terminal=True)
  assert '\x1b' not in rendered and rendered.count('\n') == 1


@pytest.mark.parametrize('text', [b'plain words', 'unicod\u00e9'.encode()])
def test_terminal_render_keeps_printable_text(text):
  actions = np.zeros(len(text))
  assert tokenization.render(text, actions, terminal=True) == text.decode()


def _config_commands():
  """Every command module that defines a --config flag, found in the source."""
  found = []
  for root, _, files in os.walk(os.path.join(REPO, 'tokjax')):
    for name in files:
      path = os.path.join(root, name)
      if name.endswith('.py') and 'DEFINE_config_file(' in open(path, encoding='utf-8').read():
        found.append(os.path.relpath(path, REPO)[:-3].replace(os.sep, '.'))
  return sorted(found)


def test_unknown_config_variant_is_one_line_for_every_command_with_a_config(tmp_path):
  commands = _config_commands()
  assert 'tokjax.train' in commands and len(commands) >= 2
  procs = {
      m: subprocess.Popen(
          [sys.executable, '-m', m, '--config=configs/compare.py:nosuch'],
          cwd=REPO,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
      )
      for m in commands
  }
  for m, p in procs.items():
    _, err = p.communicate(timeout=300)
    err = err.decode(errors='replace')
    assert p.returncode == 2, (m, err[-2000:])
    assert 'Traceback' not in err, (m, err[-2000:])
    (line,) = [l for l in err.splitlines() if l.startswith('error:')]
    assert "unknown config variant 'nosuch'" in line, (m, line)


def test_unreachable_hub_is_one_line_before_training(tmp_path):
  pytest.importorskip('datasets')
  # A Hub address where nothing listens, so the test is offline wherever it runs.
  proc = _run(
      'tokjax.train',
      '--config=configs/default.py',
      '--config.data.corpus=hf:fineweb',
      f'--config.train.workdir={tmp_path}/run',
      env={'HF_ENDPOINT': 'http://127.0.0.1:9'},
  )
  assert proc.returncode == 2, proc.stderr.decode(errors='replace')[-3000:]
  (line,) = _error_lines(proc)
  assert "cannot reach the Hugging Face dataset 'HuggingFaceFW/fineweb'" in line
  assert 'compiling' not in proc.stdout.decode()


def test_prepare_into_an_unwritable_folder_is_one_line_with_the_shared_exit_code(tmp_path):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('some text\n' * 100)
  out = tmp_path / 'corpus.txt' / 'out'  # Under a file: no one can create it, root included.
  proc = _run('tokjax.data.prepare', str(corpus), '--out', str(out), '--no_progress')
  assert proc.returncode == 2
  (line,) = _error_lines(proc)
  assert line.startswith(f'error: cannot write to --out {out}')


def _bad_command_lines(tmp_path):
  """{command: [(flags, words of its one error line)]}. The run folder holds no run: a command that
  read it before checking its flags and its output place would say so instead. `blocked` is a file,
  so nothing can be made under it (tests run as root, whom a read-only folder does not stop)."""
  run, blocked, text = tmp_path / 'run', tmp_path / 'blocked', tmp_path / 'a.txt'
  under = f'--out={blocked}/out'
  evaluate = [f'--checkpoint={run}']
  segment = [f'--checkpoint={run}', str(text)]
  sample = [f'--checkpoint={run}', '--prompt=a']
  lm_eval = [f'--checkpoint={run}', '--tasks=arc_easy']
  return {
      'tokjax.evaluate': [
          ([*evaluate, under], f'cannot write to --out {blocked}/out: {blocked} is a file'),
          ([*evaluate, '--out='], '--out is empty'),
          ([*evaluate, '--max_batches=-1'], '--max_batches=-1: -1 is not a non-negative integer'),
          ([*evaluate, '--step=-2'], '--step=-2: -2 is not a non-negative integer'),
      ],
      'tokjax.segment': [
          ([*segment, under], f'cannot write to --out {blocked}/out: {blocked} is a file'),
          ([*segment, str(text)], 'takes only one FILE'),
          ([*segment, f'--file={text}'], 'both name the file'),
          ([*segment, '--seed=-1'], '--seed=-1: -1 is not a non-negative integer'),
          ([*segment, '--png_bytes=0'], '--png_bytes=0: 0 is not'),
      ],
      'tokjax.sample': [
          ([*sample, '--temperature=nan'], '--temperature=nan must be a finite number'),
          ([*sample, '--temperature=inf'], '--temperature=inf must be a finite number'),
          ([*sample, '--seed=-1'], '--seed=-1: -1 is not a non-negative integer'),
      ],
      'tokjax.lm_eval.__main__': [
          ([*lm_eval, under], f'cannot write to --out {blocked}/out: {blocked} is a file'),
          (
              [*lm_eval, '--include_path=/nonexistent'],
              '--include_path /nonexistent is not a folder',
          ),
          ([*lm_eval, '--limit=nan'], '--limit=nan must be a finite number'),
          ([*lm_eval, '--batch_size=0'], '--batch_size=0: 0 is not'),
          ([*lm_eval, '--boundaries=sample', '--draws=0'], '--draws=0: 0 is not'),
      ],
      'tokjax.export.__main__': [
          ([f'--checkpoint={run}', under], f'cannot write to --out {blocked}/out'),
          ([f'--import={run}', under], f'cannot write to --out {blocked}/out'),
          ([f'--checkpoint={run}', '--out='], '--out is empty'),
          ([f'--checkpoint={run}', '--step=-1'], '--step=-1: -1 is not a non-negative integer'),
      ],
  }


@pytest.mark.parametrize(
    'command',
    [
        'tokjax.evaluate',
        'tokjax.segment',
        'tokjax.sample',
        'tokjax.lm_eval.__main__',
        'tokjax.export.__main__',
    ],
)
def test_bad_flags_and_output_places_are_one_line_before_the_work(command, tmp_path):
  (tmp_path / 'run').mkdir()
  (tmp_path / 'blocked').write_text('a file')
  (tmp_path / 'a.txt').write_text('some text to segment\n')
  cases = _bad_command_lines(tmp_path)[command]
  before = sorted(p.name for p in tmp_path.rglob('*'))
  for (code, err), (args, words) in zip(command_lines(command, [a for a, _ in cases]), cases):
    assert code == 2 and 'Traceback' not in err, (args, err[-2000:])
    lines = [l for l in err.splitlines() if l.startswith('error:')]
    assert len(lines) == 1 and words in lines[0], (args, err[-2000:])
  assert sorted(p.name for p in tmp_path.rglob('*')) == before  # Nothing written, nor left over.


def test_export_and_import_without_the_extra_print_the_install_line(tmp_path):
  argvs = [
      [f'--checkpoint={tmp_path}', f'--out={tmp_path}/out'],
      [f'--import={tmp_path}', f'--out={tmp_path}/out'],
  ]
  missing = ('safetensors', 'torch', 'transformers')
  for code, err in command_lines('tokjax.export.__main__', argvs, missing=missing):
    assert code == 2 and 'Traceback' not in err, err[-2000:]
    (line,) = [l for l in err.splitlines() if l.startswith('error:')]
    assert "is missing): pip install -e '.[export]'" in line, line
  assert not os.path.exists(f'{tmp_path}/out')
