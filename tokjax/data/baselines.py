"""Classical baselines beside the models: gzip, xz, PPMd and a byte n-gram LM, in bits per byte.

  ref = baselines.reference(splits, 'val', data_dir)  # {'gzip', 'xz', 'ppmd', 'ppmd_order', ...}
  pipeline.classical_bpb('shakespeare', 'test')      # the same for a corpus name, split as trained

gzip -9 and xz -9 compress the split alone (`compression.py`). The two models that see the training
split first are the fair comparison for a trained model, which has seen it too:
  ppmd    PPMd variant I (as in zip), its model primed by coding the training split first: the bits
          of the split are what coding train + split costs beyond coding train alone (the coder's
          final flush, 8 bytes, is counted to the split).
  ngram   an interpolated Witten-Bell byte n-gram fitted on the training split (`ngram.py`), each
          document scored alone from BOS, no end symbol (as tokjax's loss scores documents).
Each model's order is the one with the lowest bits per byte on val (PPMd: orders 2, 3, ... until two
orders in a row do no better than the best; n-gram: 1 .. ngram.MAX_ORDER) and is applied to every
split. The train split cannot be scored by them (they have seen it): it gets gzip and xz only.

Bytes read: the first TRAIN_MAX_BYTES of the training split's documents and the first
compression.SPLIT_MAX_BYTES of the scored split's (the bytes gzip / xz see), cut at the byte.
The numbers of val and test are computed together (the n-gram is fitted once for both) and cached
in DATA_DIR/baselines/ as one JSON file keyed by VERSION and the digest of the bytes read from the
three splits (document boundaries included), or for a prepared corpus of its manifest's shard
checksums (so that start-up reads no split), so a run pays for them once per corpus and split rule.
"""

from collections.abc import Mapping, Sequence
import hashlib
import json
import os
import time

import numpy as np
import pyppmd

from tokjax.data import compression, corpora, ngram
from tokjax.errors import UserError

# Bump when a change alters the numbers, so that cached files of older versions are not read.
VERSION = 1
# Shakespeare's 4.5 MB train split fits; PPMd codes 0.5-1 MB/s, so a larger corpus costs about
# a minute per order tried at this cap.
TRAIN_MAX_BYTES = 8 * 2**20
PPMD_ORDERS = tuple(range(2, 17))
# PPMd restarts its model from scratch when its memory fills, losing the priming. At order 16 it
# filled 64 MiB but not 256 MiB coding Shakespeare's 4.8 MB of train + val (measured); 1 GiB covers
# the TRAIN_MAX_BYTES + SPLIT_MAX_BYTES cap at that rate. Only what the model uses is touched.
PPMD_MEMORY = 2**30
PPMD_FLUSH_BYTES = 8
SCORED = ('val', 'test')


def head(docs: Sequence[bytes], max_bytes: int) -> list[bytes]:
  """The documents holding the first max_bytes bytes of docs (the last one cut); stops reading
  there, so a lazily read split is not read whole."""
  out, left = [], max_bytes
  for d in docs:
    if left <= 0:
      break
    out.append(d[:left])
    left -= len(out[-1])
  return out


def ppmd_bits(train: bytes, data: bytes, order: int) -> float:
  """Bits PPMd (variant I, `order`, PPMD_MEMORY) spends on data after coding train."""
  encoder = pyppmd.Ppmd8Encoder(order, PPMD_MEMORY, 0)  # Restore method 0: restart when full.
  encoder.encode(train)
  return 8.0 * (len(encoder.encode(data)) + len(encoder.flush()))


def _ppmd(train: bytes, val: bytes, test: bytes) -> dict:
  by_order: dict[int, float] = {}
  best = PPMD_ORDERS[0]
  for order in PPMD_ORDERS:
    by_order[order] = ppmd_bits(train, val, order) / len(val)
    if by_order[order] < by_order[best]:
      best = order
    elif order - best >= 2:
      break
  return {
      'order': best,
      'val': by_order[best],
      'test': ppmd_bits(train, test, best) / len(test),
      'val_by_order': by_order,
  }


def _ngram(train: list[bytes], val: list[bytes], test: list[bytes]) -> dict:
  model = ngram.fit(train, ngram.MAX_ORDER)
  val_bpb = ngram.bits_per_order(model, val) / sum(map(len, val))
  best = int(np.argmin(val_bpb))
  return {
      'order': best + 1,
      'val': float(val_bpb[best]),
      'test': float(ngram.bits_per_order(model, test)[best] / sum(map(len, test))),
      'val_by_order': {k + 1: float(b) for k, b in enumerate(val_bpb)},
  }


def _digest(parts: Sequence[list[bytes]]) -> str:
  h = hashlib.blake2b(repr(('baselines', VERSION)).encode(), digest_size=16)
  for docs in parts:
    h.update(b'split %d\n' % len(docs))
    for d in docs:
      h.update(b'%d\n' % len(d))
      h.update(d)
  return h.hexdigest()


def compute(train: list[bytes], val: list[bytes], test: list[bytes]) -> dict:
  """{'val': {...}, 'test': {...}} of documents already cut to the caps: gzip, xz, ppmd, ngram bpb
  and the orders, plus 'seconds' and, per model, its val bpb at every order tried."""
  joined = {name: b''.join(docs) for name, docs in (('train', train), ('val', val), ('test', test))}
  empty = [name for name, data in joined.items() if not data]
  if empty:
    raise UserError(
        f'the {"/".join(empty)} split has no bytes, so the classical baselines are undefined; '
        'use a bigger corpus'
    )
  start = time.time()
  ppmd = _ppmd(joined['train'], joined['val'], joined['test'])
  ppmd_seconds = time.time() - start
  ng = _ngram(train, val, test)
  out: dict = {
      'version': VERSION,
      'train_bytes': len(joined['train']),
      'ppmd_seconds': round(ppmd_seconds, 2),
      'ngram_seconds': round(time.time() - start - ppmd_seconds, 2),
      'ppmd_val_by_order': ppmd['val_by_order'],
      'ngram_val_by_order': ng['val_by_order'],
  }
  for split in SCORED:
    out[split] = dict(
        compression.compressed_bpb(joined[split]),
        ppmd=ppmd[split],
        ppmd_order=ppmd['order'],
        ngram=ng[split],
        ngram_order=ng['order'],
        bytes=len(joined[split]),
    )
  return out


def cache_folder(data_dir: str | os.PathLike | None = None) -> str:
  """Where the numbers are cached: DATA_DIR/baselines (default: corpora.default_data_dir())."""
  return os.path.join(data_dir or corpora.default_data_dir(), 'baselines')


def reference(
    splits: Mapping[str, Sequence[bytes]],
    split: str,
    data_dir: str | os.PathLike | None = None,
    content_key: str | None = None,
) -> dict:
  """Reference bpb of splits[split]: {'gzip', 'xz'} and, for val and test, 'ppmd', 'ppmd_order',
  'ngram', 'ngram_order' (computed once, cached under `cache_folder(data_dir)`).

  content_key: a text that fixes the three splits' bytes (a prepared corpus's shard checksums), to
  key the cache by instead of the bytes read, so that a cached lookup reads none of the splits.
  """
  if split not in SCORED:
    return compression.split_bpb(head(splits[split], compression.SPLIT_MAX_BYTES))
  caps = {'train': TRAIN_MAX_BYTES, 'val': compression.SPLIT_MAX_BYTES}
  read = lambda name: head(splits[name], caps.get(name, compression.SPLIT_MAX_BYTES))
  if content_key is None:
    parts = [read(name) for name in ('train', 'val', 'test')]
    digest = _digest(parts)
  else:
    parts, digest = [], _digest([[b'content key', content_key.encode()]])
  path = os.path.join(cache_folder(data_dir), digest + '.json')
  if os.path.isfile(path):
    with open(path) as f:
      return json.load(f)[split]
  parts = parts or [read(name) for name in ('train', 'val', 'test')]
  result = compute(*parts)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f'{path}.{os.getpid()}.tmp'  # Processes computing the same file each write their own.
  with open(tmp, 'w') as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, path)
  return result[split]


def describe(ref: Mapping) -> str:
  """'gzip -9 2.9 | xz -9 2.5 | ppmd-8 1.9 | 6-gram 2.0' (the models where ref has them)."""
  text = f'gzip -9 {ref["gzip"]:.3f} | xz -9 {ref["xz"]:.3f}'
  if 'ppmd' in ref:
    text += f' | ppmd-{ref["ppmd_order"]} {ref["ppmd"]:.3f} | {ref["ngram_order"]}-gram '
    text += f'{ref["ngram"]:.3f}'
  return text
