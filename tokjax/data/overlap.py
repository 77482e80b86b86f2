"""Shared text between corpora: how much of one split occurs verbatim in another.

An out-of-domain score means something only if the model never trained on the text it is scored on.
`verbatim_share` draws windows of one set of documents and counts those that occur byte for byte in
another (a training split): exact, and fast enough for a training split of tens of megabytes because
it indexes only the grams at every `window / 2`-th position of the training bytes (any window that
occurs in them contains one of those grams, whole, at a known set of offsets), and confirms each
candidate with a full search.
"""

from collections.abc import Sequence

import numpy as np

WINDOW_BYTES = 64  # Long enough that a shared window is shared text, not a common phrase.
NUM_WINDOWS = 1000
MAX_SHARE = 0.01  # Cross sets above this share are not out of domain (the ladder refuses them).
SEPARATOR = b'\x00'  # Joins the training documents for one search (`verbatim_share`).


def verbatim_share(
    docs: Sequence[bytes],
    train_docs: Sequence[bytes],
    *,
    window: int = WINDOW_BYTES,
    num_windows: int = NUM_WINDOWS,
    seed: int = 0,
) -> tuple[float, int]:
  """(share, windows drawn): of `num_windows` windows of `window` bytes drawn uniformly from `docs`
  (each inside one document; documents shorter than a window are skipped), the share found verbatim
  inside one document of `train_docs`. (nan, 0) when no document of `docs` holds a window."""
  if window < 2:
    raise ValueError(f'window={window} must be at least 2 bytes')
  starts = [len(d) - window + 1 for d in docs]
  total = sum(max(s, 0) for s in starts)
  if total == 0:
    return float('nan'), 0
  rng = np.random.default_rng(seed)
  picks = np.sort(rng.integers(0, total, size=num_windows))
  offsets = np.concatenate([[0], np.cumsum([max(s, 0) for s in starts])])
  doc_of = np.searchsorted(offsets, picks, side='right') - 1
  windows = [docs[d][p - offsets[d] : p - offsets[d] + window] for d, p in zip(doc_of, picks)]
  # A window lying in a training document covers one position q = k * gram of that document with
  # q - start in [0, gram], so train[q : q + gram] is the window's slice at that offset.
  gram = window // 2
  index = set()
  for doc in train_docs:
    for q in range(0, len(doc) - gram + 1, gram):
      index.add(doc[q : q + gram])
  # One search over the joined documents; only a window holding the separator could match across
  # two of them, and those are searched document by document.
  joined = SEPARATOR.join(train_docs)
  found = 0
  for w in windows:
    if any(w[o : o + gram] in index for o in range(window - gram + 1)):
      if SEPARATOR in w:
        found += any(w in doc for doc in train_docs)
      else:
        found += w in joined
  return found / len(windows), len(windows)
