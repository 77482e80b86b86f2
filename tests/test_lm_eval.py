"""Tests of the lm-evaluation-harness adapter: scores equal tokjax's own cross-entropy, windows and
left truncation, is_greedy, batch invariance, the offline tasks end to end (one-stage, two-stage and
flat checkpoints), the continuation bits-per-byte of the gold however a task gives it, a task whose
gold cannot be found, sliding generation, and one-line errors."""

import itertools
import json
import logging
import math
import os
import subprocess
import sys

import jax
import lm_eval
import numpy as np
import pytest

from tokjax import evaluate, evaluator, inspection, sample, train
from tokjax.config import files as config_files
from tokjax.config import presets
from tokjax.data import BOS_ID
from tokjax.errors import UserError
from tokjax.lm_eval import model as lm_model
from tokjax.lm_eval import scoring, tasks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_DIR = os.path.join(REPO, 'tests', 'lm_eval_tasks')
ALL_TASKS = ['tokjax_mc', 'tokjax_lastword', 'tokjax_rolling', 'tokjax_generate']
# The group tokjax_gold: tokjax_mc's gold as answer text and as a list, numbers as answer text,
# multiple inputs.
GOLD_TASKS = ['tokjax_mc_text', 'tokjax_mc_list', 'tokjax_mc_digits', 'tokjax_fill']


def task_rows(name):
  with open(os.path.join(TASK_DIR, name)) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def lm(tiny_run):
  return lm_model.TokjaxLM(checkpoint=tiny_run, batch_size=8)


@pytest.fixture(scope='module')
def manager():
  return tasks.task_manager(TASK_DIR)


@pytest.fixture(scope='module')
def report(lm, manager):
  return tasks.evaluate(lm, ALL_TASKS + ['tokjax_gold'], manager)


@pytest.fixture(scope='module')
def flat_run(tmp_path_factory):
  """A flat checkpoint (configs/flat_cpu.py at the tiny size) after one training step."""
  c = presets.tiny(config_files.load('flat_cpu'))
  c.data.corpus, c.data.max_bytes = 'stdlib', 200_000
  c.data.val_fraction = c.data.test_fraction = 0.1
  c.train.steps, c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 1, 1, 1, 1
  c.train.workdir = str(tmp_path_factory.mktemp('flat_run'))
  train.train(c)
  return c.train.workdir


def test_windows_cover_every_byte_once_with_context():
  for n, c, length, overlap in itertools.product(
      (1, 5, 64, 65, 200, 301), (0, 3, 60), (64,), (0, 32)
  ):
    if c >= n:
      continue
    rows = scoring.windows(n, c, length, overlap)
    scored = np.concatenate([np.arange(first, end) for _, end, first in rows])
    np.testing.assert_array_equal(scored, np.arange(c, n))  # Each byte once, in order.
    for i, (start, end, first) in enumerate(rows):
      assert 0 <= start <= first < end <= n and end - start <= length
      if i:  # Rows after the first condition on at least `overlap` bytes.
        assert first - start >= overlap
    if n - c <= length:  # One row, as much context as fits: the left truncation.
      assert rows == [(max(0, n - length), n, c)]


def test_scores_equal_the_evaluators_per_document_ce(lm):
  """The adapter's log-likelihood of a text is tokjax's own CE on the same bytes (one row per
  document, `evaluate.one_row_documents`), and evaluate's per-document bpb is its mean."""
  ckpt, seq_len = lm.ckpt, lm.seq_len
  docs = evaluate.load_split(ckpt.config, None, 'test')['test'][:6]
  cut = ckpt.evaluator.run(
      ckpt.params,
      evaluate.one_row_documents(docs, seq_len),
      jax.random.PRNGKey(0),
      modes=('greedy',),
  )['greedy']
  texts = [d[: seq_len - 1] for d in docs]
  scores = lm.scorer.score(texts, [0] * len(texts))
  units = [(ce, n) for ce, n in zip(cut['unit_ce'], cut['unit_bytes']) if n]
  assert [n for _, n in units] == [len(t) for t in texts]
  for s, (ce, n) in zip(scores, units):
    assert -s.logprob / n == pytest.approx(ce / n, abs=1e-5)
  mean, _, count = evaluate.per_document_bpb(cut['unit_ce'], cut['unit_bytes'])
  assert count == len(texts)
  assert mean == pytest.approx(np.mean([-s.logprob / s.num_bytes for s in scores]) / math.log(2))


def test_continuation_is_the_difference_of_prefix_scores(lm):
  text = b'import os\nimport sys\n'
  whole, ctx = lm.scorer.score([text, text[:10]], [0, 0])
  cont = lm.scorer.score([text], [10])[0]
  assert cont.logprob == pytest.approx(whole.logprob - ctx.logprob, abs=1e-4)
  assert cont.num_bytes == len(text) - 10


def test_is_greedy_on_the_argmax_byte(lm):
  ctx = b'def main():\n    return'
  texts = [ctx + bytes([b]) for b in range(256)]
  scores = lm.scorer.score(texts, [len(ctx)] * 256)
  lp = np.array([s.logprob for s in scores])
  greedy = [s.is_greedy for s in scores]
  best = int(np.argmax(lp))
  assert greedy == [b == best for b in range(256)]
  # Two bytes: greedy only when the second is the argmax after the first too.
  second = lm.scorer.score([ctx + bytes([best, b]) for b in range(256)], [len(ctx)] * 256)
  lp2 = [s.logprob for s in second]
  assert [s.is_greedy for s in second] == [b == int(np.argmax(lp2)) for b in range(256)]


def test_left_truncation_reads_the_cut_text_as_training_does(lm):
  """A context longer than the window keeps its last bytes and reads them as a training window that
  starts inside a document: the byte before the predicted ones at position 0, no BOS. Only a row at
  the text's start reads BOS first."""
  n, model, params = lm.seq_len, lm.ckpt.model, lm.ckpt.params
  ctx, cont = bytes(range(65, 91)) * 10, b' end'  # 260 bytes of context: more than the window.
  text = ctx + cont
  long, kept, at_start = lm.scorer.score(
      [text, text[-(n + 1) :], text[-n:]], [len(ctx), n + 1 - len(cont), n - len(cont)]
  )
  assert long.logprob == pytest.approx(kept.logprob, abs=1e-6)  # The last n + 1 bytes.
  assert long.logprob != pytest.approx(at_start.logprob, abs=1e-6)  # BOS + the last n bytes.

  def forward_logprob(inputs):
    targets = np.frombuffer(text[-n:], np.uint8).astype(np.int32)[None]
    mask = np.zeros((1, n), np.float32)
    mask[0, -len(cont) :] = 1.0
    batch = {'inputs': np.asarray(inputs, np.int32)[None], 'targets': targets, 'mask': mask}
    ce, _ = evaluator._forward(model, 'greedy', params, batch, lm.key)  # pylint: disable=protected-access
    return -float(np.asarray(ce).sum(dtype=np.float64))

  as_training = np.frombuffer(text[-(n + 1) : -1], np.uint8)  # The model's own training reading.
  after_bos = np.concatenate([[BOS_ID], np.frombuffer(text[-n:-1], np.uint8)])
  assert long.logprob == pytest.approx(forward_logprob(as_training), abs=1e-4)
  assert at_start.logprob == pytest.approx(forward_logprob(after_bos), abs=1e-4)


def test_batch_size_does_not_change_scores(lm):
  texts = [b'x = 1\n' * k for k in range(1, 30, 3)]  # Short texts and rolling documents.
  one = scoring.Scorer(lm.ckpt, batch_size=1).score(texts, [2] * len(texts))
  eight = lm.scorer.score(texts, [2] * len(texts))
  for a, b in zip(one, eight):
    assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and a.is_greedy == b.is_greedy


def test_sampled_boundaries_combine_draws(lm):
  text, c = b'for i in range(10):\n    print(i)\n', 20
  one = scoring.Scorer(lm.ckpt, mode='sample', draws=1, key=lm.key).score([text] * 2, [c] * 2)
  four = scoring.Scorer(lm.ckpt, mode='sample', draws=4, key=lm.key).score([text], [c])[0]
  assert one[0].logprob == one[1].logprob  # The draw depends on the text, not the request order.
  assert np.isfinite(four.logprob) and four.logprob != pytest.approx(one[0].logprob, abs=1e-6)


def test_offline_tasks_end_to_end(report):
  r = report['results']
  for metric in ('acc,none', 'acc_norm,none', 'acc_bytes,none', 'cont_bpb,none'):
    assert np.isfinite(r['tokjax_mc'][metric]), metric
  assert 0 <= r['tokjax_lastword']['acc,none'] <= 1
  assert r['tokjax_rolling']['bits_per_byte,none'] > 0
  assert 'exact_match,none' in r['tokjax_generate'] and 'tokjax_generate' not in report['cont_bpb']
  assert report['cont_bpb']['tokjax_mc']['n'] == 6
  table = tasks.table(report)
  assert 'cont_bpb' in table and 'tokjax_rolling' in table


def test_continuation_bpb_by_hand(report, lm):
  """The per-sample cont_bpb of the LAMBADA-style and rolling tasks, recomputed from the task files
  with the scorer: -log2 p(' ' + last word | the rest) / its UTF-8 bytes."""
  rows = task_rows('tokjax_lastword.jsonl')
  ctx = [' '.join(r['text'].split(' ')[:-1]).encode() for r in rows]
  cont = [(' ' + r['text'].split(' ')[-1]).encode() for r in rows]
  scores = lm.scorer.score([a + b for a, b in zip(ctx, cont)], [len(a) for a in ctx])
  hand = [-s.logprob / math.log(2) / len(b) for s, b in zip(scores, cont)]
  got = report['cont_bpb']['tokjax_lastword']
  np.testing.assert_allclose(got['per_sample'], hand, rtol=1e-9)
  assert got['mean'] == pytest.approx(np.mean(hand))
  assert got['se'] == pytest.approx(np.std(hand, ddof=1) / math.sqrt(len(hand)))
  docs = [r['text'].encode() for r in task_rows('tokjax_rolling.jsonl')]
  assert max(map(len, docs)) > 2 * lm.seq_len  # Rolling windows are exercised.
  rolled = lm.scorer.score(docs, [0] * len(docs))
  np.testing.assert_allclose(
      report['cont_bpb']['tokjax_rolling']['per_sample'],
      [-s.logprob / math.log(2) / len(d) for s, d in zip(rolled, docs)],
      rtol=1e-9,
  )
  # lm-eval's own bits_per_byte of the rolling task pools the same log-likelihoods over bytes.
  pooled = -sum(s.logprob for s in rolled) / math.log(2) / sum(map(len, docs))
  assert report['results']['tokjax_rolling']['bits_per_byte,none'] == pytest.approx(pooled)


def test_gold_index_is_the_one_lm_eval_scores(manager):
  """For every target type, lm-eval's own process_results counts a sample right exactly when the
  choice of `tasks.gold_index` has the highest log-likelihood; a gold past the choices has none."""
  seen = set()
  for name in ['tokjax_mc', *GOLD_TASKS, 'tokjax_mc_badgold']:
    task = manager.load(name)['tasks'][name]
    for doc in task.test_docs():
      n = len(task.doc_to_choice(doc))
      try:
        gold = tasks.gold_index(task, doc)
      except ValueError as e:
        assert name == 'tokjax_mc_badgold' and 'not among its 4 choices' in str(e)
        gold = None
      right = [
          task.process_results(doc, [(-float(i != k), False) for i in range(n)])['acc']
          for k in range(n)
      ]
      assert right == [float(k == gold) for k in range(n)], (name, doc)
      seen.add((name, gold))
  assert ('tokjax_mc_badgold', None) in seen and ('tokjax_fill', 1) in seen


def test_continuation_bpb_of_the_gold_of_every_target_type(report, lm):
  """The per-sample cont_bpb is that of the gold continuation, recomputed from the task files: an
  index, the choice's text (a number among them), a list, numbers as text (not read as an index),
  and multiple inputs (the gold context, the one continuation)."""
  got = {k: v['per_sample'] for k, v in report['cont_bpb'].items()}
  mc = task_rows('tokjax_mc.jsonl')
  cases = {
      'tokjax_mc': [
          (f'Question: {r["question"]}\nAnswer:', ' ' + r['choices'][r['answer']]) for r in mc
      ],
      'tokjax_mc_digits': [
          (f'{r["question"]} =', ' ' + r['answer']) for r in task_rows('tokjax_mc_digits.jsonl')
      ],
      'tokjax_fill': [
          (
              r['sentence'].split('_')[0] + r[f'option{r["answer"] + 1}'],
              ' ' + r['sentence'].split('_')[1].strip(),
          )
          for r in task_rows('tokjax_fill.jsonl')
      ],
  }
  for name, pairs in cases.items():
    ctx, cont = [c.encode() for c, _ in pairs], [t.encode() for _, t in pairs]
    scores = lm.scorer.score([a + b for a, b in zip(ctx, cont)], [len(a) for a in ctx])
    hand = [-s.logprob / math.log(2) / len(b) for s, b in zip(scores, cont)]
    np.testing.assert_allclose(got[name], hand, rtol=1e-6, err_msg=name)
  for name in ('tokjax_mc_text', 'tokjax_mc_list'):  # The same requests as tokjax_mc.
    np.testing.assert_array_equal(got[name], got['tokjax_mc'], err_msg=name)
  assert {r['answer'] for r in task_rows('tokjax_fill.jsonl')} == {0, 1}
  assert 0 <= report['results']['tokjax_gold']['acc,none'] <= 1  # The group's own score.


def test_a_task_without_gold_keeps_the_run(lm, manager, caplog):
  """A task whose gold cannot be found (here one sample's gold index is past its choices) loses only
  its cont_bpb, with its reason and one warning line: its other metrics, the other tasks, the table
  and the JSON are all there."""
  with caplog.at_level(logging.WARNING, logger='absl'):
    rep = tasks.evaluate(lm, ['tokjax_mc_badgold', 'tokjax_mc'], manager, limit=5)
  r = rep['results']
  assert r['tokjax_mc_badgold']['cont_bpb,none'] == 'N/A'
  assert 0 <= r['tokjax_mc_badgold']['acc,none'] <= 0.8  # The past-the-choices sample is wrong.
  assert (
      'doc 4: its gold 4 is not among its 4 choices'
      in rep['cont_bpb']['tokjax_mc_badgold']['unscorable']
  )
  assert np.isfinite(r['tokjax_mc']['cont_bpb,none']) and rep['cont_bpb']['tokjax_mc']['n'] == 5
  warned = [m for m in caplog.messages if 'cont_bpb' in m]
  assert len(warned) == 1 and 'tokjax_mc_badgold' in warned[0] and '\n' not in warned[0]
  row = [l for l in tasks.table(rep).splitlines() if 'cont_bpb' in l]
  assert sorted('N/A' in l for l in row) == [False, True]  # tokjax_mc_badgold's and tokjax_mc's.
  assert json.loads(json.dumps(rep, default=str))['cont_bpb'].keys() == {
      'tokjax_mc',
      'tokjax_mc_badgold',
  }


def test_generation_stops_and_slides(lm):
  out = lm._generate(['import os\n', 'x'], ['\n'], 3 * lm.seq_len, 0.0, 0)  # pylint: disable=protected-access
  assert all('\n' not in t for t in out)
  # Without a stop string the text outgrows the window: the window slides.
  long = lm._generate(['import os\n'], [], 3 * lm.seq_len, 0.0, 0)[0]  # pylint: disable=protected-access
  assert len(long.encode('utf-8', errors='ignore')) <= 3 * lm.seq_len


def test_sample_num_bytes_beyond_memory_streams(lm):
  """100M bytes used to allocate [N, B, V] logits for all of them (103 GB): sliding generation
  makes them step by step in O(seq_len) memory; the first steps come at once."""
  steps = sample.stream_generation(
      lm.ckpt.model,
      lm.ckpt.params,
      b'The module ',
      10**8,
      jax.random.PRNGKey(0),
      mode='sample',
      temperature=0.8,
      top_k=40,
      cached=True,
      window=lm.seq_len,
  )
  first = list(itertools.islice(steps, 3))
  sizes = [len(new) for new, _ in first]
  assert (
      sizes[0] == lm.seq_len - 1 - len(b'The module ')
      and sizes[1:] == [lm.seq_len - 1 - lm.seq_len // 2] * 2
  )
  assert all(a.shape == (1, len(new)) for new, a in first)


@pytest.mark.parametrize('which', ['two_stage', 'flat'])
def test_two_stage_and_flat_checkpoints_run(which, request, manager):
  run = (
      request.getfixturevalue('tiny_two_stage_run')[0]
      if which == 'two_stage'
      else (request.getfixturevalue('flat_run'))
  )
  lm = lm_model.TokjaxLM(checkpoint=run, batch_size=8)
  assert lm.scorer.model.num_stages == (0 if which == 'flat' else 2)
  assert lm.scorer.forward_mode == ('sample' if which == 'flat' else 'greedy')
  rep = tasks.evaluate(lm, ['tokjax_mc', 'tokjax_generate'], manager, limit=1)
  assert np.isfinite(rep['results']['tokjax_mc']['cont_bpb,none'])
  assert 'exact_match,none' in rep['results']['tokjax_generate']


def test_bad_model_args(tiny_run, manager):
  with pytest.raises(UserError, match='unknown task'):  # What the command prints as its one line.
    tasks.check_tasks(manager, ['tokjax_mc', 'no_such_task'])
  with pytest.raises(UserError, match='does not exist'):
    lm_model.TokjaxLM(checkpoint='/nonexistent/run')
  with pytest.raises(UserError, match='needs checkpoint='):
    lm_model.TokjaxLM()
  with pytest.raises(UserError, match='needs --boundaries=sample'):
    scoring.Scorer(inspection.load_checkpoint(tiny_run), draws=2)
  assert lm_eval.api.registry.get_model('tokjax') is lm_model.TokjaxLM


def test_command_errors_are_one_line(tmp_path, tiny_run):
  """The checks that come before lm-eval's task index and the checkpoint are read."""
  blocked = tmp_path / 'no_lm_eval' / 'lm_eval'
  blocked.mkdir(parents=True)
  (blocked / '__init__.py').write_text('raise ImportError("simulated: lm-eval not installed")\n')
  cases = {
      'no checkpoint': ([], {}, '--checkpoint is required'),
      'draws without sample': ([f'--checkpoint={tiny_run}', '--draws=4'], {}, 'needs --boundaries'),
      'extra missing': (
          [f'--checkpoint={tiny_run}'],
          {'PYTHONPATH': f'{tmp_path / "no_lm_eval"}:{REPO}'},
          "pip install -e '.[eval]'",
      ),
  }
  procs = {}
  for name, (args, env, _) in cases.items():
    args = args + (['--tasks=tokjax_mc'] if not any(a.startswith('--tasks') for a in args) else [])
    procs[name] = subprocess.Popen(
        [sys.executable, '-m', 'tokjax.lm_eval', *args, f'--include_path={TASK_DIR}'],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, **({'PYTHONPATH': REPO} | env)),
    )
  for name, p in procs.items():
    _, err = p.communicate(timeout=300)
    err = err.decode(errors='replace')
    assert p.returncode == 2 and 'Traceback' not in err, (name, err[-2000:])
    lines = [l for l in err.splitlines() if l.startswith('error:')]
    assert len(lines) == 1 and cases[name][2] in lines[0], (name, err[-2000:])
