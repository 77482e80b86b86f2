"""BPE-guided boundaries: chunks cut where a byte-level BPE tokenizer starts a new token.

The tokenizer is a byte-level BPE from the `tokenizers` library (`pip install -e .[compare]`), trained on
the training split, with its vocabulary size searched so that tokens per byte on the validation split is
about the target rate. Raw bytes are mapped one-to-one to characters (latin-1) before tokenizing, so any
byte sequence works and character offsets are byte offsets.

Shift (as in the paper): a_t = 1 when byte t STARTS a BPE token, so every chunk ends on the first byte
of the next token ("the " | "king" ...). Ending chunks on a token's last byte instead would tell byte t
(through its complete chunk) that byte t+1 starts a new token: a direct leak of the future. With the
shift the boundary at t is a statement about byte t and its past. What remains: BPE's merges inside a
pre-token (a word) can depend on later bytes of the same word, so a token start inside a word is not a
strictly causal function of bytes <= t (pre-token starts, the large majority at this vocabulary size,
are determined by bytes t-1 and t). We accept this, as the paper does; tests check the model is causal
given the boundaries and report this residual look-ahead.

The boundaries are computed on the host inside the step (`host_token_starts`: a callback tokenizes each
row of the batch, segments split at BOS / PAD), so the model needs nothing beyond `tokens` and every
path that runs it (training, evaluation, generation, segmentation, lm_eval scoring) gets the same
boundaries for the same bytes. They cannot be computed before the step in general: generation decides
each position's boundary from bytes the step itself produced.
"""

import functools
import hashlib
import os

import flax.linen as nn
import jax
from jax.experimental import buffer_callback
import jax.numpy as jnp
import numpy as np

from tokjax import stages
from tokjax.errors import UserError
from tokjax.models import registry
from tokjax.models.rivals import common
from tokjax.vocab import BOS_ID, PAD_ID


def _tokenizers():
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(
        'the bpe boundary method needs the `tokenizers` package; run '
        '`pip install -e .[compare]`.'
    ) from None
  return tokenizers


def _to_text(doc: bytes) -> str:
  return doc.decode('latin-1')


PRETOKENIZE = ('words', 'none')


def train_tokenizer(docs, vocab_size: int, max_bytes: int = 3_000_000, pretokenize: str = 'words'):
  """A byte-level BPE tokenizer (tokenizers.Tokenizer) trained on docs (list[bytes], capped).

  pretokenize: 'words' splits the text into GPT-2 pre-tokens first, so no merge crosses a word start
  (on English text tokens per byte then stay above about 0.28 at any vocabulary size); 'none' lets
  merges cross spaces ("of the" becomes one token), so any lower rate is reachable. A token start
  then also depends on bytes after the current word: a longer look-ahead than 'words' has.
  """
  tk = _tokenizers()
  tok = tk.Tokenizer(tk.models.BPE())
  tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(
      add_prefix_space=False, use_regex=pretokenize == 'words'
  )
  tok.decoder = tk.decoders.ByteLevel()
  trainer = tk.trainers.BpeTrainer(
      vocab_size=vocab_size,
      show_progress=False,
      initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
  )
  texts, total = [], 0
  for d in docs:
    if total >= max_bytes:
      break
    texts.append(_to_text(d))
    total += len(d)
  tok.train_from_iterator(texts, trainer)
  return tok


def tokens_per_byte(tok, docs, max_bytes: int = 500_000) -> float:
  texts, total = [], 0
  for d in docs:
    if total >= max_bytes:
      break
    texts.append(_to_text(d[: max_bytes - total]))
    total += len(texts[-1])
  n = sum(len(e.ids) for e in tok.encode_batch(texts))
  return n / max(total, 1)


def fit_tokenizer(
    train_docs, eval_docs, target_rate: float, lo: int = 260, hi: int = 65536, pretokenize='words'
):
  """Searches the vocabulary size (log-scale bisection) whose tokens/byte on eval_docs is closest to
  target_rate. Returns (tokenizer, vocab size, achieved tokens per byte)."""
  best = None
  for _ in range(8):
    mid = int(round((lo * hi) ** 0.5))
    tok = train_tokenizer(train_docs, mid, pretokenize=pretokenize)
    rate = tokens_per_byte(tok, eval_docs)
    if best is None or abs(rate - target_rate) < abs(best[2] - target_rate):
      best = (tok, mid, rate)
    if rate > target_rate:
      lo = mid
    else:
      hi = mid
    if hi / lo < 1.15:
      break
  return best


def cached_tokenizer_json(config, stage=None) -> str:
  """The tokenizer JSON of stage (default: config's stage 0): its bpe.tokenizer setting if set, else
  trained once on the config's training split and cached under the data folder (keyed by corpus,
  split and the stage's rate)."""
  stage = stages.get(config, 0) if stage is None else stage
  settings = stage.settings
  path = settings.tokenizer
  if path:
    if not os.path.isfile(path):
      raise UserError(
          f'{stage.where("settings.tokenizer")}={path!r} does not exist; give a tokenizer JSON '
          'or leave it empty to train one on the training split.'
      )
    with open(path) as f:
      return f.read()
  from tokjax.data import corpora, pipeline  # pylint: disable=g-import-not-at-top

  d = config.data
  key = repr(
      (
          d.corpus,
          d.max_bytes,
          d.val_fraction,
          d.test_fraction,
          d.split_seed,
          float(stage.target_rate),
      )
      # Tokenizers fitted before the pretokenize setting existed keep their cache key.
      + (() if settings.pretokenize == 'words' else (settings.pretokenize,))
  )
  folder = os.path.join(d.data_dir or str(corpora.default_data_dir()), 'bpe')
  path = os.path.join(folder, hashlib.sha1(key.encode()).hexdigest()[:16] + '.json')
  if not os.path.isfile(path):
    splits = pipeline.load_splits(d)
    tok, vocab, rate = fit_tokenizer(
        splits['train'],
        splits['val'],
        stage.target_rate,
        pretokenize=settings.pretokenize,
    )
    print(
        f'bpe: trained a {vocab}-token byte-level BPE, {rate:.3f} tokens per byte on val '
        f'(target {stage.target_rate}); cached at {path}',
        flush=True,
    )
    os.makedirs(folder, exist_ok=True)
    tok.save(path + '.tmp')
    os.replace(path + '.tmp', path)
  with open(path) as f:
    return f.read()


@functools.lru_cache(maxsize=8)
def _load(tokenizer_json: str):
  return _tokenizers().Tokenizer.from_str(tokenizer_json)


def token_starts(tok, tokens: np.ndarray) -> np.ndarray:
  """int[B, L] ids (bytes, BOS, PAD) -> float32[B, L]: 1 where a BPE token starts (BOS counts as a
  one-position token; PAD never starts one). Each BOS/PAD-free run is tokenized on its own."""
  tokens = np.asarray(tokens)
  out = np.zeros(tokens.shape, np.float32)
  segments = []
  for r, row in enumerate(tokens):
    special = row >= 256
    out[r, row == BOS_ID] = 1.0
    t = 0
    while t < len(row):
      if special[t]:
        t += 1
        continue
      end = t
      while end < len(row) and not special[end]:
        end += 1
      segments.append((r, t, bytes(row[t:end].astype(np.uint8)).decode('latin-1')))
      t = end
  for (r, start, _), enc in zip(segments, tok.encode_batch([s for _, _, s in segments])):
    out[r, [start + a for a, _ in enc.offsets]] = 1.0
  return out


def host_token_starts(tokenizer_json: str, tokens):
  """`token_starts` of tokens int32[B, L] inside a traced step -> float32[B, L].

  On CPU the callback is a `buffer_callback`: it reads the step's own buffer of tokens and writes
  the starts into the output buffer, so it makes no jax.Array and waits for nothing. A
  `jax.pure_callback` instead copies its arguments into new jax.Arrays and waits for them: the CPU
  client copies more than about 100 KiB on its worker pool, which is also where it runs a step
  dispatched before its inputs were ready; with one worker (a process pinned to one core, as the
  ladder's runs are) that callback waited for itself and the run hung. On GPU and TPU the step runs
  on the device, so pure_callback's copy to the CPU device has the CPU pool free, and there a
  `buffer_callback` would be handed device memory.
  """
  shape = jax.ShapeDtypeStruct(tokens.shape, jnp.float32)

  def fill(ctx, out, tokens):
    del ctx
    np.asarray(out)[...] = token_starts(_load(tokenizer_json), np.asarray(tokens))

  def on_cpu(tokens):
    return buffer_callback.buffer_callback(fill, shape, vmap_method='sequential')(tokens)

  def on_device(tokens):
    host = lambda t: token_starts(_load(tokenizer_json), t)
    return jax.pure_callback(host, shape, tokens, vmap_method='sequential')

  return jax.lax.platform_dependent(tokens, cpu=on_cpu, default=on_device)


class BPEGuided(nn.Module):
  """tokens int32[B, L] -> `Boundaries` at BPE token starts (same call signature as BoundaryPolicy)."""

  tokenizer_json: str
  capacity: int = 64

  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    del key, early_logits, unused
    if mode == 'given':
      sampled = actions
    else:
      sampled = host_token_starts(self.tokenizer_json, tokens)
    sampled = jnp.where(tokens == PAD_ID, 0.0, sampled)
    return common.finish(sampled, self.capacity)


def _validate(stage) -> None:
  if stage.settings.pretokenize not in PRETOKENIZE:
    raise UserError(
        f'{stage.where("settings.pretokenize")}={stage.settings.pretokenize!r} must be one of '
        f'{", ".join(PRETOKENIZE)}.'
    )


registry.register(
    registry.BoundaryMethod(
        name='bpe',
        build=lambda st, c: BPEGuided(
            tokenizer_json=cached_tokenizer_json(c, st), capacity=st.capacity
        ),
        # tokenizer: JSON path; '' = train one on the training split (cached in the data folder).
        # pretokenize: 'words' (no merge crosses a word start) | 'none' (merges cross spaces:
        # reaches lower rates, with a longer look-ahead; see train_tokenizer).
        defaults=dict(tokenizer='', pretokenize='words'),
        validate=_validate,
        description='BPE-guided: a chunk ends where a byte-level BPE token starts',
    )
)
