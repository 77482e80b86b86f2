"""Splits, packing and grain pipelines: documents (bytes) in, byte batches out.

Every split is packed into one uint16 stream, [BOS] + doc for each document,
and cut into examples of seq_len + 1 tokens with stride seq_len, so every byte
is predicted exactly once per epoch. Batches are dicts of numpy arrays:
  inputs: int32[B, L], targets: int32[B, L], mask: float32[B, L]
where mask is 1 exactly where the target is a real byte: bits-per-byte counts
bytes, not BOS or PAD.

Two sources feed the same pipelines:
  in memory   any corpus spec: documents are loaded into a list and split by
              `split_documents` (a seeded permutation over the list);
  prepared    'prepared:DIR' (see shards.py): documents stay in ArrayRecord
              shards, split once at prepare time by a per-document hash, and
              are read by random access, so start-up and memory do not grow
              with the corpus.
For one prepared folder and seed both paths give identical batches: the
in-memory path reads the folder's splits as they are (it does not split
again) and both run the same grain chain over the same packed stream. The
in-memory split rule is kept as it was (rather than switched to the hash
rule) so that every result already computed on in-memory corpora stays
bit-reproducible and tiny corpora keep at least one document per split.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import json
from typing import ClassVar, cast

import grain
import jax
import numpy as np

from tokjax.data import BOS_ID, PAD_ID, baselines, corpora, shards
from tokjax.errors import UserError

SPLITS = ("train", "val", "test")
SPLIT_BY = ("document", "unit")  # What config.data.split_by deals to the splits.


def split_documents(
    docs: Sequence[bytes],
    *,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    seed: int = 0,
    units: Sequence[int] | None = None,
) -> dict[str, list[bytes]]:
  """Splits documents into disjoint, covering "train", "val" and "test" lists.

  Val and test get round(fraction * n) documents but at least one each, picked
  by a permutation seeded with `seed`; documents keep their corpus order
  within a split. With `units` (the independent unit of each document, as
  `corpora.document_clusters` gives them) whole units are dealt instead, in a
  permutation of the units, until each held-out split has at least its share
  of documents: every piece of a work then lies in one split, so the test
  split measures text whose work the model never trained on.
  """
  n = len(docs)
  if n < 3:
    raise UserError(
        f"the corpus has {n} document(s) but train/val/test need at least 3; "
        "use a bigger corpus or a larger max_bytes"
    )
  if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
    raise UserError(
        f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in "
        "[0, 1) and sum to less than 1; lower them"
    )
  # Clipped so that train always keeps at least one document.
  n_val = min(max(1, round(n * val_fraction)), n - 2)
  n_test = min(max(1, round(n * test_fraction)), n - 1 - n_val)
  owner = np.zeros(n, np.int8)  # 0 = train, 1 = val, 2 = test.
  if units is None:
    perm = np.random.default_rng(seed).permutation(n)
    owner[perm[:n_val]] = 1
    owner[perm[n_val : n_val + n_test]] = 2
  else:
    owner = _deal_units(np.asarray(units), n_val, n_test, seed)
  return {name: [d for d, o in zip(docs, owner) if o == k] for k, name in enumerate(SPLITS)}


def _deal_units(units: np.ndarray, n_val: int, n_test: int, seed: int) -> np.ndarray:
  """int8[n] split owner of each document (0 train, 1 val, 2 test) when whole units are dealt: units
  in a seeded permutation go to val until it has n_val documents, then to test until n_test."""
  order = np.random.default_rng(seed).permutation(np.unique(units))
  owner = np.zeros(len(units), np.int8)
  wanted = {1: n_val, 2: n_test}
  split = 1
  for unit in order:
    if split > 2:
      break
    owner[units == unit] = split
    if (owner == split).sum() >= wanted[split]:
      split += 1
  if split <= 2 or not (owner == 0).any():
    raise UserError(
        f"the corpus has {len(np.unique(units))} independent units (works, files), too few to "
        "hold whole units out for val and test and keep one for training; use "
        "--config.data.split_by=document or a larger corpus"
    )
  return owner


def pack_documents(docs: Sequence[bytes]) -> np.ndarray:
  """Returns the stream uint16[sum(len(doc) + 1)]: [BOS_ID] + bytes of each doc."""
  stream = np.empty(sum(len(d) + 1 for d in docs), np.uint16)
  pos = 0
  for doc in docs:
    stream[pos] = BOS_ID
    stream[pos + 1 : pos + 1 + len(doc)] = np.frombuffer(doc, np.uint8)
    pos += len(doc) + 1
  return stream


def _check_positive(**values: int) -> None:
  for name, value in values.items():
    minimum = 2 if name == "seq_len" else 1
    if value < minimum:
      raise UserError(f"{name} must be at least {minimum}, got {value}; raise it in the config")


def num_examples(stream: np.ndarray, seq_len: int) -> int:
  """How many windows of seq_len targets it takes to cover stream[1:]."""
  _check_positive(seq_len=seq_len)
  return max(1, -(-(len(stream) - 1) // seq_len))


def get_examples(stream: np.ndarray, indices: np.ndarray, *, seq_len: int) -> dict[str, np.ndarray]:
  """Examples `indices` (int[B]) of `stream`, as inputs/targets/mask [B, seq_len].

  Example i is the window stream[i*L : i*L + L + 1]; positions past the end
  of the stream read as PAD_ID.
  """
  positions = np.asarray(indices)[:, None] * seq_len + np.arange(seq_len + 1)
  windows = np.where(
      positions < len(stream), stream[np.minimum(positions, len(stream) - 1)], PAD_ID
  ).astype(np.int32)
  targets = windows[:, 1:]
  return {"inputs": windows[:, :-1], "targets": targets, "mask": (targets < 256).astype(np.float32)}


def make_train_iterator(
    source: Sequence[bytes] | shards.SplitReader,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    process_index: int | None = None,
    process_count: int | None = None,
) -> grain.DatasetIterator:
  """Endless, checkpointable iterator of shuffled training batches.

  Each epoch is a different permutation of the examples (grain folds the epoch
  into the shuffle seed). Of each global batch of B rows, process p of P takes
  the contiguous block p (rows p * B / P to (p + 1) * B / P), so the processes'
  local batches, concatenated in process order (`sharding.global_batch`), are
  the very batch one process would read, row for row: a run is bitwise the same
  on one host or several (an interleaved split would reorder the rows, and
  with them the per-row random boundary draws and the order of every sum).

  A prepared split (a `shards.SplitReader`) gives the same examples (windows of seq_len + 1 tokens
  of the packed split, stride seq_len), the same shuffle and the same process sharding as its
  documents in memory, so both give identical batches for one seed; but only this process's
  windows are ever read (random access), and start-up reads nothing of the split.

  Args:
    source: training documents, or a prepared split's reader.
    seq_len: L, tokens per example.
    batch_size: global batch size, divisible by the process count.
    seed: shuffle seed; the same seed gives the same batches.
    process_index: this process (default: jax.process_index()).
    process_count: number of processes (default: jax.process_count()).

  Returns:
    A grain DatasetIterator over this process's batches of batch_size //
    process_count rows; save it with `iterator_checkpoint_args`.
  """
  _check_positive(seq_len=seq_len, batch_size=batch_size)
  process_index, process_count = _check_processes(batch_size, process_index, process_count)
  if isinstance(source, shards.SplitReader):
    n_examples = source.num_examples(seq_len)
    get_batch = functools.partial(_prepared_examples, source, seq_len=seq_len)
  else:
    stream = pack_documents(source)
    n_examples = num_examples(stream, seq_len)
    get_batch = functools.partial(get_examples, stream, seq_len=seq_len)
  rows = batch_size // process_count
  own = slice(process_index * rows, (process_index + 1) * rows)
  ds = (
      grain.MapDataset.range(n_examples)
      .shuffle(seed=seed)
      .repeat()
      .batch(batch_size, drop_remainder=True)  # Example indices only: each process reads its own.
      .map(lambda indices: get_batch(indices[own]))
  )
  # A batch is one numpy gather (in memory) or a few record reads (prepared): a couple of threads
  # and a short buffer suffice, and keep memory bounded for big batches.
  read_options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)
  return iter(ds.to_iter_dataset(read_options))


def _check_processes(batch_size, process_index, process_count):
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if batch_size % process_count:
    raise UserError(
        f"batch_size={batch_size} is not divisible by the {process_count} processes; "
        "make it a multiple of the process count"
    )
  return process_index, process_count


def windows_to_examples(windows: np.ndarray) -> dict[str, np.ndarray]:
  """int[B, L + 1] windows -> inputs/targets/mask [B, L], as get_examples returns them."""
  windows = windows.astype(np.int32)
  targets = windows[:, 1:]
  return {"inputs": windows[:, :-1], "targets": targets, "mask": (targets < 256).astype(np.float32)}


def _prepared_examples(reader: shards.SplitReader, indices, *, seq_len: int):
  return windows_to_examples(reader.windows(np.asarray(indices), seq_len))


def make_prepared_eval_batches(
    reader: shards.SplitReader, *, seq_len: int, batch_size: int, max_batches: int | None = None
) -> list[dict[str, np.ndarray]]:
  """`make_eval_batches` of a prepared split, reading only the windows it keeps.

  The same batches (order, padding and "example" field; both share `_eval_batches`); a test checks
  that both give identical batches.
  """
  _check_positive(seq_len=seq_len, batch_size=batch_size)
  return _eval_batches(
      reader.num_examples(seq_len),
      functools.partial(_prepared_examples, reader, seq_len=seq_len),
      batch_size=batch_size,
      max_batches=max_batches,
  )


def iterator_checkpoint_args(iterator: grain.DatasetIterator, *, save: bool):
  """Orbax args that save (or restore into) `iterator`, for ocp.args.Composite.

    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=iterator_checkpoint_args(train_iter, save=True)))
    manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=iterator_checkpoint_args(train_iter, save=False)))

  Restoring sets the iterator's position in place. Grain writes one small JSON
  file per process, so each process restores its own shard's position.
  """
  if save:
    return grain.checkpoint.CheckpointSave(iterator)
  return grain.checkpoint.CheckpointRestore(iterator)


def make_eval_batches(
    docs: Sequence[bytes], *, seq_len: int, batch_size: int, max_batches: int | None = None
) -> list[dict[str, np.ndarray]]:
  """Deterministic eval batches of a split, each with exactly batch_size rows.

  Examples are ordered by a fixed permutation (seed 0), so that the first
  max_batches batches are a uniform sample of the split, not just its first
  documents. The last batch is filled with PAD rows whose mask is 0.

  Besides inputs/targets/mask, each batch holds "example": int32[B], the index
  of each row's example in the packed stream (-1 for PAD rows): input byte t of
  row b sits at stream position example[b] * seq_len + t (`stream_positions`),
  so evaluators can attribute every target to its document without
  re-deriving the order. Model steps take only inputs/targets/mask.
  """
  _check_positive(seq_len=seq_len, batch_size=batch_size)
  stream = pack_documents(docs)
  return _eval_batches(
      num_examples(stream, seq_len),
      functools.partial(get_examples, stream, seq_len=seq_len),
      batch_size=batch_size,
      max_batches=max_batches,
  )


def _eval_batches(
    count: int, examples_of, *, batch_size: int, max_batches: int | None
) -> list[dict[str, np.ndarray]]:
  """The eval batches of `make_eval_batches` from `count` examples; `examples_of(int[n] indices)`
  returns their inputs/targets/mask. In-memory and prepared splits share it, so their batches agree.
  """
  order = np.random.default_rng(0).permutation(count)
  if max_batches is not None:
    order = order[: max_batches * batch_size]
  batches = []
  for start in range(0, len(order), batch_size):
    idx = order[start : start + batch_size]
    batch = examples_of(idx)
    pad = batch_size - len(batch["mask"])
    batch["inputs"] = np.pad(batch["inputs"], ((0, pad), (0, 0)), constant_values=PAD_ID)
    batch["targets"] = np.pad(batch["targets"], ((0, pad), (0, 0)), constant_values=PAD_ID)
    batch["mask"] = np.pad(batch["mask"], ((0, pad), (0, 0)))
    batch["example"] = np.pad(idx.astype(np.int32), (0, pad), constant_values=-1)
    batches.append(batch)
  return batches


def stream_positions(batch: dict[str, np.ndarray]) -> np.ndarray:
  """int64[B, L]: the packed-stream position of each input byte of an eval batch (-1 on PAD rows)."""
  example = batch["example"].astype(np.int64)[:, None]
  seq_len = batch["inputs"].shape[1]
  return np.where(example >= 0, example * seq_len + np.arange(seq_len), -1)


MODEL_KEYS = ("inputs", "targets", "mask")

# make_eval_batches or make_prepared_eval_batches, whose first argument differs.
EvalBuilder = Callable[..., list[dict[str, np.ndarray]]]


def model_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The arrays a model step reads (inputs, targets, mask), without eval bookkeeping."""
  return {k: batch[k] for k in MODEL_KEYS}


@dataclasses.dataclass
class Data:
  """Everything the trainer needs from the data side.

  Attributes:
    splits: "train"/"val"/"test" -> documents: lists for in-memory corpora; for
      a prepared corpus lazy `shards.PreparedDocuments` (len and indexing read
      one document; iterating streams the whole split, so prefer num_bytes).
    train_iter: endless iterator of this process's training batches.
    val_batches: eval batches of the val split (global batches, the same on
      every process).
    seq_len: L.
    eval_batch_size: rows per eval batch.
    eval_max_batches: cap on eval batches, None for the whole split.
    data_dir: the data folder, whose baselines/ caches `reference_bpb` ('' = the default).
  """

  splits: dict[str, Sequence[bytes]]
  train_iter: grain.DatasetIterator
  val_batches: list[dict[str, np.ndarray]]
  seq_len: int
  eval_batch_size: int
  eval_max_batches: int | None
  data_dir: str = ""
  _bpb: dict[str, dict] = dataclasses.field(default_factory=dict, repr=False)

  @functools.cached_property
  def test_batches(self) -> list[dict[str, np.ndarray]]:
    """Eval batches of the test split, built on first use."""
    return self._make_eval(
        self._eval_source("test"),
        seq_len=self.seq_len,
        batch_size=self.eval_batch_size,
        max_batches=self.eval_max_batches,
    )

  # Builds eval batches from what `_eval_source` gives: documents here, a reader in PreparedData.
  _make_eval: ClassVar[EvalBuilder] = staticmethod(make_eval_batches)

  def _eval_source(self, split: str):
    return self.splits[split]

  def reference_bpb(self, split: str) -> dict:
    """{"gzip", "xz"} bpb of the split and, for val and test, those of PPMd and an n-gram that saw
    train ("ppmd", "ppmd_order", "ngram", "ngram_order"); computed once per corpus: baselines.py."""
    if split not in self._bpb:
      self._bpb[split] = baselines.reference(self.splits, split, self.data_dir or None)
    return self._bpb[split]

  def num_bytes(self, split: str) -> int:
    """Bytes of documents in the split (without reading a prepared split)."""
    docs = self.splits[split]
    return docs.num_bytes if isinstance(docs, shards.PreparedDocuments) else sum(map(len, docs))


@dataclasses.dataclass
class PreparedData(Data):
  """Data of a prepared corpus: eval batches are read by random access (reference bpb read only
  the first bytes of each split, see baselines.py)."""

  readers: dict[str, shards.SplitReader] = dataclasses.field(default_factory=dict, repr=False)
  manifest: dict = dataclasses.field(default_factory=dict, repr=False)

  _make_eval = staticmethod(make_prepared_eval_batches)

  def _eval_source(self, split: str):
    return self.readers[split]

  def reference_bpb(self, split: str) -> dict:
    if split not in self._bpb and split in baselines.SCORED:
      # The shards' checksums fix the splits' bytes: a cached lookup then reads none of them.
      key = json.dumps(self.manifest["splits"], sort_keys=True)
      self._bpb[split] = baselines.reference(self.splits, split, self.data_dir or None, key)
    return super().reference_bpb(split)


def load_splits(data_config, corpus: str | None = None) -> dict[str, Sequence[bytes]]:
  """The documents of `corpus` (default data_config.corpus) split as training splits them.

  Reads data_config.{corpus, data_dir, max_bytes, val_fraction, test_fraction, split_seed,
  split_by}.
  Returns {"train", "val", "test"} -> documents: lists, or for a 'prepared:DIR'
  corpus lazy `shards.PreparedDocuments` split as the folder was prepared (its
  manifest's split rule; the config's fractions, split_seed and max_bytes do not apply).
  """
  d = data_config
  spec = corpus or d.corpus
  if shards.is_prepared_spec(spec):
    _, readers = shards.open_splits(spec)
    return {name: shards.PreparedDocuments(r) for name, r in readers.items()}
  data_dir = d.data_dir or None
  docs = corpora.load_documents(spec, data_dir=data_dir, max_bytes=d.max_bytes or None)
  # A data config written by hand before the field existed splits by document, as it did then.
  by_unit = getattr(d, "split_by", "document") == "unit"
  units = corpora.document_clusters(spec, docs, data_dir) if by_unit else None
  splits = split_documents(
      docs,
      val_fraction=d.val_fraction,
      test_fraction=d.test_fraction,
      seed=d.split_seed,
      units=units,
  )
  # dict is invariant: its lists are read as sequences only.
  return cast(dict[str, Sequence[bytes]], splits)


def classical_bpb(corpus: str, split: str = "test", data_config=None) -> dict:
  """{"gzip", "xz", "ppmd", "ngram"} bpb (and "ppmd_order", "ngram_order") of the val or test split
  of `corpus`, split as `load_splits` splits it under data_config (default: the default config's
  fractions and seed); computed once, then read from the cache (baselines.py)."""
  if split not in baselines.SCORED:
    raise UserError(
        f"split={split!r}: the baselines that saw train are scored on "
        f"{' or '.join(baselines.SCORED)} only; pick one of those"
    )
  d = data_config or _DefaultSplit()
  return baselines.reference(load_splits(d, corpus), split, d.data_dir or None)


class _DefaultSplit:
  """The split settings of the default config (tokjax/config/defaults.py), which tokjax.data may
  not import (a test checks that they agree)."""

  data_dir = ""
  max_bytes = 0
  val_fraction = 0.05
  test_fraction = 0.05
  split_seed = 0
  split_by = "document"


def build_data(config) -> Data:
  """Builds corpus, splits, train iterator and val batches from a ConfigDict.

  Reads config.seed (shuffle seed), config.data.{corpus, data_dir, max_bytes,
  val_fraction, test_fraction, split_seed, seq_len, batch_size} and
  config.eval.{batch_size, max_batches}; a 0 or '' means "default / no cap".
  A 'prepared:DIR' corpus gives a `PreparedData` that reads by random access.
  """
  data_cfg, eval_cfg = config.data, config.eval
  max_batches = eval_cfg.max_batches or None
  splits: dict[str, Sequence[bytes]]
  sources: Mapping[str, shards.SplitReader | Sequence[bytes]]
  cls: type[Data]
  if shards.is_prepared_spec(data_cfg.corpus):
    manifest, readers = shards.open_splits(data_cfg.corpus)
    splits = {name: shards.PreparedDocuments(r) for name, r in readers.items()}
    sources, cls, extra = readers, PreparedData, dict(readers=readers, manifest=manifest)
    # The two builders take different sources: cast to their common type for the one call below.
    make_train, make_eval = make_train_iterator, cast(EvalBuilder, make_prepared_eval_batches)
  else:
    splits = load_splits(data_cfg)
    sources, cls, extra = splits, Data, {}
    make_train, make_eval = make_train_iterator, cast(EvalBuilder, make_eval_batches)
  return cls(
      splits=splits,
      train_iter=make_train(
          sources["train"],
          seq_len=data_cfg.seq_len,
          batch_size=data_cfg.batch_size,
          seed=config.seed,
      ),
      val_batches=make_eval(
          sources["val"],
          seq_len=data_cfg.seq_len,
          batch_size=eval_cfg.batch_size,
          max_batches=max_batches,
      ),
      seq_len=data_cfg.seq_len,
      eval_batch_size=eval_cfg.batch_size,
      eval_max_batches=max_batches,
      data_dir=data_cfg.data_dir,
      **extra,
  )


def validate(config) -> None:
  """Raises UserError naming the first bad field `build_data` reads of config.data and config.eval
  (the corpus itself is checked when it is loaded)."""
  for field in ("data.batch_size", "eval.batch_size", "eval.max_batches"):
    section, key = field.split(".")
    if not config[section][key] > 0:
      raise UserError(f"config.{field}={config[section][key]!r} must be a positive number.")
  if config.data.seq_len < 2:
    raise UserError(
        f"config.data.seq_len={config.data.seq_len} is too short: a sequence needs at least "
        "2 bytes (one input, one target); set --config.data.seq_len=256 or similar."
    )
  if config.data.split_by not in SPLIT_BY:
    raise UserError(
        f"config.data.split_by={config.data.split_by!r} is not one of {SPLIT_BY}: 'document' "
        "deals documents to the splits, 'unit' whole works or files."
    )
