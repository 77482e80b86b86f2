"""Prepared corpora: documents written once as ArrayRecord shards, read back by random access.

  python -m tokjax.data.prepare SPEC --out DIR [--max_bytes N]     # write (see prepare.py)
  --config.data.corpus=prepared:DIR                                 # train / evaluate on it

A prepared folder holds, per split ("train", "val", "test"):
  SPLIT-NNNNN.array_record   one record per document (raw bytes, never decoded)
  SPLIT-NNNNN.offsets.npy    int64[documents + 1]: where each document starts in the shard's part
                             of the packed stream ([BOS] + doc per document, as pipeline.py packs)
and manifest.json, written last (an interrupted prepare leaves no manifest): format version, source
spec, split rule, per-shard documents / bytes / tokens / file size / sha256, and the gzip / xz
reference bits-per-byte of the val and test splits (their first compression.SPLIT_MAX_BYTES bytes).

The split is decided per document: `split_of(doc)` hashes the document's bytes with BLAKE2b keyed by
the split seed, so a document lands in the same split whether the corpus is read whole or streamed,
in any order, by any process (no PYTHONHASHSEED, no pass over the list). Within a split documents
keep their corpus order, so the packed split stream is that of `pipeline.pack_documents(split_docs)`.

Reading never loads a split: `SplitReader` holds the manifest's per-shard token counts and loads a
shard's offsets (8 bytes per document) when a window first touches it, keeping at most
_MAX_CACHED_SHARDS of them; start-up work is a manifest read and one size check per shard.
Full checksums are checked by `verify` (`python -m tokjax.data.prepare --verify DIR`), which reads
every byte; start-up checks only the sizes (a truncated or rewritten shard) because hashing the whole
corpus at every start would make start-up grow with the corpus. A corrupt byte inside a shard that
keeps its size is still caught on read by ArrayRecord's (riegeli's) own chunk hashes.

This module needs neither jax nor grain, so that `prepare` stays light.
"""

from collections import OrderedDict
from collections.abc import Iterator, Sequence
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time

from array_record.python import array_record_module
import numpy as np

from tokjax import paths
from tokjax.data import BOS_ID, PAD_ID, compression, corpora
from tokjax.errors import UserError

FORMAT = 'tokjax-prepared'
FORMAT_VERSION = 1
MANIFEST = 'manifest.json'
SPLITS = ('train', 'val', 'test')
PREFIX = 'prepared:'
DEFAULT_SHARD_BYTES = 64 * 2**20
# Offsets of this many shards stay in memory per split (a shard of 64 MiB of 3 KB documents has
# ~20k documents, 170 KB of offsets), so memory is bounded however many shards a corpus has.
_MAX_CACHED_SHARDS = 64
# One record per group: random access then decodes just the record it needs.
_WRITER_OPTIONS = 'group_size:1'
_READER_OPTIONS = 'readahead_buffer_size:0,max_parallelism:0'


# ---------------------------------------------------------------- split rule


def split_of(doc: bytes, *, seed: int, val_fraction: float, test_fraction: float) -> str:
  """ "train", "val" or "test" for `doc`, from a 64-bit BLAKE2b hash of its bytes keyed by `seed`.

  u = hash / 2**64 is uniform in [0, 1): val if u < val_fraction, test if u < val_fraction +
  test_fraction, else train. The same document gets the same split on every machine and run.
  """
  digest = hashlib.blake2b(doc, digest_size=8, key=int(seed).to_bytes(8, 'little', signed=True))
  u = int.from_bytes(digest.digest(), 'little') / 2.0**64
  if u < val_fraction:
    return 'val'
  if u < val_fraction + test_fraction:
    return 'test'
  return 'train'


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
  if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
    raise UserError(
        f'val_fraction={val_fraction} and test_fraction={test_fraction} must be in '
        '[0, 1) and sum to less than 1; lower them'
    )


# ---------------------------------------------------------------- writing


def _sha256_file(path) -> str:
  h = hashlib.sha256()
  with paths.resolve(path).open('rb') as f:
    while chunk := f.read(2**20):
      h.update(chunk)
  return h.hexdigest()


class _Progress:
  """One self-overwriting stderr line: bytes read, bytes/s, documents per split."""

  def __init__(self, enabled: bool):
    self.enabled, self.start, self.last = enabled, time.time(), 0.0

  def update(self, nbytes: int, counts: dict, final: bool = False) -> None:
    now = time.time()
    if not self.enabled or (now - self.last < 0.5 and not final):
      return
    self.last = now
    rate = nbytes / max(now - self.start, 1e-9)
    docs = ' '.join(f'{k} {v:,}' for k, v in counts.items())
    print(
        f'\rprepare: {nbytes / 1e6:,.1f} MB read | {rate / 1e6:.2f} MB/s | documents {docs}',
        end='\n' if final else '',
        file=sys.stderr,
        flush=True,
    )


class _SplitWriter:
  """Writes one split's shards into a local staging folder and moves each finished one to `out`."""

  def __init__(self, name: str, out, staging: str, shard_bytes: int):
    self.name, self.out, self.staging, self.shard_bytes = name, out, staging, shard_bytes
    self.shards: list[dict] = []
    self.writer: array_record_module.ArrayRecordWriter | None = None
    self.offsets: list[int] = []
    self.documents = self.nbytes = 0

  def _file(self, suffix: str) -> str:
    return f'{self.name}-{len(self.shards):05d}{suffix}'

  def add(self, doc: bytes) -> None:
    if self.writer is None:
      self.writer = array_record_module.ArrayRecordWriter(
          os.path.join(self.staging, self._file('.array_record')), _WRITER_OPTIONS
      )
      self.offsets, self.shard_docs_bytes = [0], 0
    self.writer.write(doc)
    self.offsets.append(self.offsets[-1] + len(doc) + 1)
    self.shard_docs_bytes += len(doc)
    self.documents += 1
    self.nbytes += len(doc)
    if self.shard_docs_bytes >= self.shard_bytes:
      self.finish_shard()

  def finish_shard(self) -> None:
    if self.writer is None:
      return
    self.writer.close()
    self.writer = None
    record_file, index_file = self._file('.array_record'), self._file('.offsets.npy')
    buf = io.BytesIO()
    np.save(buf, np.asarray(self.offsets, np.int64))
    with open(os.path.join(self.staging, index_file), 'wb') as f:
      f.write(buf.getvalue())
    entry = {
        'file': record_file,
        'index': index_file,
        'documents': len(self.offsets) - 1,
        'bytes': self.shard_docs_bytes,
        'tokens': self.offsets[-1],
    }
    for key, name in (('', record_file), ('index_', index_file)):
      local = os.path.join(self.staging, name)
      entry[key + 'size'] = os.path.getsize(local)
      entry[key + 'sha256'] = _sha256_file(local)
      # Copy then delete, so local disk holds at most one shard (epath copies to any backend).
      target = paths.join(self.out, name)
      if paths.is_local(self.out):
        shutil.move(local, os.fspath(target))
      else:
        paths.resolve(local).copy(target)
        os.remove(local)
    self.shards.append(entry)

  def summary(self) -> dict:
    return {
        'documents': self.documents,
        'bytes': self.nbytes,
        'tokens': sum(s['tokens'] for s in self.shards),
        'shards': self.shards,
    }


def write_prepared(
    spec: str,
    out: str,
    *,
    data_dir: str | None = None,
    max_bytes: int | None = None,
    split_seed: int = 0,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: bool = True,
) -> dict:
  """Streams corpus `spec` into ArrayRecord shards under `out`; returns the manifest.

  Memory is bounded by one shard's offsets plus the reference sample (2 * SPLIT_MAX_BYTES): documents
  go straight to the shard writers. `out` must not exist or be an empty folder; nothing is
  overwritten. Documents are those of `corpora.load_documents(spec, max_bytes=max_bytes)`, in order.
  """
  _check_fractions(val_fraction, test_fraction)
  if shard_bytes < 1:
    raise UserError(f'--shard_bytes must be positive, got {shard_bytes}')
  if not paths.is_empty_or_missing(out):
    raise UserError(
        f'--out {out} exists and is not empty; choose a new folder or delete it first '
        '(nothing was written)'
    )
  root = paths.makedirs(out)
  start = time.time()
  sample: dict[str, list[bytes]] = {'val': [], 'test': []}
  sample_bytes = {'val': 0, 'test': 0}
  bar = _Progress(progress)
  with tempfile.TemporaryDirectory(prefix='tokjax-prepare-') as staging:
    writers = {name: _SplitWriter(name, out, staging, shard_bytes) for name in SPLITS}
    total = 0
    for doc in corpora.iter_documents(spec, data_dir=data_dir, max_bytes=max_bytes):
      name = split_of(doc, seed=split_seed, val_fraction=val_fraction, test_fraction=test_fraction)
      writers[name].add(doc)
      total += len(doc)
      if name in sample and sample_bytes[name] < compression.SPLIT_MAX_BYTES:
        sample[name].append(doc)
        sample_bytes[name] += len(doc)
      bar.update(total, {k: w.documents for k, w in writers.items()})
    for w in writers.values():
      w.finish_shard()
    bar.update(total, {k: w.documents for k, w in writers.items()}, final=True)
  empty = [name for name, w in writers.items() if not w.documents]
  if empty:
    raise UserError(
        f'corpus {spec!r} left split(s) {", ".join(empty)} without documents '
        f'({sum(w.documents for w in writers.values())} documents in all); use a bigger corpus or '
        f'larger --val_fraction/--test_fraction ({out} has shards but no manifest, delete it)'
    )
  reference_bpb = {
      name: dict(
          compression.split_bpb(docs),
          sample_bytes=min(sample_bytes[name], compression.SPLIT_MAX_BYTES),
      )
      for name, docs in sample.items()
  }
  seconds = time.time() - start  # Everything but the manifest write: the real throughput.
  manifest = {
      'format': FORMAT,
      'format_version': FORMAT_VERSION,
      'source': spec,
      'max_bytes': max_bytes,
      'split_rule': {
          'kind': 'blake2b-64',
          'description': (
              'u = int.from_bytes(blake2b(doc, digest_size=8, key=seed as 8-byte little-endian '
              'signed).digest(), "little") / 2**64; val if u < val_fraction, test if u < '
              'val_fraction + test_fraction, else train; corpus order kept within a split'
          ),
          'seed': split_seed,
          'val_fraction': val_fraction,
          'test_fraction': test_fraction,
      },
      'documents': sum(w.documents for w in writers.values()),
      'bytes': total,
      'splits': {name: w.summary() for name, w in writers.items()},
      'reference_bpb': reference_bpb,
      'prepare_seconds': round(seconds, 3),
      'prepare_bytes_per_s': round(total / max(seconds, 1e-9)),
  }
  # The manifest last: its presence marks a complete folder.
  (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + '\n')
  return manifest


# ---------------------------------------------------------------- reading


def is_prepared_spec(spec: str) -> bool:
  return spec.startswith(PREFIX)


def folder_of(spec: str) -> str:
  return spec.removeprefix(PREFIX)


def read_manifest(folder: str) -> dict:
  """The manifest of `folder`, checked: format version, every shard present with its size."""
  root = paths.resolve(folder)
  path = root / MANIFEST
  if not path.exists():
    raise UserError(
        f'{folder} is not a prepared corpus (no {MANIFEST}; an interrupted prepare leaves none); '
        f'run `python -m tokjax.data.prepare SPEC --out {folder}` into an empty folder'
    )
  try:
    manifest = json.loads(path.read_text())
  except ValueError as e:
    raise UserError(f'{path} is not valid JSON ({e}); prepare the corpus again') from None
  version = manifest.get('format_version') if isinstance(manifest, dict) else None
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    raise UserError(f'{path} is not a tokjax prepared-corpus manifest; prepare the corpus again')
  if version != FORMAT_VERSION:
    raise UserError(
        f'{folder} was prepared in format version {version}, this tokjax reads version '
        f'{FORMAT_VERSION}; prepare it again with `python -m tokjax.data.prepare '
        f'{manifest.get("source", "SPEC")} --out NEW_DIR`'
    )
  for name in SPLITS:
    for shard in manifest['splits'][name]['shards']:
      for key in ('', 'index_'):
        file = root / shard['index' if key else 'file']
        if not file.exists():
          raise UserError(
              f'{folder}: shard file {file.name} named in {MANIFEST} is missing; copy it back '
              'or prepare the corpus again'
          )
        stat = file.stat()
        size = getattr(stat, 'st_size', None)
        size = stat.length if size is None else size
        if size != shard[key + 'size']:
          raise UserError(
              f'{folder}: {file.name} has {size:,} bytes but {MANIFEST} says '
              f'{shard[key + "size"]:,} (truncated or rewritten); prepare the corpus again'
          )
  return manifest


def verify(folder: str) -> dict:
  """read_manifest plus the sha256 of every shard and index (reads the whole folder)."""
  manifest = read_manifest(folder)
  root = paths.resolve(folder)
  for name in SPLITS:
    for shard in manifest['splits'][name]['shards']:
      for key in ('', 'index_'):
        file = root / shard['index' if key else 'file']
        digest = _sha256_file(file)
        if digest != shard[key + 'sha256']:
          raise UserError(
              f'{folder}: {file.name} has sha256 {digest[:16]}... but {MANIFEST} says '
              f'{shard[key + "sha256"][:16]}... (corrupt or replaced); prepare the corpus again'
          )
  return manifest


class SplitReader:
  """Random access to one split of a prepared folder: documents and packed-stream windows.

  The packed stream is [BOS] + doc for each document of the split, in order (uint16[tokens]),
  exactly `pipeline.pack_documents(documents)`; it is never materialised. Thread-safe: each
  thread opens its own ArrayRecord readers.
  """

  def __init__(self, folder: str, manifest: dict, split: str):
    self.folder, self.split = folder, split
    info = manifest['splits'][split]
    self.shards = info['shards']
    self.num_documents, self.num_bytes, self.num_tokens = (
        info['documents'],
        info['bytes'],
        info['tokens'],
    )
    self._token_starts = np.cumsum([0] + [s['tokens'] for s in self.shards])
    self._doc_starts = np.cumsum([0] + [s['documents'] for s in self.shards])
    self._offsets: OrderedDict[int, np.ndarray] = OrderedDict()
    self._lock = threading.Lock()
    self._local = threading.local()

  def __getstate__(self):
    # Readers and locks do not pickle; a copy reopens its own.
    state = self.__dict__.copy()
    for key in ('_lock', '_local', '_offsets'):
      state.pop(key)
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._offsets, self._lock, self._local = OrderedDict(), threading.Lock(), threading.local()

  def _reader(self, k: int):
    readers = getattr(self._local, 'readers', None)
    if readers is None:
      readers = self._local.readers = {}
    if k not in readers:
      readers[k] = array_record_module.ArrayRecordReader(
          _local_copy(self.folder, self.shards[k]), _READER_OPTIONS
      )
    return readers[k]

  def _shard_offsets(self, k: int) -> np.ndarray:
    with self._lock:
      if k in self._offsets:
        self._offsets.move_to_end(k)
        return self._offsets[k]
    shard = self.shards[k]
    data = paths.join(self.folder, shard['index']).read_bytes()
    if hashlib.sha256(data).hexdigest() != shard['index_sha256']:
      raise UserError(
          f'{self.folder}: {shard["index"]} does not match the sha256 in {MANIFEST} (corrupt or '
          'replaced); prepare the corpus again'
      )
    with self._lock:
      # np.load parses the header with `ast`, which Python 3.11 can fail to run in two threads at
      # once ("SystemError: AST constructor recursion depth mismatch"); grain reads from several.
      offsets = np.load(io.BytesIO(data))
      self._offsets[k] = offsets
      while len(self._offsets) > _MAX_CACHED_SHARDS:
        self._offsets.popitem(last=False)
    return offsets

  def _read(self, k: int, indices: Sequence[int]) -> list[bytes]:
    try:
      return self._reader(k).read(list(indices))
    except Exception as e:  # riegeli reports corruption as a bare RuntimeError/ValueError.
      raise UserError(
          f'{self.folder}: cannot read {self.shards[k]["file"]} ({str(e).splitlines()[0][:200]}); '
          'check it with `python -m tokjax.data.prepare --verify '
          f'{self.folder}` and prepare the corpus again'
      ) from None

  def __len__(self) -> int:
    return self.num_documents

  def document(self, i: int) -> bytes:
    if not 0 <= i < self.num_documents:
      raise IndexError(i)
    k = int(np.searchsorted(self._doc_starts, i, 'right')) - 1
    return self._read(k, [i - int(self._doc_starts[k])])[0]

  def iter_documents(self, block: int = 256) -> Iterator[bytes]:
    for k, shard in enumerate(self.shards):
      for start in range(0, shard['documents'], block):
        yield from self._read(k, range(start, min(start + block, shard['documents'])))

  def tokens(self, start: int, stop: int) -> np.ndarray:
    """uint16[stop - start]: the packed stream from start to stop, PAD_ID past its end."""
    out = np.full(stop - start, PAD_ID, np.uint16)
    pos = start
    stop_in = min(stop, self.num_tokens)
    while pos < stop_in:
      k = int(np.searchsorted(self._token_starts, pos, 'right')) - 1
      base = int(self._token_starts[k])
      offsets = self._shard_offsets(k)
      first = int(np.searchsorted(offsets, pos - base, 'right')) - 1
      last = int(
          np.searchsorted(offsets, min(stop_in, int(self._token_starts[k + 1])) - base, 'left')
      )
      docs = self._read(k, range(first, last))
      piece = np.empty(int(offsets[last] - offsets[first]), np.uint16)
      at = 0
      for doc in docs:
        piece[at] = BOS_ID
        piece[at + 1 : at + 1 + len(doc)] = np.frombuffer(doc, np.uint8)
        at += len(doc) + 1
      piece_start = base + int(offsets[first])
      end = min(stop_in, piece_start + len(piece))
      out[pos - start : end - start] = piece[pos - piece_start : end - piece_start]
      pos = end
    return out

  def num_examples(self, seq_len: int) -> int:
    """As pipeline.num_examples(packed stream, seq_len)."""
    return max(1, -(-(self.num_tokens - 1) // seq_len))

  def windows(self, indices: np.ndarray, seq_len: int) -> np.ndarray:
    """uint16[B, seq_len + 1]: window i is tokens[i*L : i*L + L + 1]."""
    return np.stack(
        [self.tokens(int(i) * seq_len, int(i) * seq_len + seq_len + 1) for i in indices]
    ).reshape(len(indices), seq_len + 1)


def _local_copy(folder: str, shard: dict) -> str:
  """A local file path of `shard`: itself for a local folder, else a cached copy.

  The ArrayRecord reader opens POSIX files only, so shards of a cloud folder are copied once into
  $TOKJAX_DATA_DIR/prepared-cache (keyed by their sha256) when first read.
  """
  if paths.is_local(folder):
    return os.fspath(paths.join(folder, shard['file']))
  cache = corpora.default_data_dir() / 'prepared-cache'
  cache.mkdir(parents=True, exist_ok=True)
  local = cache / f'{shard["sha256"]}.array_record'
  if not local.exists():
    partial = local.with_suffix(f'.partial{os.getpid()}.{threading.get_ident()}')
    paths.join(folder, shard['file']).copy(paths.resolve(partial), overwrite=True)
    os.replace(partial, local)
  return os.fspath(local)


class PreparedDocuments(Sequence):
  """A split's documents as a read-only sequence of bytes, read from the shards on demand.

  len() and indexing are cheap; iterating reads the whole split (streamed, a block at a time).
  """

  def __init__(self, reader: SplitReader):
    self.reader = reader

  def __len__(self) -> int:
    return self.reader.num_documents

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self.reader.document(j) for j in range(*i.indices(len(self)))]
    i = int(i)
    return self.reader.document(i + len(self) if i < 0 else i)

  def __iter__(self) -> Iterator[bytes]:
    return self.reader.iter_documents()

  @property
  def num_bytes(self) -> int:
    return self.reader.num_bytes


def open_splits(spec_or_folder: str) -> tuple[dict, dict[str, SplitReader]]:
  """(manifest, {split: SplitReader}) of a prepared folder (spec 'prepared:DIR' or DIR)."""
  folder = folder_of(spec_or_folder)
  manifest = read_manifest(folder)
  return manifest, {name: SplitReader(folder, manifest, name) for name in SPLITS}
