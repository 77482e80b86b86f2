r"""The synthetic learning check: a corpus with planted segments, and how well learned boundaries find them.

  python -m tokjax.lab.synthetic [--steps 800] [--out results/synthetic]
  python -m tokjax.lab.synthetic --design phrases [--steps 600] [--out results/synthetic/phrases]

THE CORPUS (`CorpusSpec`). Words of min_len..max_len bytes (mean 5, so the planted segment rate is the
target rate 0.2): by default fresh random lowercase letters closed by a space (`--lexicon_size N` draws
them from a fixed random N-word lexicon instead, `--terminator ''` drops the space). A document is a
run of blocks: k random words (k uniform in min_block..max_block) followed by an exact copy of the
same k words. Every document is exactly seq_len - 1 bytes (its last word may be cut), so with its BOS
it fills one training window and no window straddles two documents. The planted segment ends are the
indices of the last byte of every complete word (the spaces, by default). The copy is there to make
placement matter: inside a copy the next word is fixed by the first copy, tens of bytes back, beyond
the byte layers' 8-byte window, so only the chunk network can carry it, and a chunk whose encoder
window covers exactly one whole word is the same chunk in both copies (an exact match for attention),
while chunks cut mid-word differ between the copies.

THE EXPERIMENT. Writes the training corpus to WORKDIR/corpus/ (one file per document: the trainer
reads the folder as config.data.corpus) and trains each run, a variant of configs/synthetic_cpu.py
(`--config configs/synthetic_cpu.py:RUN`), with `tokjax.train.train` in WORKDIR/RUN:
  method   the score-function policy (the method under test);
  control  the same with estimator.lambda_rl = 0: no policy gradient, boundaries stay Bernoulli(0.2)
           noise (the rate loss only holds the rate);
  oracle   the 'whitespace' rule, which executes exactly the planted ends when words end in a space;
  uniform  the 'uniform' rival: round(0.2 L) boundaries at random positions.
A finished run (checkpoint at --steps) is reused, not retrained. Every checkpoint (every --eval_every
steps) is then evaluated by its Evaluator on fresh held-out documents (another seed): boundary
precision / recall / F1 against the planted ends (greedy p > 0.5 and sampled boundaries, scored on
bytes 0..L-3: the last position is forced), the boundary rate, and bits-per-byte with the run's own
sampled boundaries (the same draw) and with *given* boundaries -- the planted ends ('oracle_bpb') and
Bernoulli noise at the planted rate ('random_bpb'); 'copy_' variants count only the bytes of copied
halves. Writes OUT/results.json and
OUT/results.md (F1 and bpb against steps, per run).

THE TWO-LEVEL DESIGN (`--design phrases`; `PhraseSpec`, `phrase_experiment`). Words of a fixed
lexicon, each closed by a space, in phrases of a fixed phrase book, each closed by ',' or '.'
('word, ' ends a phrase); blocks of phrases of at least min_distance bytes, each followed by its
exact copy, so a copied phrase's original lies beyond the stage-1 layers' window
(configs/synthetic_two_stage.py: 32 bytes). The book holds every stem at every length, so a
phrase's end shows only at its mark (`--book distinct`: the corpus of the results before
results/synthetic/README.md); `--marks_by sentence` and `--order successor` are two variants
(`PhraseSpec`). Runs: the variants of configs/synthetic_two_stage.py
(learned, uniform, no_rl), trained in WORKDIR/RUN by `common.train_or_load`; `--set
RUN:path=VALUE` overrides a config field of one run. Every checkpoint is scored by the run's
Evaluator on fresh held-out documents, one document at a time, against the phrase
reference (`PHRASE_REFERENCES`): the share of stage-1 chunk ends at phrase ends, against its chance
level (the share of the run's own stage-0 chunk ends there), each with its standard error over
documents, and the learned run's difference to each control paired over the same documents; the
same one word before phrase ends (`PHRASE_SIDES`: a chunk can close a phrase on either side, as a
stage-0 chunk can close a word on either side of its space); and bits-per-byte, learned minus each
control paired over documents, which says whether stage 1's placement changes the loss at all.
`--words` makes stage 0 the whitespace rule in every run, so that the runs differ in stage 1 alone
and stage 1's chance level is the same. Writes OUT/results.{md,json} and OUT/curves.png.
"""

import ast
import dataclasses
import json
import math
import os
import sys
import time

from absl import flags, logging
import jax
import numpy as np

from tokjax import boundary_stats, cli, inspection, significance, stages, tokenization
from tokjax import train as train_lib
from tokjax.config import files as config_files
from tokjax.config import validation as config_validation
from tokjax.errors import UserError
from tokjax.lab import common


def run_names() -> tuple[str, ...]:
  """The runs: the variants of configs/synthetic_cpu.py."""
  return tuple(config_files.load_module('synthetic_cpu').VARIANTS)


def phrase_run_names() -> tuple[str, ...]:
  """The runs of the two-level design: the variants of configs/synthetic_two_stage.py."""
  return tuple(config_files.load_module('synthetic_two_stage').VARIANTS)


# The choices of PhraseSpec.book, .marks_by and .order (documented there); the first is the default.
BOOKS = ('prefixes', 'distinct')
MARKS_BY = ('book', 'sentence')
ORDERS = ('random', 'successor')

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _STEPS = flags.DEFINE_integer('steps', 800, 'Training steps of each run.')
  _DESIGN = flags.DEFINE_enum(
      'design',
      'words',
      ['words', 'phrases'],
      'words: planted word ends, one stage (configs/synthetic_cpu.py); phrases: words in phrases, '
      'two stages (configs/synthetic_two_stage.py).',
  )
  _OUT = flags.DEFINE_string(
      'out',
      '',
      'Results folder (results.md, results.json; default results/synthetic, for phrases '
      'results/synthetic/phrases).',
  )
  _WORKDIR = flags.DEFINE_string(
      'workdir',
      '',
      'Folder of the generated corpus and the training runs, kept out of the results folder '
      '(default runs/synthetic, for phrases runs/synthetic_phrases).',
  )
  _TINY = flags.DEFINE_bool('tiny', False, 'phrases: tiny models (smoke tests).')
  _WORDS = flags.DEFINE_bool(
      'words',
      False,
      'phrases: stage 0 is the whitespace rule in every run (the words given), so the runs differ '
      'in stage 1 alone (configs/synthetic_two_stage.py, option words).',
  )
  _BOOK = flags.DEFINE_enum(
      'book',
      BOOKS[0],
      BOOKS,
      "phrases: how the phrase book is drawn (PhraseSpec.book): 'prefixes' = every stem at every "
      "length, so a phrase's end shows only at its mark; 'distinct' = independent phrases, whose "
      'first words foretell the end (the book of the results before it).',
  )
  _MARKS_BY = flags.DEFINE_enum(
      'marks_by',
      MARKS_BY[0],
      MARKS_BY,
      "phrases: PhraseSpec.marks_by: 'book' = each phrase's own random mark; 'sentence' = '.' "
      "closes each block and its copy, ',' every other phrase.",
  )
  _ORDER = flags.DEFINE_enum(
      'order',
      ORDERS[0],
      ORDERS,
      "phrases: PhraseSpec.order: 'random' = each phrase followed by any phrase of the book; "
      "'successor' = by one of its 2 fixed successors.",
  )
  _SET = flags.DEFINE_multi_string(
      'set',
      [],
      'phrases: RUN:path.to.field=VALUE sets a config field of one run on top of '
      'configs/synthetic_two_stage.py (repeatable).',
  )
  _EVAL_EVERY = flags.DEFINE_integer(
      'eval_every', 100, 'Checkpoint and evaluate every this many steps.'
  )
  _TRAIN_DOCS = flags.DEFINE_integer('train_docs', 4000, 'Training corpus documents.')
  _EVAL_DOCS = flags.DEFINE_integer(
      'eval_docs', 128, 'Held-out documents scored at every checkpoint.'
  )
  _RUNS = flags.DEFINE_list(
      'runs',
      [],
      'Runs to train (default all): words: some of '
      + ','.join(run_names())
      + '; phrases: some of '
      + ','.join(phrase_run_names())
      + '.',
  )
  _SEED = flags.DEFINE_integer('seed', 0, 'Seed of the corpus and the runs.')
  _LEXICON = flags.DEFINE_integer(
      'lexicon_size', 0, 'Words from a fixed lexicon of this size (0 = fresh ' 'random words).'
  )
  _TERMINATOR = flags.DEFINE_string(
      'terminator',
      ' ',
      "Bytes ending every word ('' = undelimited; the " 'oracle run needs a space).',
  )

LETTERS = b'abcdefghijklmnopqrstuvwxyz'


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """The generator's knobs. Word lengths (terminator included) are uniform in min_len..max_len, so
  the planted rate is about 2 / (min_len + max_len) (0.2 by default, the target rate).

  lexicon_size: 0 = every word is fresh random letters (only a copy makes it predictable);
    N > 0 = words are drawn from a fixed random lexicon of N words.
  terminator: bytes closing every word (b'' = undelimited).
  """

  lexicon_size: int = 0
  min_len: int = 3
  max_len: int = 7
  min_block: int = 3
  max_block: int = 6
  terminator: bytes = b' '


@dataclasses.dataclass(frozen=True)
class Document:
  """text: the document's bytes; ends: int32[n_words] index of the last byte of each complete word
  (ascending); copied: bool[len(text)] marks bytes of the copy half of a block (predictable from
  the first half)."""

  text: bytes
  ends: np.ndarray
  copied: np.ndarray


def _random_word(rng: np.random.Generator, spec: CorpusSpec) -> bytes:
  n = int(rng.integers(spec.min_len, spec.max_len + 1)) - len(spec.terminator)
  return bytes(LETTERS[i] for i in rng.integers(0, len(LETTERS), n)) + spec.terminator


def make_lexicon(rng: np.random.Generator, spec: CorpusSpec) -> list[bytes]:
  """`spec.lexicon_size` distinct random words (terminator included); [] for fresh words."""
  words: set[bytes] = set()
  while len(words) < spec.lexicon_size:
    words.add(_random_word(rng, spec))
  return sorted(words)


def make_document(
    rng: np.random.Generator, lexicon: list[bytes], n_bytes: int, spec: CorpusSpec
) -> Document:
  """One document of exactly n_bytes bytes: blocks of k words, each followed by its copy. Words come
  from `lexicon`, or are fresh random words when it is empty."""
  words, copied = [], []
  total = 0
  while total < n_bytes:
    k = int(rng.integers(spec.min_block, spec.max_block + 1))
    if lexicon:
      block = [lexicon[i] for i in rng.integers(0, len(lexicon), k)]
    else:
      block = [_random_word(rng, spec) for _ in range(k)]
    for is_copy in (False, True):
      words += block
      copied += [is_copy] * k
      total += sum(map(len, block))
  text = b''.join(words)[:n_bytes]
  ends = np.cumsum([len(w) for w in words]) - 1
  keep = ends < n_bytes
  copied_bytes = np.repeat(np.asarray(copied), [len(w) for w in words])[:n_bytes]
  return Document(text=text, ends=ends[keep].astype(np.int32), copied=copied_bytes)


def make_corpus(
    seed: int, lexicon_seed: int, num_docs: int, n_bytes: int, spec: CorpusSpec = CorpusSpec()
) -> list[Document]:
  """num_docs documents drawn with `seed` (over the lexicon drawn with `lexicon_seed`, if any)."""
  lexicon = make_lexicon(np.random.default_rng(lexicon_seed), spec)
  rng = np.random.default_rng(seed)
  return [make_document(rng, lexicon, n_bytes, spec) for _ in range(num_docs)]


@dataclasses.dataclass(frozen=True)
class PhraseSpec:
  """The two-level generator's knobs. Words: `lexicon_size` fixed random words of min_len..max_len
  bytes, each closed by a space. Phrases: a fixed book of `phrase_book` phrases of min_words..max_words
  lexicon words, each closed by one of `marks` (its last word reads 'word, ' or 'word. ': the mark
  sits before the word's space). A block: phrases drawn from the book until it holds at least
  min_distance bytes, then followed by an exact copy of itself, so every copied byte sits
  min_distance bytes or more after its original, beyond a stage-1 window of fewer bytes.

  book: 'prefixes' = the book is built from random stems of max_words words, each present at every
    length min_words..max_words (its prefixes, each with a mark of its own), so that before the mark
    the words so far seldom tell whether the phrase ends at the next word: the phrase end is seen,
    not foreseen. 'distinct' = independent random phrases, whose first words fix the whole phrase,
    its length included, so a chunk can close a phrase one word early (at the space before its last
    word) as surely as at its mark: the two sides of a phrase end, as a word has two sides of its
    space.
  marks_by: 'book' = every phrase keeps the book's mark, drawn at random. 'sentence' = a block is a
    sentence: its last phrase closes with the last of `marks` ('.'), every other with the first
    (','), so a '.' says that the block's copy may begin, which only the main layers can read, and
    only from a stage-1 chunk ending at the '.' (measured: it drew no more stage-1 ends to '.' than
    to ','; results/synthetic/README.md).
  order: 'random' = every phrase drawn from the whole book. 'successor' = every phrase of the book
    has `successors` fixed successors, and the phrase after a phrase (a block's first phrase
    included; a copy repeats its block) is one of them, so what follows a phrase depends on the
    whole phrase, which with the prefix book only its mark reveals (measured: bpb falls to 0.08, and
    where stage 1 ends its chunks still changes it by 0.003 at most).
  """

  lexicon_size: int = 64
  min_len: int = 3
  max_len: int = 7
  phrase_book: int = 32
  min_words: int = 2
  max_words: int = 4
  marks: bytes = b',.'
  min_distance: int = 40
  book: str = BOOKS[0]
  marks_by: str = MARKS_BY[0]
  order: str = ORDERS[0]
  successors: int = 2

  def __post_init__(self):
    for field, choices in (('book', BOOKS), ('marks_by', MARKS_BY), ('order', ORDERS)):
      if getattr(self, field) not in choices:
        raise UserError(
            f'unknown PhraseSpec.{field} {getattr(self, field)!r}; use one of {", ".join(choices)}.'
        )


@dataclasses.dataclass(frozen=True)
class PhraseDocument:
  """text: the document's bytes; word_ends, phrase_ends: int32[n] indices of the last byte of each
  complete word (its space) and of each complete phrase (its last word's space; ascending);
  copied: bool[len(text)] marks bytes of a block's copy; copies: (source start, copy start, bytes)
  of each block's copy (cut at the document's end)."""

  text: bytes
  word_ends: np.ndarray
  phrase_ends: np.ndarray
  copied: np.ndarray
  copies: tuple[tuple[int, int, int], ...]


def make_phrase_book(rng: np.random.Generator, spec: PhraseSpec) -> list[list[bytes]]:
  """`spec.phrase_book` distinct phrases, each a list of words; a phrase's last word carries its
  mark before the space (`spec.book` says how the phrases are drawn)."""
  lexicon = make_lexicon(
      rng, CorpusSpec(lexicon_size=spec.lexicon_size, min_len=spec.min_len, max_len=spec.max_len)
  )

  def words(n):
    return [lexicon[i] for i in rng.integers(0, len(lexicon), n)]

  def closed(phrase):
    mark = spec.marks[int(rng.integers(0, len(spec.marks)))]
    return tuple(phrase[:-1]) + (phrase[-1][:-1] + bytes([mark]) + b' ',)

  # Insertion-ordered, so the book does not depend on hashing.
  book: dict[tuple[bytes, ...], None] = {}
  stems: set[tuple[bytes, ...]] = set()
  while len(book) < spec.phrase_book:
    if spec.book == 'distinct':
      book.setdefault(closed(words(int(rng.integers(spec.min_words, spec.max_words + 1)))), None)
      continue
    stem = tuple(words(spec.max_words))
    if stem[: spec.min_words] in stems:  # Its prefixes would repeat another stem's.
      continue
    stems.add(stem[: spec.min_words])
    for n in range(spec.min_words, spec.max_words + 1):
      if len(book) < spec.phrase_book:
        book[closed(stem[:n])] = None
  return [list(p) for p in sorted(book)]


def make_phrase_document(
    rng: np.random.Generator,
    book: list[list[bytes]],
    n_bytes: int,
    spec: PhraseSpec,
    successors: np.ndarray | None = None,
) -> PhraseDocument:
  """One document of exactly n_bytes bytes: blocks of phrases from `book`, each block followed by
  its copy (see PhraseSpec); successors: int[len(book), k], the phrases that may follow each
  (order 'successor'), or None (order 'random')."""
  phrases, copies, total = [], [], 0
  last = None  # Index of the phrase before the next one drawn.
  while total < n_bytes:
    block, size = [], 0
    while size < spec.min_distance:
      if successors is None or last is None:
        last = int(rng.integers(0, len(book)))
      else:
        last = int(successors[last, rng.integers(0, successors.shape[1])])
      block.append(book[last])
      size += sum(map(len, block[-1]))
    if spec.marks_by == 'sentence':
      marks = [spec.marks[0]] * (len(block) - 1) + [spec.marks[-1]]
      block = [p[:-1] + [p[-1][:-2] + bytes([m]) + b' '] for p, m in zip(block, marks)]
    phrases += block + block
    copies.append((total, total + size, max(0, min(size, n_bytes - total - size))))
    total += 2 * size
  words = [w for p in phrases for w in p]
  text = b''.join(words)[:n_bytes]
  word_ends = np.cumsum([len(w) for w in words]) - 1
  phrase_ends = np.cumsum([sum(map(len, p)) for p in phrases]) - 1
  copied = np.zeros(n_bytes, bool)
  for _, start, size in copies:
    copied[start : start + size] = True
  return PhraseDocument(
      text=text,
      word_ends=word_ends[word_ends < n_bytes].astype(np.int32),
      phrase_ends=phrase_ends[phrase_ends < n_bytes].astype(np.int32),
      copied=copied,
      copies=tuple(c for c in copies if c[2] > 0),
  )


def make_phrase_corpus(
    seed: int, book_seed: int, num_docs: int, n_bytes: int, spec: PhraseSpec = PhraseSpec()
) -> list[PhraseDocument]:
  """num_docs documents drawn with `seed` over the phrase book drawn with `book_seed`."""
  book_rng = np.random.default_rng(book_seed)
  book = make_phrase_book(book_rng, spec)
  successors = None
  if spec.order == 'successor':  # Distinct successors of each phrase, fixed with the book.
    successors = np.stack(
        [book_rng.choice(len(book), spec.successors, replace=False) for _ in book]
    )
  rng = np.random.default_rng(seed)
  return [make_phrase_document(rng, book, n_bytes, spec, successors) for _ in range(num_docs)]


def write_corpus(folder: str, docs) -> None:
  """One file per document (doc_00000.txt, ...), the folder layout `config.data.corpus` reads."""
  os.makedirs(folder, exist_ok=True)
  for i, d in enumerate(docs):
    with open(os.path.join(folder, f'doc_{i:05d}.txt'), 'wb') as f:
      f.write(d.text)


def planted_mask(doc: Document) -> np.ndarray:
  """bool[len(text)]: True at each planted segment end."""
  m = np.zeros(len(doc.text), bool)
  m[doc.ends] = True
  return m


def evaluate_params(evaluator, params, docs: list[Document], key) -> dict:
  """Boundary F1 (greedy and sampled) against the planted ends, and bits-per-byte with the model's
  sampled boundaries, the oracle boundaries and random ones at the planted rate (all bytes, and the
  copied bytes only), all by the run's `tokjax.evaluator.Evaluator` (each document of seq_len - 1
  bytes fills one row). Boundary positions scored: bytes 0..L-3 (the unforced positions; the last
  byte's boundary is forced).
  """
  n = evaluator.config.data.seq_len - 1
  if any(len(d.text) != n for d in docs):
    raise UserError(f'held-out documents must be seq_len - 1 = {n} bytes long.')
  planted = [planted_mask(d) for d in docs]
  planted_rate = float(np.mean([m[:-1] for m in planted]))
  k_random, k_eval = jax.random.split(key)
  noise = [
      np.asarray(jax.random.bernoulli(jax.random.fold_in(k_random, i), planted_rate, (n,)))
      for i in range(len(docs))
  ]
  oracle = boundary_stats.stream_reference(planted)
  r = evaluator.run(
      params,
      [d.text for d in docs],
      k_eval,
      modes=('greedy', 'sample'),
      references={
          'free': boundary_stats.unforced,
          'planted': both(oracle, boundary_stats.unforced),
      },
      counts=True,
      given={'oracle': oracle, 'random': boundary_stats.stream_reference(noise)},
      subsets={'copy': [d.copied for d in docs]},
  )
  out = {}
  for mode in ('greedy', 'sample'):
    c = r[mode]['counts'][0]  # Chunk ends at unforced positions, those on planted ends.
    f1 = boundary_stats.Counts(
        hits=c['planted'].hits, ends=c['free'].hits, refs=c['planted'].refs, valid=c['free'].refs
    )
    out.update(
        {f'{mode}_{k}': float(getattr(f1, k)) for k in ('precision', 'recall', 'f1', 'rate')}
    )
  out['bpb'], out['copy_bpb'] = r['sample']['bpb'], r['sample']['copy_bpb']
  for name in ('oracle', 'random'):
    out[f'{name}_bpb'], out[f'{name}_copy_bpb'] = r[name]['bpb'], r[name]['copy_bpb']
  out['planted_rate'] = planted_rate
  return out


def variant_config(name: str, corpus: str, workdir: str, steps: int, eval_every: int, seed: int):
  """configs/synthetic_cpu.py:NAME with the command's corpus, seed, schedule and run folder."""
  if name not in run_names():
    raise UserError(f'unknown run {name!r}; use some of {",".join(run_names())}.')
  c = config_files.load('synthetic_cpu', name)
  _set_run(c, corpus, seed, steps, eval_every)
  c.train.workdir = os.path.join(workdir, name)
  return c


def _set_run(c, corpus: str, seed: int, steps: int, eval_every: int) -> None:
  """The command's corpus, seed and schedule; a checkpoint at every evaluation, all of them kept
  (each evaluation's boundaries are read back from its checkpoint)."""
  c.data.corpus = corpus
  c.seed = seed
  c.train.update(
      steps=steps,
      eval_every=eval_every,
      checkpoint_every=eval_every,
      keep_checkpoints=steps // eval_every + 2,
  )


def evaluate_run(config, docs: list[Document], seed: int) -> list[dict]:
  """Evaluates every checkpoint of a finished run on the held-out docs: [{'step': s, ...metrics}]
  in step order."""
  ckpt = inspection.load_checkpoint(config.train.workdir)
  key = jax.random.PRNGKey(seed + 1)
  ev = ckpt.evaluator
  rows = [dict(step=s, **evaluate_params(ev, ckpt.at(s).params, docs, key)) for s in ckpt.steps()]
  # Step 0 (the initial policy) from a fresh init, as the starting point of the curve.
  state0 = ckpt.trainer.init(jax.random.split(jax.random.PRNGKey(config.seed), 3)[0])
  rows.insert(0, dict(step=0, **evaluate_params(ev, state0.params, docs, key)))
  return rows


def _spec_dict(spec: CorpusSpec) -> dict:
  return dict(dataclasses.asdict(spec), terminator=spec.terminator.decode())


def write_results(out: str, command: str, spec: CorpusSpec, curves: dict, seconds: dict) -> None:
  """results.json and results.md (a table per run: F1 vs steps)."""
  lines = [
      '# Synthetic learning check: learned boundaries vs planted word ends',
      '',
      f'Command: `{command}`',
      '',
      f'Corpus: {_spec_dict(spec)}; see tokjax/lab/synthetic.py.',
      '',
      'F1 = boundary F1 against the planted word ends on held-out documents (greedy: p > 0.5; '
      "sample: drawn as in training). bpb: with the run's own sampled boundaries; oracle / "
      'random bpb: the same model run with the planted ends / Bernoulli noise at the planted '
      'rate as given boundaries; copy: on bytes of the copied half only.',
      '',
  ]
  cols = [
      'step',
      'greedy_f1',
      'greedy_precision',
      'greedy_recall',
      'greedy_rate',
      'sample_f1',
      'sample_rate',
      'bpb',
      'copy_bpb',
      'oracle_bpb',
      'random_bpb',
      'oracle_copy_bpb',
      'random_copy_bpb',
  ]
  for name, rows in curves.items():
    lines += [
        f'## {name} (trained in {seconds.get(name, float("nan")):.0f} s)',
        '',
        *common.table(
            ' | '.join(cols),
            (' | '.join([str(r['step'])] + [f'{r[c]:.3f}' for c in cols[1:]]) for r in rows),
        ),
        '',
    ]
  data = {
      'command': command,
      'corpus': _spec_dict(spec),
      'train_seconds': seconds,
      'curves': curves,
  }
  common.write_results(out, data, lines)


# -- the two-level design: phrases of words ---------------------------------------------------------


def both(a, b):
  """The reference that marks a byte where references a and b both do (e.g.
  `both(ref, boundary_stats.unforced)`: ref at unforced positions only)."""
  return lambda tokens, positions=None: a(tokens, positions) & b(tokens, positions)


# Scored at every level through the Evaluator: a chunk end's hits on 'free' count the chunk ends at
# unforced positions, on 'phrase_free' those of them at phrase ends (`boundary_stats.phrase_end`:
# the mark or the space after it), on 'before_free' those one word before a phrase end (the space
# before its last word), on 'first_free' those one word after it (the space after the next phrase's
# first word), on 'word_free' those at spaces.
PHRASE_REFERENCES = {
    'phrase': boundary_stats.phrase_end,
    'free': boundary_stats.unforced,
    'phrase_free': both(boundary_stats.phrase_end, boundary_stats.unforced),
    'before_free': both(boundary_stats.before_phrase_end, boundary_stats.unforced),
    'first_free': both(boundary_stats.after_phrase_start, boundary_stats.unforced),
    'word_free': both(boundary_stats.whitespace, boundary_stats.unforced),
}
# Where a stage-1 chunk can close a phrase: at its end (the mark or the space after it), one word
# early, before its last word, or one word late, after the next phrase's first word. Like stage 0's
# two sides of a word ('word |next' or 'word| next'), each carries a phrase's span at a fixed offset;
# the experiment reports each against its own chance level.
PHRASE_SIDES = {'phrase': 'phrase_free', 'before': 'before_free', 'first': 'first_free'}
OTHER_SIDES = {k: v for k, v in PHRASE_SIDES.items() if k != 'phrase'}  # Scored as '{side}_*'.
PHRASE_MODES = ('greedy', 'sample')


def parse_overrides(entries) -> dict[str, dict]:
  """['RUN:path.to.field=VALUE', ...] -> {RUN: {'path.to.field': value}} (VALUE a Python literal)."""
  out: dict[str, dict] = {}
  for e in entries:
    run, sep, rest = e.partition(':')
    path, eq, text = rest.partition('=')
    if not (sep and eq and run and path):
      raise UserError(f'--set {e!r}: write RUN:path.to.field=VALUE.')
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      raise UserError(f'--set {e!r}: {text!r} is not a Python literal.') from None
    out.setdefault(run, {})[path] = value
  return out


def phrase_config(
    name: str,
    corpus: str,
    steps: int,
    eval_every: int,
    seed: int,
    overrides=None,
    tiny=False,
    words=False,
):
  """configs/synthetic_two_stage.py:NAME[,tiny][,words] with the command's corpus, seed and
  schedule, and the command's extra overrides of that run ({'path.to.field': value}) on top of the
  file's."""
  if name not in phrase_run_names():
    raise UserError(f'unknown run {name!r}; use some of {",".join(phrase_run_names())}.')
  options = [o for o, on in (('tiny', tiny), ('words', words)) if on]
  c = config_files.load('synthetic_two_stage', ','.join([name, *options]))
  try:
    config_files.set_fields(c, overrides or {})
  except (KeyError, AttributeError, TypeError) as e:
    raise UserError(f'run {name}: cannot set {overrides}: {e}.') from None
  _set_run(c, corpus, seed, steps, eval_every)
  config_validation.validate(c)
  return c


def per_document_counts(evaluator, params, texts, key, modes=PHRASE_MODES) -> dict:
  """Each document scored alone by the Evaluator (so every statistic has a per-document value).

  Returns {mode: {'ce', 'bytes': float64[D], and per level s and reference r of PHRASE_REFERENCES
  'L{s}_{r}_hits', 'L{s}_{r}_refs': float64[D]}} (boundary_stats.Counts of document d alone).
  """
  out: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
  for d, text in enumerate(texts):
    r = evaluator.run(
        params,
        [text],
        jax.random.fold_in(key, d),
        modes=modes,
        references=PHRASE_REFERENCES,
        counts=True,
    )
    for m in modes:
      row = {'ce': r[m]['unit_ce'][0], 'bytes': r[m]['unit_bytes'][0]}
      for s, level in enumerate(r[m]['counts']):
        for name, c in level.items():
          row[f'L{s}_{name}_hits'], row[f'L{s}_{name}_refs'] = float(c.hits), float(c.refs)
      for k, v in row.items():
        out[m].setdefault(k, []).append(v)
  return {m: {k: np.asarray(v, np.float64) for k, v in cols.items()} for m, cols in out.items()}


def phrase_summary(cols: dict) -> dict:
  """The table's numbers of one run and mode from its `per_document_counts` columns: bpb; stage-0
  rate, word precision / recall and phrase precision (the chance level of stage 1); stage-1 rate
  (per stage-0 chunk), phrase precision and recall, and its lift over chance (paired over
  documents); the same precisions and lift one word before phrase ends ('before_*') and one word
  after them ('first_*'); each share
  with its standard error over documents. Unforced positions only."""
  free0, free1 = cols['L0_free_hits'], cols['L1_free_hits']
  bpb, bpb_se = significance.ratio_and_se(cols['ce'], cols['bytes'])
  m = {'bpb': bpb, 'bpb_se': bpb_se, 'documents': len(free0)}
  for key, (num, den) in {
      'rate0': (free0, cols['L0_free_refs']),
      'word_precision0': (cols['L0_word_free_hits'], free0),
      'word_recall0': (cols['L0_word_free_hits'], cols['L0_word_free_refs']),
      'phrase_precision0': (cols['L0_phrase_free_hits'], free0),
      'rate1': (free1, free0),
      'phrase_precision1': (cols['L1_phrase_free_hits'], free1),
      'phrase_recall1': (cols['L1_phrase_free_hits'], cols['L1_phrase_free_refs']),
      **{
          f'{side}_precision{s}': (cols[f'L{s}_{ref}_hits'], (free0, free1)[s])
          for side, ref in OTHER_SIDES.items()
          for s in (0, 1)
      },
  }.items():
    m[key], m[key + '_se'] = significance.share_and_se(num, den)
  m['lift'], m['lift_se'] = significance.paired_share_difference(
      cols['L1_phrase_free_hits'], free1, cols['L0_phrase_free_hits'], free0
  )
  for side, ref in OTHER_SIDES.items():
    m[f'{side}_lift'], m[f'{side}_lift_se'] = significance.paired_share_difference(
        cols[f'L1_{ref}_hits'], free1, cols[f'L0_{ref}_hits'], free0
    )
  return m


def stage1_probabilities(ckpt, texts, key, marks: bytes = PhraseSpec.marks) -> dict:
  """How sure stage 1 is where it decides: its boundary probability at the stage-0 chunk ends
  (sampled, as in training; unforced positions) that sit at a phrase end ('p1_phrase'), at a phrase
  end closed by each of `marks` ('p1_,' and 'p1_.': the mark or the space after it) and at the
  others ('p1_other'), each a mean over those ends with its standard error over documents, and the
  difference phrase minus other paired over documents ('p1_gap'). A greedy stage 1 (p > 1/2) ends
  chunks only where p crosses 1/2."""
  names = ('phrase', *(chr(m) for m in marks), 'other')
  sums = {f'{k}_{name}': np.zeros(len(texts)) for k in 'pn' for name in names}
  for d, text in enumerate(texts):
    _, actions, probs = tokenization.boundaries_for(
        ckpt.model,
        ckpt.params,
        text,
        ckpt.config.data.seq_len,
        jax.random.fold_in(key, d),
        'sample',
    )
    ends = actions[0] > 0.5
    ends[-1] = False  # Forced when the text fills the window.
    b = np.frombuffer(text, np.uint8)[: len(ends)]
    phrase = boundary_stats.phrase_end(b[None])[0]
    prev = np.concatenate([[0], b[:-1]])
    where = {'phrase': ends & phrase, 'other': ends & ~phrase}
    for mark in marks:
      where[chr(mark)] = ends & phrase & ((b == mark) | (prev == mark))
    for name, at in where.items():
      sums[f'p_{name}'][d], sums[f'n_{name}'][d] = probs[1][at].sum(), at.sum()
  m: dict[str, float] = {}
  for name in names:
    m[f'p1_{name}'], m[f'p1_{name}_se'] = significance.share_and_se(
        sums[f'p_{name}'], sums[f'n_{name}']
    )
  m['p1_gap'], m['p1_gap_se'] = significance.paired_share_difference(
      sums['p_phrase'], sums['n_phrase'], sums['p_other'], sums['n_other']
  )
  return m


def evaluate_phrase_run(workdir: str, texts, key, every_checkpoint: bool = True) -> dict:
  """{'curve': [{'step', mode: phrase_summary}] over the run's checkpoints (or its last only),
  'final_cols': the last checkpoint's per-document columns, 'stage1_probs': its
  `stage1_probabilities`}: one compiled evaluator for all."""
  ckpt = inspection.load_checkpoint(workdir)
  steps = ckpt.steps() if every_checkpoint else [ckpt.step]
  curve, cols = [], None
  for s in steps:
    params = ckpt.params if s == ckpt.step else ckpt.at(s).params
    cols = per_document_counts(ckpt.evaluator, params, texts, key)
    curve.append({'step': s, **{m: phrase_summary(c) for m, c in cols.items()}})
  return {
      'curve': curve,
      'final_cols': cols,
      'stage1_probs': stage1_probabilities(ckpt, texts, key),
  }


def phrase_comparisons(cols: dict, method: str = 'learned') -> list[dict]:
  """`method` minus each other run, per mode, paired over the same held-out documents (each run's
  boundaries drawn on its own): stage-1 precision on each side of the phrase end (`PHRASE_SIDES`;
  'what' = the side), and bits-per-byte ('what' = 'bpb'), which says whether where stage 1 ends its
  chunks changes the loss at all."""
  rows = []
  for what in (*PHRASE_SIDES, 'bpb'):
    for other in [r for r in cols if r != method]:
      for mode in PHRASE_MODES:
        a, b = cols[method][mode], cols[other][mode]
        if what == 'bpb':
          paired = significance.paired_difference(a['ce'], b['ce'], a['bytes'])
          diff, se = paired['diff'], paired['se']
        else:
          ref = PHRASE_SIDES[what]
          diff, se = significance.paired_share_difference(
              a[f'L1_{ref}_hits'], a['L1_free_hits'], b[f'L1_{ref}_hits'], b['L1_free_hits']
          )
        z = diff / se if se > 0 else math.nan  # NaN se (a side without ends) stays NaN.
        rows.append({'what': what, 'vs': other, 'mode': mode, 'diff': diff, 'se': se, 'z': z})
  return rows


def write_phrase_results(out: str, meta: dict, runs: dict, comparisons: list[dict]) -> None:
  """results.md, results.json and curves.png: stage-1 phrase precision per run against chance."""
  f = common.fmt
  lines = [
      '# Planted two-level check: do stage-1 chunks end at phrase ends?',
      '',
      f'Command: `{meta["command"]}`',
      '',
      f'Corpus: {meta["corpus"]}; stage-1 window {meta["stage1_window"]} bytes; see '
      'tokjax/lab/synthetic.py (PhraseSpec) and configs/synthetic_two_stage.py. '
      f'{meta["train_docs"]} training documents, {meta["eval_docs"]} held-out ones of '
      f'{meta["seq_len"] - 1} bytes; {meta["steps"]} steps per run.',
      '',
      'Every held-out document is scored alone by the Evaluator; shares are pooled over documents '
      'with their standard error over documents (ratio estimator), at unforced positions only (the '
      'first and last position of a row always end a chunk at every level). prec1: share of stage-1 '
      'chunk ends at a phrase end (the mark or the space after it, `boundary_stats.phrase_end`); chance: '
      "the same share of the run's own stage-0 chunk ends (a stage-1 chunk can end only where a "
      'stage-0 chunk ends); lift = prec1 - chance, paired over documents. before: the same one word '
      "before a phrase end (at the space before the phrase's last word, "
      '`boundary_stats.before_phrase_end`); first: the same one word after it (at the space after the '
      "next phrase's first word, `boundary_stats.after_phrase_start`): the other places a chunk can "
      'close a phrase at. rate1: stage-1 ends per stage-0 chunk. word prec0 / rec0: stage-0 ends at '
      'spaces / spaces ending a stage-0 chunk. greedy: p > 1/2; sample: drawn as in training (and '
      'in bpb).',
      '',
  ]
  head = (
      'run | mode | bpb +- s.e. | rate0 | word prec0 | word rec0 | rate1 | chance +- s.e. | '
      'prec1 +- s.e. | lift +- s.e. | phrase rec1 | '
      + ' | '.join(f'{side}: chance | prec1 | lift +- s.e.' for side in OTHER_SIDES)
  )
  body = []
  for name, r in runs.items():
    for mode in PHRASE_MODES:
      m = r['curve'][-1][mode]
      body.append(
          f'{name} | {mode} | {f(m["bpb"], 3)} +- {f(m["bpb_se"], 3)} | {f(m["rate0"], 3)} | '
          f'{f(m["word_precision0"], 3)} | {f(m["word_recall0"], 3)} | {f(m["rate1"], 3)} | '
          f'{f(m["phrase_precision0"], 3)} +- {f(m["phrase_precision0_se"], 3)} | '
          f'{f(m["phrase_precision1"], 3)} +- {f(m["phrase_precision1_se"], 3)} | '
          f'{f(m["lift"], 3)} +- {f(m["lift_se"], 3)} | {f(m["phrase_recall1"], 3)} | '
          + ' | '.join(
              f'{f(m[f"{side}_precision0"], 3)} | {f(m[f"{side}_precision1"], 3)} | '
              f'{f(m[f"{side}_lift"], 3)} +- {f(m[f"{side}_lift_se"], 3)}'
              for side in OTHER_SIDES
          )
      )
  lines += ['## At the last step', '', *common.table(head, body), '']
  lines += [
      '## How sure stage 1 is (last step, sampled stage-0 ends)',
      '',
      "Stage 1's boundary probability at the stage-0 chunk ends on a phrase end and at the others "
      '(mean over those ends +- s.e. over documents; gap paired over documents). Greedy stage-1 '
      'boundaries need p > 1/2.',
      '',
      *common.table(
          "run | p1 at phrase ends | at ',' | at '.' | p1 elsewhere | gap",
          (
              f'{name} | '
              + ' | '.join(
                  f'{f(p[f"p1_{k}"], 3)} +- {f(p[f"p1_{k}_se"], 3)}'
                  for k in ('phrase', ',', '.', 'other', 'gap')
              )
              for name, p in ((n, r['stage1_probs']) for n, r in runs.items())
          ),
      ),
      '',
  ]
  if comparisons:
    lines += [
        '## Learned minus each control (paired over documents)',
        '',
        'phrase / before / first: stage-1 precision at phrase ends (prec1), one word before them or '
        "one word after them; bpb: bits-per-byte with each run's own boundaries (negative: learned "
        'is better), the loss that stage-1 placement is meant to lower.',
        '',
        *common.table(
            'what | control | mode | difference +- s.e. | difference / s.e.',
            (
                f'{c["what"]} | {c["vs"]} | {c["mode"]} | {f(c["diff"], 4)} +- {f(c["se"], 4)} | '
                f'{c["z"]:.1f}'
                for c in comparisons
            ),
        ),
        '',
    ]
  lines += ['## Stage-1 phrase precision over training (prec1 / chance)', '']
  for name, r in runs.items():
    lines += [
        f'### {name} (trained in {r["wall_s"]:.0f} s)',
        '',
        *common.table(
            'step | greedy prec1 | greedy chance | sample prec1 | sample chance | sample rate1',
            (
                f'{p["step"]} | {f(p["greedy"]["phrase_precision1"], 3)} | '
                f'{f(p["greedy"]["phrase_precision0"], 3)} | '
                f'{f(p["sample"]["phrase_precision1"], 3)} | '
                f'{f(p["sample"]["phrase_precision0"], 3)} | {f(p["sample"]["rate1"], 3)}'
                for p in r['curve']
            ),
        ),
        '',
    ]
  data = {'meta': meta, 'runs': runs, 'comparisons': comparisons}
  common.write_results(out, data, lines)
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
  for ax, mode in zip(axes, PHRASE_MODES):
    for name, r in runs.items():
      steps = [p['step'] for p in r['curve']]
      line = ax.plot(steps, [p[mode]['phrase_precision1'] for p in r['curve']], label=name)[0]
      ax.plot(steps, [p[mode]['phrase_precision0'] for p in r['curve']], ls=':', c=line.get_color())
    ax.set(title=f'{mode} boundaries', xlabel='step')
  axes[0].set_ylabel('stage-1 ends at phrase ends (dotted: chance)')
  axes[0].legend()
  common.save_figure(fig, os.path.join(out, 'curves.png'))


def phrase_experiment(
    out: str,
    workdir: str,
    steps: int,
    eval_every: int,
    train_docs: int,
    eval_docs: int,
    runs,
    seed: int = 0,
    command: str = '',
    overrides=None,
    spec: PhraseSpec = PhraseSpec(),
    tiny: bool = False,
    words: bool = False,
) -> dict:
  """Trains each run (a variant of configs/synthetic_two_stage.py, with `overrides[run]` on top) on
  the two-level corpus, reusing a finished run (its WORKDIR/RUN/result.json), evaluates every
  checkpoint on fresh held-out documents and writes OUT/results.{md,json} and OUT/curves.png.
  Returns the written data's 'runs'."""
  overrides = overrides or {}
  unknown = sorted(set(overrides) - set(runs))
  if unknown:
    raise UserError(f'--set names run(s) {unknown} that --runs does not train.')
  if steps < eval_every or steps % eval_every:
    raise UserError(f'--steps={steps} must be a positive multiple of --eval_every={eval_every}.')
  configs = {
      r: phrase_config(r, '', steps, eval_every, seed, overrides.get(r), tiny, words) for r in runs
  }
  n = next(iter(configs.values())).data.seq_len - 1
  window = int(stages.get(next(iter(configs.values())), 1).window)
  if spec.min_distance <= window:
    raise UserError(f'copies {spec.min_distance} bytes back are inside the {window}-byte window.')
  corpus = os.path.join(workdir, 'corpus')
  write_corpus(corpus, make_phrase_corpus(seed, seed, train_docs, n, spec))
  held_out = make_phrase_corpus(seed + 1000, seed, eval_docs, n, spec)
  texts = [d.text for d in held_out]
  key = jax.random.PRNGKey(seed + 1)
  results, cols = {}, {}
  for name, c in configs.items():
    c.data.corpus = corpus
    r = common.train_or_load(name, c, workdir)
    ev = evaluate_phrase_run(os.path.join(workdir, name), texts, key)
    cols[name] = ev['final_cols']
    results[name] = {'wall_s': r['wall_s'], 'overrides': overrides.get(name, {}), **ev}
    del results[name]['final_cols']
    last = ev['curve'][-1]
    print(
        f'{name}: step {last["step"]} stage-1 phrase precision greedy '
        f'{last["greedy"]["phrase_precision1"]:.3f} sample {last["sample"]["phrase_precision1"]:.3f}'
        f' (chance {last["sample"]["phrase_precision0"]:.3f}) | wall {r["wall_s"]:.0f} s',
        flush=True,
    )
  meta = {
      'command': command,
      'corpus': dict(dataclasses.asdict(spec), marks=spec.marks.decode()),
      'stage1_window': window,
      'seq_len': n + 1,
      'steps': steps,
      'train_docs': train_docs,
      'eval_docs': eval_docs,
      'seed': seed,
      'tiny': tiny,
      'words': words,
  }
  comparisons = phrase_comparisons(cols) if 'learned' in cols and len(cols) > 1 else []
  write_phrase_results(out, meta, results, comparisons)
  return results


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save and restore at INFO.
  command = 'python -m tokjax.lab.synthetic ' + ' '.join(sys.argv[1:])
  if _DESIGN.value == 'phrases':
    out = _OUT.value or 'results/synthetic/phrases'
    phrase_experiment(
        out,
        _WORKDIR.value or 'runs/synthetic_phrases',
        _STEPS.value,
        _EVAL_EVERY.value,
        _TRAIN_DOCS.value,
        _EVAL_DOCS.value,
        _RUNS.value or phrase_run_names(),
        _SEED.value,
        command,
        parse_overrides(_SET.value),
        spec=PhraseSpec(book=_BOOK.value, marks_by=_MARKS_BY.value, order=_ORDER.value),
        tiny=_TINY.value,
        words=_WORDS.value,
    )
    print(f'wrote {out}/results.md, results.json, curves.png')
    return
  if _SET.value:
    raise UserError('--set is for --design phrases.')
  out, steps, every = _OUT.value or 'results/synthetic', _STEPS.value, _EVAL_EVERY.value
  if steps < every or steps % every:
    raise UserError(f'--steps={steps} must be a positive multiple of --eval_every={every}.')
  spec = CorpusSpec(lexicon_size=_LEXICON.value, terminator=_TERMINATOR.value.encode())
  workdir = _WORKDIR.value or 'runs/synthetic'
  base = variant_config('method', '', workdir, steps, every, _SEED.value)
  n = base.data.seq_len - 1
  train_docs = make_corpus(_SEED.value, _SEED.value, _TRAIN_DOCS.value, n, spec)
  corpus = os.path.join(workdir, 'corpus')
  write_corpus(corpus, train_docs)
  os.makedirs(out, exist_ok=True)
  held_out = make_corpus(_SEED.value + 1000, _SEED.value, _EVAL_DOCS.value, n, spec)
  curves, seconds = {}, {}
  results_path = os.path.join(out, 'results.json')
  if os.path.exists(results_path):  # Runs already evaluated are kept when only some are redone.
    with open(results_path) as f:
      old = json.load(f)
    curves, seconds = old['curves'], old['train_seconds']
  for name in _RUNS.value or run_names():
    config = variant_config(name, corpus, workdir, steps, every, _SEED.value)
    if (
        common.finished_step(config.train.workdir) == steps
    ):  # A finished run of the same length is reused.
      print(f'{name}: reusing the finished run in {config.train.workdir}', flush=True)
    else:
      t0 = time.time()
      train_lib.train(config)
      seconds[name] = time.time() - t0
    curves[name] = evaluate_run(config, held_out, _SEED.value)
    last = curves[name][-1]
    print(
        f'{name}: step {last["step"]} greedy F1 {last["greedy_f1"]:.3f} sample F1 '
        f'{last["sample_f1"]:.3f} | bpb oracle {last["oracle_bpb"]:.3f} random '
        f'{last["random_bpb"]:.3f}',
        flush=True,
    )
    write_results(out, command, spec, curves, seconds)
  print(f'wrote {results_path} and results.md')


if __name__ == '__main__':
  cli.run(main)
