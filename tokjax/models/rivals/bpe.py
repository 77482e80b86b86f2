"""BPE-guided boundaries: chunks cut where a byte-level BPE tokenizer starts a new token.

The tokenizer is a byte-level BPE from the `tokenizers` library (`pip install -e .[compare]`), trained on
the training split. Raw bytes are mapped one-to-one to characters (latin-1) before tokenizing, so any
byte sequence works and character offsets are byte offsets.

Shift (as in the paper): a_t = 1 when byte t STARTS a BPE token, so every chunk ends on the first byte
of the next token ("the " | "king" ...). Ending chunks on a token's last byte instead would tell byte t
(through its complete chunk) that byte t+1 starts a new token: a direct leak of the future.

Two methods differ in which tokenization "starts a token" refers to:
  - 'bpe' (causal): a_t = 1 when the BPE tokenization of the last `context` bytes ending at t (fewer
    after BOS or PAD: a segment's start) ends with a token that begins at byte t, i.e. what a
    generator that has read bytes <= t knows. Exact and causal by construction: a_t is a function of
    those K bytes alone (`causal_starts`). Its vocabulary is fitted so that this causal rate on the
    validation split is the target rate (`causal_rate`).
  - 'bpe_oracle' (look-ahead): the token starts of the whole window's tokenization, the paper's
    definition and this method's before the causal one. BPE's merges can depend on later bytes (of the
    same word with pretokenize='words', of any later word with 'none'), so the boundary at t sees the
    future: on Shakespeare, whole-window and prefix starts differ at about 14% of positions. Its
    registry entry declares lookahead=True, and generation refuses it. Its vocabulary is fitted to
    tokens per byte of whole-text tokenization, as before.

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


@functools.lru_cache(maxsize=8)
def _symbol_counts(tok) -> np.ndarray:
  """int32[vocab]: the byte-level symbols of each token (one per UTF-8 byte of its text)."""
  counts = np.zeros(tok.get_vocab_size(), np.int32)
  for piece, i in tok.get_vocab().items():
    counts[i] = len(piece)
  return counts


def _last_char_starts_a_token(tok, windows: list[str]) -> np.ndarray:
  """bool[len(windows)]: whether the tokenization of each (non-empty) window has a token boundary
  right before its last character, i.e. its last tokens cover exactly that character's symbols
  (one for an ASCII byte, two for a latin-1 character above 127, which UTF-8 writes in two)."""
  counts = _symbol_counts(tok)
  out = np.zeros(len(windows), bool)
  # encode_batch_fast skips the offsets, which take time; the ids tell the symbols.
  for i, (w, enc) in enumerate(zip(windows, tok.encode_batch_fast(windows))):
    need = 1 if ord(w[-1]) < 128 else 2
    covered = 0
    for token in reversed(enc.ids):
      covered += counts[token]
      if covered >= need:
        break
    out[i] = covered == need
  return out


def _windows(text: str, context: int) -> list[str]:
  """The last `context` characters of text ending at each of its positions."""
  return [text[max(0, t + 1 - context) : t + 1] for t in range(len(text))]


def causal_starts(tok, tokens: np.ndarray, context: int) -> np.ndarray:
  """int[B, L] ids (bytes, BOS, PAD) -> float32[B, L]: 1 at byte t when the tokenization of the last
  `context` bytes ending at t (back to the segment's start at most) has a token starting at t and
  none running from before t into it; BOS is 1, PAD 0. A function of bytes <= t alone: the causal
  'bpe' method's boundaries. One `encode_batch_fast` over all B * L windows."""
  tokens = np.asarray(tokens)
  out = np.zeros(tokens.shape, np.float32)
  places, windows = [], []
  for r, start, text in _segments(tokens):
    out[r, tokens[r] == BOS_ID] = 1.0
    places.append((r, start, len(text)))
    windows += _windows(text, context)
  starts = _last_char_starts_a_token(tok, windows) if windows else np.zeros(0, bool)
  i = 0
  for r, start, n in places:
    out[r, start : start + n] = starts[i : i + n]
    i += n
  return out


def causal_rate(tok, docs, context: int, max_positions: int = 50_000) -> float:
  """The share of byte positions of docs (the first max_positions, each document one segment) where
  `causal_starts` is 1: the causal method's boundary rate."""
  windows: list[str] = []
  for d in docs:
    if len(windows) >= max_positions:
      break
    windows += _windows(_to_text(d[: max_positions - len(windows)]), context)
  return float(np.mean(_last_char_starts_a_token(tok, windows))) if windows else 0.0


def fit_tokenizer(
    train_docs,
    eval_docs,
    target_rate: float,
    *,
    lo: int = 260,
    hi: int = 65536,
    pretokenize='words',
    rate_of=tokens_per_byte,
):
  """Searches the vocabulary size (log-scale bisection) whose rate_of(tokenizer, eval_docs) (default:
  tokens per byte) is closest to target_rate; the rate must fall as the vocabulary grows. Returns
  (tokenizer, vocab size, achieved rate)."""
  best = None
  for _ in range(8):
    mid = int(round((lo * hi) ** 0.5))
    tok = train_tokenizer(train_docs, mid, pretokenize=pretokenize)
    rate = rate_of(tok, eval_docs)
    if best is None or abs(rate - target_rate) < abs(best[2] - target_rate):
      best = (tok, mid, rate)
    if rate > target_rate:
      lo = mid
    else:
      hi = mid
    if hi / lo < 1.15:
      break
  return best


def cached_tokenizer_json(config, stage: stages.Stage) -> str:
  """The tokenizer JSON of `stage` (one of config's levels): its tokenizer setting if set, else
  trained once on the config's training split and cached under the data folder (keyed by corpus,
  split, the stage's rate and, for the causal 'bpe', its context: what its fitted rate is of).

  'bpe' fits the vocabulary to `causal_rate` on the validation split, 'bpe_oracle' to tokens per byte
  of whole-text tokenization (its cache key is the one this method had before the causal one).
  """
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

  causal = stage.method == 'bpe'
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
      + (('causal', int(settings.context)) if causal else ())
      # Fitted on a different training split (whole works held out): its own entry.
      + (() if d.split_by == 'document' else (d.split_by,))
  )
  folder = os.path.join(d.data_dir or str(corpora.default_data_dir()), 'bpe')
  path = os.path.join(folder, hashlib.sha1(key.encode()).hexdigest()[:16] + '.json')
  if not os.path.isfile(path):
    splits = pipeline.load_splits(d)
    rate_of = (
        functools.partial(causal_rate, context=int(settings.context)) if causal else tokens_per_byte
    )
    tok, vocab, rate = fit_tokenizer(
        splits['train'],
        splits['val'],
        stage.target_rate,
        pretokenize=settings.pretokenize,
        rate_of=rate_of,
    )
    what = 'causal boundary rate' if causal else 'tokens per byte'
    print(
        f'{stage.method}: trained a {vocab}-token byte-level BPE, {what} {rate:.3f} on val '
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


def _segments(tokens: np.ndarray):
  """(row, start, text) of every BOS/PAD-free run of tokens int[B, L], text as latin-1 characters."""
  for r, row in enumerate(tokens):
    special = row >= 256
    t = 0
    while t < len(row):
      if special[t]:
        t += 1
        continue
      end = t
      while end < len(row) and not special[end]:
        end += 1
      yield r, t, bytes(row[t:end].astype(np.uint8)).decode('latin-1')
      t = end


def token_starts(tok, tokens: np.ndarray) -> np.ndarray:
  """int[B, L] ids (bytes, BOS, PAD) -> float32[B, L]: 1 where a BPE token of the whole segment's
  tokenization starts (BOS counts as a one-position token; PAD never starts one). Each BOS/PAD-free
  run is tokenized on its own. The 'bpe_oracle' boundaries: they depend on later bytes."""
  tokens = np.asarray(tokens)
  out = np.zeros(tokens.shape, np.float32)
  out[tokens == BOS_ID] = 1.0
  segments = list(_segments(tokens))
  for (r, start, _), enc in zip(segments, tok.encode_batch([s for _, _, s in segments])):
    out[r, [start + a for a, _ in enc.offsets]] = 1.0
  return out


def starts(tok, tokens: np.ndarray, context: int) -> np.ndarray:
  """`causal_starts` with `context` bytes, or `token_starts` of whole segments for context 0."""
  return causal_starts(tok, tokens, context) if context else token_starts(tok, tokens)


def host_token_starts(tokenizer_json: str, tokens, context: int = 0):
  """`starts` of tokens int32[B, L] inside a traced step -> float32[B, L].

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
    np.asarray(out)[...] = starts(_load(tokenizer_json), np.asarray(tokens), context)

  def on_cpu(tokens):
    return buffer_callback.buffer_callback(fill, shape, vmap_method='sequential')(tokens)

  def on_device(tokens):
    host = lambda t: starts(_load(tokenizer_json), t, context)
    return jax.pure_callback(host, shape, tokens, vmap_method='sequential')

  return jax.lax.platform_dependent(tokens, cpu=on_cpu, default=on_device)


class BPEGuided(nn.Module):
  """tokens int32[B, L] -> `Boundaries` at BPE token starts (same call signature as BoundaryPolicy).

  context: K > 0 for the causal starts over the last K bytes ('bpe'); 0 for the whole window's
  token starts ('bpe_oracle', which sees later bytes).
  """

  tokenizer_json: str
  capacity: int = 64
  context: int = 0

  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    del key, early_logits, unused
    if mode == 'given':
      sampled = actions
    else:
      sampled = host_token_starts(self.tokenizer_json, tokens, self.context)
    sampled = jnp.where(tokens == PAD_ID, 0.0, sampled)
    return common.finish(sampled, self.capacity)


def _validate_pretokenize(stage) -> None:
  if stage.settings.pretokenize not in PRETOKENIZE:
    raise UserError(
        f'{stage.where("settings.pretokenize")}={stage.settings.pretokenize!r} must be one of '
        f'{", ".join(PRETOKENIZE)}.'
    )


def _validate(stage) -> None:
  _validate_pretokenize(stage)
  context = stage.settings.context
  if isinstance(context, bool) or not isinstance(context, int) or context < 1:
    raise UserError(
        f'{stage.where("settings.context")}={context!r} must be an integer >= 1 (the bytes ending '
        'at t that decide whether byte t starts a token; e.g. 32).'
    )


registry.register(
    registry.BoundaryMethod(
        name='bpe',
        build=lambda st, c: BPEGuided(
            tokenizer_json=cached_tokenizer_json(c, st),
            capacity=st.capacity,
            context=st.settings.context,
        ),
        # tokenizer: JSON path; '' = train one on the training split (cached in the data folder),
        # its vocabulary fitted to the causal rate. pretokenize: 'words' (no merge crosses a word
        # start) | 'none' (merges cross spaces; see train_tokenizer). context: the bytes ending at t
        # that decide a_t (more: closer to the whole prefix's tokenization, slower steps).
        defaults=dict(tokenizer='', pretokenize='words', context=32),
        validate=_validate,
        description='BPE-guided, causal: a chunk ends where the BPE of the bytes so far starts a token',
    )
)

registry.register(
    registry.BoundaryMethod(
        name='bpe_oracle',
        build=lambda st, c: BPEGuided(
            tokenizer_json=cached_tokenizer_json(c, st), capacity=st.capacity
        ),
        # As 'bpe' (without context): the vocabulary is fitted to tokens per byte instead.
        defaults=dict(tokenizer='', pretokenize='words'),
        validate=_validate_pretokenize,
        lookahead=True,
        description='BPE-guided, whole-window token starts (sees later bytes: no generation)',
    )
)
