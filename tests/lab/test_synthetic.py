"""Tests of the synthetic planted-segment corpora, the boundary F1 and the two-level experiment of
tokjax/lab/synthetic.py."""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from tokjax import boundary_stats, inspection, losses, sharding, stages
from tokjax import evaluator as evaluator_lib
from tokjax import trainer as trainer_lib
from tokjax.config import files as config_files
from tokjax.data import BOS_ID, PAD_ID
from tokjax.lab import synthetic

N_BYTES = 127


def _words(doc):
  """The document cut after every planted end (the cut-off last word, if any, is dropped)."""
  starts = np.concatenate([[0], doc.ends[:-1] + 1])
  return [doc.text[s : e + 1] for s, e in zip(starts, doc.ends)]


@pytest.mark.parametrize(
    'spec', [synthetic.CorpusSpec(), synthetic.CorpusSpec(lexicon_size=16, terminator=b'')]
)
def test_planted_ends_are_word_ends(spec):
  lexicon = synthetic.make_lexicon(np.random.default_rng(3), spec)
  docs = synthetic.make_corpus(seed=1, lexicon_seed=3, num_docs=20, n_bytes=N_BYTES, spec=spec)
  for doc in docs:
    assert len(doc.text) == N_BYTES and len(doc.copied) == N_BYTES
    words = _words(doc)
    assert b''.join(words) == doc.text[: doc.ends[-1] + 1]
    # Only the last word may be cut: what follows the last planted end is shorter than a word.
    assert N_BYTES - 1 - doc.ends[-1] < spec.max_len
    for w in words:
      assert spec.min_len <= len(w) <= spec.max_len
      if spec.terminator:
        assert w.endswith(spec.terminator) and spec.terminator not in w[: -len(spec.terminator)]
      else:
        assert w in lexicon
    if spec.terminator == b' ':  # Every space is a planted end and nothing else is.
      spaces = [i for i, c in enumerate(doc.text) if c == ord(' ')]
      assert spaces == doc.ends.tolist()


def test_copied_half_repeats_the_block_before_it():
  doc = synthetic.make_corpus(seed=2, lexicon_seed=0, num_docs=1, n_bytes=1000)[0]
  words = _words(doc)
  starts = np.concatenate([[0], doc.ends[:-1] + 1])
  flags = [bool(doc.copied[s]) for s in starts]
  runs, i = 0, 0
  while i < len(words):
    if flags[i]:
      j = i
      while j < len(words) and flags[j]:
        j += 1
      k, block = j - i, 0  # The copy's length, and the original block's (the run before it).
      while block < i and not flags[i - 1 - block]:
        block += 1
      assert 3 <= block <= 6 and (k == block or j == len(words))  # The end may cut a copy short.
      assert words[i:j] == words[i - block : i - block + k]
      runs, i = runs + 1, j
    else:
      i += 1
  assert runs >= 5
  assert 0.4 < doc.copied.mean() < 0.6


def test_deterministic_by_seed():
  a = synthetic.make_corpus(seed=5, lexicon_seed=0, num_docs=4, n_bytes=N_BYTES)
  b = synthetic.make_corpus(seed=5, lexicon_seed=0, num_docs=4, n_bytes=N_BYTES)
  c = synthetic.make_corpus(seed=6, lexicon_seed=0, num_docs=4, n_bytes=N_BYTES)
  assert [d.text for d in a] == [d.text for d in b]
  assert all(np.array_equal(x.ends, y.ends) for x, y in zip(a, b))
  assert [d.text for d in a] != [d.text for d in c]


def test_planted_rate_matches_target():
  docs = synthetic.make_corpus(seed=0, lexicon_seed=0, num_docs=200, n_bytes=N_BYTES)
  rate = np.mean([len(d.ends) for d in docs]) / N_BYTES
  assert abs(rate - 0.2) < 0.01


def _rows(docs):
  """Each document after its BOS in a row of its own: tokens, targets (PAD after the last byte)."""
  body = np.stack([np.frombuffer(d.text, np.uint8) for d in docs]).astype(np.int32)
  tokens = np.concatenate([np.full((len(docs), 1), BOS_ID, np.int32), body], axis=1)
  return tokens, np.concatenate([body, np.full((len(docs), 1), PAD_ID, np.int32)], axis=1)


def test_words_evaluation_scores_the_planted_ends_with_the_evaluator(tmp_path):
  # The 'oracle' run executes exactly the planted ends from its first step (the whitespace rule).
  c = synthetic.variant_config('oracle', '', str(tmp_path), 2, 1, 0)
  c.eval.batch_size = 4  # 6 documents: the last batch is padded.
  trainer = trainer_lib.Trainer(c, sharding.make_mesh(c.mesh))
  params = trainer.init(jax.random.PRNGKey(0)).params
  n = c.data.seq_len - 1
  docs = synthetic.make_corpus(seed=0, lexicon_seed=0, num_docs=6, n_bytes=n)
  got = synthetic.evaluate_params(
      evaluator_lib.Evaluator(trainer), params, docs, jax.random.PRNGKey(1)
  )
  # Scored on bytes 0..n-2 (the last byte's boundary is forced).
  planted = sum(int(np.sum(d.ends < n - 1)) for d in docs)
  assert got['planted_rate'] == pytest.approx(planted / (len(docs) * (n - 1)))
  for mode in ('greedy', 'sample'):
    for k in ('precision', 'recall', 'f1'):
      assert got[f'{mode}_{k}'] == 1.0
    assert got[f'{mode}_rate'] == pytest.approx(got['planted_rate'])
  # Given the planted ends, the model runs on its own boundaries; given noise, on others.
  assert got['oracle_bpb'] == pytest.approx(got['bpb'], rel=1e-6)
  assert got['oracle_copy_bpb'] == pytest.approx(got['copy_bpb'], rel=1e-6)
  assert abs(got['random_bpb'] - got['bpb']) > 1e-4
  # Bits-per-byte over all bytes and over the copied ones, by the model on rows of its own.
  tokens, targets = _rows(docs)
  out = trainer.model.apply({'params': params}, tokens, jax.random.PRNGKey(2), mode='greedy')
  ce = np.asarray(losses.cross_entropy(out.logits, targets)) * (targets < 256)
  copied = np.concatenate([np.stack([d.copied for d in docs]), np.zeros((len(docs), 1), bool)], 1)
  assert got['bpb'] == pytest.approx(ce.sum() / (targets < 256).sum() / math.log(2), rel=1e-4)
  assert got['copy_bpb'] == pytest.approx(
      (ce * copied).sum() / copied.sum() / math.log(2), rel=1e-4
  )
  short = synthetic.make_corpus(seed=0, lexicon_seed=0, num_docs=1, n_bytes=n - 1)
  with pytest.raises(synthetic.UserError):
    synthetic.evaluate_params(
        evaluator_lib.Evaluator(trainer), params, short, jax.random.PRNGKey(1)
    )


# -- the two-level design: phrases of words ---------------------------------------------------------


def foreseen_share(book) -> float:
  """The share of a book's phrases whose words before the last already tell that the next word ends
  the phrase (no other phrase goes on past it with the same words)."""

  def goes_on(q, words):
    return len(q) > len(words) + 1 and q[: len(words)] == words

  return np.mean([not any(goes_on(q, p[:-1]) for q in book if q != p) for p in book])


def test_prefix_book_shows_a_phrase_end_only_at_its_mark():
  spec = synthetic.PhraseSpec()
  assert spec.book == 'prefixes'
  lengths = spec.max_words - spec.min_words + 1
  for seed in range(3):
    book = synthetic.make_phrase_book(np.random.default_rng(seed), spec)
    assert len({tuple(p) for p in book}) == len(book) == spec.phrase_book
    assert {len(p) for p in book} == set(range(spec.min_words, spec.max_words + 1))
    # Only the longest phrase of each stem has an end its words foretell.
    assert foreseen_share(book) <= 1 / lengths + 1 / spec.phrase_book
    distinct = synthetic.make_phrase_book(
        np.random.default_rng(seed), dataclasses.replace(spec, book='distinct')
    )
    assert len(distinct) == spec.phrase_book and foreseen_share(distinct) > 0.8
  with pytest.raises(synthetic.UserError):
    synthetic.make_phrase_book(np.random.default_rng(0), dataclasses.replace(spec, book='trie'))
  with pytest.raises(synthetic.UserError):
    synthetic.make_phrase_corpus(0, 0, 1, N_BYTES, dataclasses.replace(spec, marks_by='random'))


def followers(docs) -> dict:
  """{phrase: the set of phrases that follow it} over the documents' complete phrases, leaving out
  each copy's first phrase (it follows its block's last phrase only because the block is copied)."""
  out = {}
  for doc in docs:
    starts = np.concatenate([[0], doc.phrase_ends[:-1] + 1])
    texts = [doc.text[s : e + 1] for s, e in zip(starts, doc.phrase_ends)]
    copy_starts = {dst for _, dst, _ in doc.copies}
    for a, b, start in zip(texts, texts[1:], starts[1:]):
      if start not in copy_starts:
        out.setdefault(a, set()).add(b)
  return out


def test_successor_order_follows_each_phrase_with_one_of_its_successors():
  spec = synthetic.PhraseSpec(order='successor')
  assert spec.successors == 2
  docs = synthetic.make_phrase_corpus(seed=1, book_seed=2, num_docs=50, n_bytes=N_BYTES, spec=spec)
  after = followers(docs)
  assert max(map(len, after.values())) == spec.successors and len(after) > spec.phrase_book // 2
  random = dataclasses.replace(spec, order='random')
  docs = synthetic.make_phrase_corpus(
      seed=1, book_seed=2, num_docs=50, n_bytes=N_BYTES, spec=random
  )
  assert max(map(len, followers(docs).values())) > spec.successors
  with pytest.raises(synthetic.UserError):
    synthetic.make_phrase_corpus(0, 0, 1, N_BYTES, dataclasses.replace(spec, order='markov'))


@pytest.mark.parametrize(
    'book, marks_by, order',
    [(b, m, o) for b in synthetic.BOOKS for m in synthetic.MARKS_BY for o in synthetic.ORDERS],
)
def test_phrase_corpus_has_the_planted_structure(book, marks_by, order):
  spec = synthetic.PhraseSpec(book=book, marks_by=marks_by, order=order)
  window = stages.get(config_files.load('synthetic_two_stage'), 1).window
  assert spec.min_distance > window  # The copies lie beyond the stage-1 layers' window.
  book = {b''.join(p) for p in synthetic.make_phrase_book(np.random.default_rng(2), spec)}
  assert len(book) == spec.phrase_book
  if marks_by == 'sentence':  # The document sets each phrase's mark: compare the words alone.
    book = {p[:-2] for p in book}
  docs = synthetic.make_phrase_corpus(seed=1, book_seed=2, num_docs=20, n_bytes=N_BYTES, spec=spec)
  for doc in docs:
    text = np.frombuffer(doc.text, np.uint8)
    assert len(text) == N_BYTES == len(doc.copied)
    # Words end at the spaces, and the phrases are phrases of the book, each ending a word.
    np.testing.assert_array_equal(doc.word_ends, np.flatnonzero(text == ord(' ')))
    assert set(doc.phrase_ends.tolist()) <= set(doc.word_ends.tolist())
    starts = np.concatenate([[0], doc.phrase_ends[:-1] + 1])
    cut = 2 if marks_by == 'sentence' else 0
    assert all(doc.text[s : e + 1 - cut] in book for s, e in zip(starts, doc.phrase_ends))
    if marks_by == 'sentence':  # A '.' closes each block (so one precedes each copy), ',' the rest.
      assert all(text[dst - 2] == ord('.') for _, dst, _ in doc.copies)
      assert (text == ord('.')).sum() <= 2 * len(doc.copies) + 1
      assert set(text[doc.phrase_ends - 1].tolist()) <= set(spec.marks)
    # The experiment's phrase reference marks each phrase's mark and the space after it.
    marked = np.flatnonzero(boundary_stats.phrase_end(text[None])[0])
    want = set(doc.phrase_ends.tolist()) | set((doc.phrase_ends - 1).tolist())
    if text[-1] in spec.marks:  # A mark whose space the document's end cut off.
      want.add(N_BYTES - 1)
    assert marked.tolist() == sorted(want)
    # The other side: the space before each phrase's last word (the word end before a phrase end).
    before = np.flatnonzero(boundary_stats.before_phrase_end(text[None])[0])
    ends = doc.word_ends.tolist()
    want = {ends[i - 1] for i, e in enumerate(ends) if e in set(doc.phrase_ends.tolist())}
    if text[-1] in spec.marks:  # The last phrase's space cut off: its last word still counts.
      want.add(ends[-1])
    assert before.tolist() == sorted(want) and len(want) >= len(doc.phrase_ends)
    # One word late: the space after the first word that follows each phrase end.
    first = np.flatnonzero(boundary_stats.after_phrase_start(text[None])[0])
    later = [doc.word_ends[doc.word_ends > e] for e in doc.phrase_ends]
    assert first.tolist() == [w[0] for w in later if len(w)] and len(first) >= len(later) - 1
    # Each block is copied right after itself, at least min_distance bytes later, and those bytes
    # alone are marked copied.
    assert doc.copies and doc.copied.sum() == sum(n for _, _, n in doc.copies)
    for src, dst, n in doc.copies:
      assert dst - src >= spec.min_distance and (src == 0 or src - 1 in doc.phrase_ends)
      assert doc.text[dst : dst + n] == doc.text[src : src + n] and doc.copied[dst : dst + n].all()
  again = synthetic.make_phrase_corpus(seed=1, book_seed=2, num_docs=20, n_bytes=N_BYTES, spec=spec)
  assert [d.text for d in again] == [d.text for d in docs]


def test_parse_overrides():
  got = synthetic.parse_overrides(['learned:stages.s1.estimator.lambda_rl=0.5', 'no_rl:seed=3'])
  assert got == {'learned': {'stages.s1.estimator.lambda_rl': 0.5}, 'no_rl': {'seed': 3}}
  for bad in ('learned', 'learned:stages.s1.estimator.lambda_rl', 'learned:x=not a literal'):
    with pytest.raises(synthetic.UserError):
      synthetic.parse_overrides([bad])


def test_phrase_config_applies_the_files_and_the_commands_overrides():
  c = synthetic.phrase_config(
      'no_rl', 'corpus', 4, 2, 0, {'stages.s1.estimator.gamma': 0.5}, tiny=True
  )
  assert (stages.get(c, 1).estimator.lambda_rl, stages.get(c, 1).estimator.gamma) == (0.0, 0.5)
  assert c.data.corpus == 'corpus' and c.model.stages == 2
  assert stages.get(synthetic.phrase_config('uniform', '', 4, 2, 0), 1).method == 'uniform'
  # --words: stage 0 is the whitespace rule, stage 1 still each run's own.
  given = synthetic.phrase_config('learned', '', 4, 2, 0, words=True)
  assert [st.method for st in stages.resolve(given)] == ['whitespace', 'policy']
  assert synthetic.phrase_config('learned', '', 4, 2, 0).boundary.method == 'policy'
  with pytest.raises(synthetic.UserError):
    config_files.load('synthetic_two_stage', 'learned,wrods')
  with pytest.raises(synthetic.UserError):
    synthetic.phrase_config('no_rl', '', 4, 2, 0, {'stages.no_such_field': 1})


def test_phrase_evaluation_writes_its_table(tiny_two_stage_run, tmp_path):
  # The session's trained two-stage run stands in for the experiment's (its training is the trainer's).
  ckpt = inspection.load_checkpoint(tiny_two_stage_run[0])
  n = ckpt.config.data.seq_len - 1
  texts = [d.text for d in synthetic.make_phrase_corpus(0, 0, 3, n)]
  key = jax.random.PRNGKey(0)
  ev = synthetic.evaluate_phrase_run(tiny_two_stage_run[0], texts, key, every_checkpoint=False)
  # Scored one document at a time, the counts add up to those of all documents scored together.
  whole = ckpt.evaluator.run(
      ckpt.params,
      texts,
      key,
      modes=('greedy',),
      references=synthetic.PHRASE_REFERENCES,
      counts=True,
  )['greedy']['counts']
  for s in (0, 1):
    for name in ('free', 'phrase_free', 'before_free', 'first_free'):
      assert ev['final_cols']['greedy'][f'L{s}_{name}_hits'].sum() == whole[s][name].hits
  last = ev['curve'][-1]
  assert last['step'] == ckpt.step and last['sample']['documents'] == 3
  m = last['sample']
  assert m['phrase_precision0'] == pytest.approx(
      ev['final_cols']['sample']['L0_phrase_free_hits'].sum()
      / ev['final_cols']['sample']['L0_free_hits'].sum()
  )
  probs = ev['stage1_probs']
  assert 0 <= probs['p1_phrase'] <= 1 and 0 <= probs['p1_other'] <= 1
  assert probs['p1_gap'] == pytest.approx(probs['p1_phrase'] - probs['p1_other'])
  # The phrase ends split by their mark: the mean over all of them lies between the two marks' means.
  by_mark = sorted([probs['p1_,'], probs['p1_.']])
  assert by_mark[0] - 1e-6 <= probs['p1_phrase'] <= by_mark[1] + 1e-6 and by_mark[0] < by_mark[1]
  runs = {'learned': {'wall_s': 1.0, 'overrides': {}, 'curve': ev['curve'], 'stage1_probs': probs}}
  cols = {'learned': ev['final_cols'], 'uniform': ev['final_cols']}
  comparisons = synthetic.phrase_comparisons(cols)
  # A run against itself, on each side of the phrase end and in bpb.
  assert [(c['what'], c['diff']) for c in comparisons if c['mode'] == 'sample'] == [
      ('phrase', 0.0),
      ('before', 0.0),
      ('first', 0.0),
      ('bpb', 0.0),
  ]
  # A control 0.1 bits worse on every byte: learned is 0.1 bpb better, with no spread over documents.
  worse = {
      m: dict(c, ce=c['ce'] + 0.1 * math.log(2) * c['bytes']) for m, c in cols['uniform'].items()
  }
  bpb = [c for c in synthetic.phrase_comparisons({**cols, 'uniform': worse}) if c['what'] == 'bpb']
  assert [c['mode'] for c in bpb] == list(synthetic.PHRASE_MODES)
  for c in bpb:
    assert c['diff'] == pytest.approx(-0.1) and c['se'] == pytest.approx(0.0, abs=1e-9)
  assert m['before_precision0'] == pytest.approx(
      ev['final_cols']['sample']['L0_before_free_hits'].sum()
      / ev['final_cols']['sample']['L0_free_hits'].sum()
  )
  synthetic.write_phrase_results(
      str(tmp_path),
      {
          'command': 'cmd',
          'corpus': {},
          'stage1_window': 32,
          'seq_len': n + 1,
          'steps': ckpt.step,
          'train_docs': 0,
          'eval_docs': 3,
      },
      runs,
      comparisons,
  )
  md = (tmp_path / 'results.md').read_text()
  assert '| learned | sample |' in md and '| uniform | sample |' in md
  assert '| bpb | uniform | sample | 0.0000 +- 0.0000 |' in md
  assert json.loads((tmp_path / 'results.json').read_text())['runs']['learned']['curve']
  assert (tmp_path / 'curves.png').exists()
