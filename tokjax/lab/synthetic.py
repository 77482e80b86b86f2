r"""The synthetic learning check: a corpus with planted segments, and how well learned boundaries find them.

  python -m tokjax.lab.synthetic [--steps 800] [--out results/synthetic]

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
steps) is then evaluated on fresh held-out documents (another seed): boundary precision / recall / F1
against the planted ends (greedy p > 0.5 and sampled boundaries, scored on bytes 0..L-3: the last
position is forced), the boundary rate, and bits-per-byte with the run's own sampled boundaries and
with *given* boundaries -- the planted ends ('oracle_bpb') and Bernoulli noise at the planted rate
('random_bpb'); 'copy_' variants count only the bytes of copied halves. Writes OUT/results.json and
OUT/results.md (F1 and bpb against steps, per run).
"""

import dataclasses
import json
import os
import sys
import time

from absl import flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from tokjax import boundary_stats, checkpointing, cli, config_files, evaluation
from tokjax import train as train_lib
from tokjax.data import BOS_ID, PAD_ID
from tokjax.errors import UserError
from tokjax.lab import common
from tokjax.losses import cross_entropy


def run_names() -> tuple[str, ...]:
  """The runs: the variants of configs/synthetic_cpu.py."""
  return tuple(config_files.load_module('synthetic_cpu').VARIANTS)


if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _STEPS = flags.DEFINE_integer('steps', 800, 'Training steps of each run.')
  _OUT = flags.DEFINE_string(
      'out', 'results/synthetic', 'Results folder (results.md, results.json).'
  )
  _WORKDIR = flags.DEFINE_string(
      'workdir',
      'runs/synthetic',
      'Folder of the generated corpus and the ' 'training runs (kept out of the results folder).',
  )
  _EVAL_EVERY = flags.DEFINE_integer(
      'eval_every', 100, 'Checkpoint and evaluate every this many steps.'
  )
  _TRAIN_DOCS = flags.DEFINE_integer('train_docs', 4000, 'Training corpus documents.')
  _EVAL_DOCS = flags.DEFINE_integer(
      'eval_docs', 128, 'Held-out documents scored at every checkpoint.'
  )
  _RUNS = flags.DEFINE_list(
      'runs', ','.join(run_names()), 'Runs to train, some of ' + ','.join(run_names()) + '.'
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
  words = set()
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


def write_corpus(folder: str, docs: list[Document]) -> None:
  """One file per document (doc_00000.txt, ...), the folder layout `config.data.corpus` reads."""
  os.makedirs(folder, exist_ok=True)
  for i, d in enumerate(docs):
    with open(os.path.join(folder, f'doc_{i:05d}.txt'), 'wb') as f:
      f.write(d.text)


def boundary_f1(predicted, planted, n: int) -> dict:
  """Precision / recall / F1 of boundary positions, both over positions 0..n-1.

  predicted: {0,1}[n] or [N, n] (1 = byte ends a chunk); planted: the same shape. Counts are summed
  over all rows before the ratios (micro average, `boundary_stats.Counts`). An empty side gives 0
  for its ratio.
  """
  p = np.asarray(predicted)[..., :n] > 0.5
  c = boundary_stats.count(p, np.ones(p.shape), np.asarray(planted)[..., :n] > 0.5)
  return {k: float(getattr(c, k)) for k in ('precision', 'recall', 'f1', 'rate')}


def planted_mask(doc: Document) -> np.ndarray:
  """{0,1} float32[len(text)]: 1 at each planted segment end."""
  m = np.zeros(len(doc.text), np.float32)
  m[doc.ends] = 1.0
  return m


def eval_arrays(docs: list[Document], seq_len: int) -> dict[str, np.ndarray]:
  """Model inputs for documents of seq_len - 1 bytes: tokens/targets int32[N, L], mask and oracle
  actions float32[N, L] (input position t holds byte t - 1; first and last positions forced to 1),
  copied bool[N, L] (target t is a copied byte)."""
  n = seq_len - 1
  if any(len(d.text) != n for d in docs):
    raise UserError(f'held-out documents must be seq_len - 1 = {n} bytes long.')
  body = np.stack([np.frombuffer(d.text, np.uint8) for d in docs]).astype(np.int32)
  tokens = np.concatenate([np.full((len(docs), 1), BOS_ID, np.int32), body], axis=1)
  targets = np.concatenate([body, np.full((len(docs), 1), PAD_ID, np.int32)], axis=1)
  oracle = np.concatenate(
      [np.ones((len(docs), 1), np.float32), np.stack([planted_mask(d) for d in docs])], axis=1
  )
  oracle[:, -1] = 1.0
  copied = np.concatenate([np.stack([d.copied for d in docs]), np.zeros((len(docs), 1), bool)], 1)
  return {
      'tokens': tokens,
      'targets': targets,
      'mask': (targets < 256).astype(np.float32),
      'oracle': oracle,
      'copied': copied,
  }


def make_eval_fns(model):
  """Jitted (params, tokens, key) -> (actions, probs) per mode, and (params, tokens, actions) ->
  CE float32[N, L] of the model run with the given boundaries."""

  def bounds(mode):
    def fn(params, tokens, key):
      b = model.apply({'params': params}, tokens, key, mode=mode).boundaries
      return b.actions, b.probs

    return jax.jit(fn)

  def ce_given(params, tokens, targets, actions, key):
    out = model.apply({'params': params}, tokens, key, mode='given', actions=actions)
    return cross_entropy(out.logits, targets)

  def ce_own(params, tokens, targets, key):
    return cross_entropy(
        model.apply({'params': params}, tokens, key, mode='sample').logits, targets
    )

  return {
      'greedy': bounds('greedy'),
      'sample': bounds('sample'),
      'given': jax.jit(ce_given),
      'own': jax.jit(ce_own),
  }


def evaluate_params(fns, params, arrays, key) -> dict:
  """Boundary F1 (greedy and sampled) against the planted ends, and bits-per-byte with the model's
  sampled boundaries, the oracle boundaries and random ones at the planted rate (all bytes, and the
  copied bytes only). Boundary positions scored: bytes 0..L-3 (the last byte's boundary is forced).
  """
  tokens, targets, mask = (jnp.asarray(arrays[k]) for k in ('tokens', 'targets', 'mask'))
  oracle = arrays['oracle']
  n = tokens.shape[1] - 2
  out = {}
  k_greedy, k_sample, k_random, k_ce = jax.random.split(key, 4)
  for mode, k in (('greedy', k_greedy), ('sample', k_sample)):
    actions, _ = fns[mode](params, tokens, k)
    scores = boundary_f1(np.asarray(actions)[:, 1 : 1 + n], oracle[:, 1 : 1 + n], n)
    out.update({f'{mode}_{name}': v for name, v in scores.items()})
  planted_rate = float(oracle[:, 1 : 1 + n].mean())
  rand = np.asarray(jax.random.bernoulli(k_random, planted_rate, oracle.shape), np.float32)
  rand[:, 0] = rand[:, -1] = 1.0
  mask_np, copied = arrays['mask'], arrays['copied'] & (arrays['mask'] > 0)

  def bpb(ce):  # Each held-out row is one document: pooled over bytes (`tokjax.evaluation`).
    ce = np.asarray(ce)
    return tuple(
        evaluation.ratio_and_se(np.sum(ce * w, axis=1), np.sum(w, axis=1))[0]
        for w in (mask_np, copied)
    )

  out['bpb'], out['copy_bpb'] = bpb(fns['own'](params, tokens, targets, k_ce))
  for name, acts in (('oracle', oracle), ('random', rand)):
    out[f'{name}_bpb'], out[f'{name}_copy_bpb'] = bpb(
        fns['given'](params, tokens, targets, jnp.asarray(acts), k_ce)
    )
  out['planted_rate'] = planted_rate
  del mask
  return out


def variant_config(name: str, corpus: str, workdir: str, steps: int, eval_every: int, seed: int):
  """configs/synthetic_cpu.py:NAME with the command's corpus, seed, schedule and run folder."""
  if name not in run_names():
    raise UserError(f'unknown run {name!r}; use some of {",".join(run_names())}.')
  c = config_files.load('synthetic_cpu', name)
  c.data.corpus = corpus
  c.seed = seed
  c.train.update(
      steps=steps,
      eval_every=eval_every,
      checkpoint_every=eval_every,
      keep_checkpoints=steps // eval_every + 2,
      workdir=os.path.join(workdir, name),
  )
  return c


def evaluate_run(config, arrays, seed: int) -> list[dict]:
  """Evaluates every checkpoint of a finished run: [{'step': s, ...metrics}] in step order."""
  ckpt = checkpointing.load_checkpoint(config.train.workdir)
  fns = make_eval_fns(ckpt.model)
  key = jax.random.PRNGKey(seed + 1)
  rows = [
      dict(step=s, **evaluate_params(fns, ckpt.at(s).params, arrays, key)) for s in ckpt.steps()
  ]
  # Step 0 (the initial policy) from a fresh init, as the starting point of the curve.
  state0 = ckpt.trainer.init(jax.random.split(jax.random.PRNGKey(config.seed), 3)[0])
  rows.insert(0, dict(step=0, **evaluate_params(fns, state0.params, arrays, key)))
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


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save and restore at INFO.
  out, steps, every = _OUT.value, _STEPS.value, _EVAL_EVERY.value
  if steps < every or steps % every:
    raise UserError(f'--steps={steps} must be a positive multiple of --eval_every={every}.')
  spec = CorpusSpec(lexicon_size=_LEXICON.value, terminator=_TERMINATOR.value.encode())
  workdir = _WORKDIR.value
  base = variant_config('method', '', workdir, steps, every, _SEED.value)
  n = base.data.seq_len - 1
  train_docs = make_corpus(_SEED.value, _SEED.value, _TRAIN_DOCS.value, n, spec)
  corpus = os.path.join(workdir, 'corpus')
  write_corpus(corpus, train_docs)
  os.makedirs(out, exist_ok=True)
  held_out = make_corpus(_SEED.value + 1000, _SEED.value, _EVAL_DOCS.value, n, spec)
  arrays = eval_arrays(held_out, base.data.seq_len)
  command = 'python -m tokjax.lab.synthetic ' + ' '.join(sys.argv[1:])
  curves, seconds = {}, {}
  results_path = os.path.join(out, 'results.json')
  if os.path.exists(results_path):  # Runs already evaluated are kept when only some are redone.
    with open(results_path) as f:
      old = json.load(f)
    curves, seconds = old['curves'], old['train_seconds']
  for name in _RUNS.value:
    config = variant_config(name, corpus, workdir, steps, every, _SEED.value)
    if (
        common.finished_step(config.train.workdir) == steps
    ):  # A finished run of the same length is reused.
      print(f'{name}: reusing the finished run in {config.train.workdir}', flush=True)
    else:
      t0 = time.time()
      train_lib.train(config)
      seconds[name] = time.time() - t0
    curves[name] = evaluate_run(config, arrays, _SEED.value)
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
