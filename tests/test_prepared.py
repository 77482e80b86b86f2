"""Tests of prepared corpora (tokjax.data.shards) and their random-access grain pipelines."""

import collections
import json
import os
import re
import subprocess
import sys

import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tokjax import paths
from tokjax.data import baselines, compression, corpora, pipeline, prepare, shards
from tokjax.errors import UserError

SEQ_LEN = 16


def _write_corpus(folder, n=80, seed=0):
  """n files of random bytes, 1 to 400 bytes each (so windows span several documents)."""
  rng = np.random.default_rng(seed)
  folder.mkdir()
  for i in range(n):
    size = int(rng.integers(1, 400))
    (folder / f"doc{i:03d}.bin").write_bytes(rng.integers(0, 256, size, np.uint8).tobytes())
  return str(folder)


@pytest.fixture(name="corpus")
def fixture_corpus(tmp_path):
  return _write_corpus(tmp_path / "corpus")


def _prepare(spec, out, **kwargs):
  # Small shards: many shard boundaries for windows to cross.
  kwargs = dict(
      dict(shard_bytes=1500, val_fraction=0.15, test_fraction=0.15, progress=False), **kwargs
  )
  return shards.write_prepared(spec, str(out), **kwargs)


def _config(corpus, seed=0):
  return ml_collections.ConfigDict(
      {
          "seed": seed,
          "data": {
              "corpus": corpus,
              "data_dir": "",
              "max_bytes": 0,
              "val_fraction": 0.15,
              "test_fraction": 0.15,
              "split_seed": 0,
              "seq_len": SEQ_LEN,
              "batch_size": 4,
          },
          "eval": {"batch_size": 8, "max_batches": 3},
      }
  )


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def _rows(batch):
  return [(i.tobytes(), t.tobytes()) for i, t in zip(batch["inputs"], batch["targets"])]


def _hash_split(docs, seed=0, val=0.15, test=0.15):
  out = {name: [] for name in shards.SPLITS}
  for d in docs:
    out[shards.split_of(d, seed=seed, val_fraction=val, test_fraction=test)].append(d)
  return out


def test_prepared_and_in_memory_pipelines_give_the_same_batches(corpus, tmp_path):
  out = tmp_path / "prepared"
  manifest = _prepare(corpus, out)
  assert sum(len(manifest["splits"][k]["shards"]) for k in shards.SPLITS) > 6
  spec = f"prepared:{out}"
  # The folder's splits are the hash split of the source documents, in corpus order.
  lazy = pipeline.load_splits(_config(spec).data)
  in_memory = {k: list(v) for k, v in lazy.items()}
  assert in_memory == _hash_split(corpora.load_documents(corpus))
  for seed in (0, 1):
    prepared_data = pipeline.build_data(_config(spec, seed))
    assert isinstance(prepared_data, pipeline.PreparedData)
    memory_iter = pipeline.make_train_iterator(
        in_memory["train"], seq_len=SEQ_LEN, batch_size=4, seed=seed
    )
    _assert_batches_equal(_take(prepared_data.train_iter, 40), _take(memory_iter, 40))
  for split, batches in (("val", prepared_data.val_batches), ("test", prepared_data.test_batches)):
    # Evaluators attribute targets to documents through "example" (-1 on padding rows).
    assert all(b.keys() == {"inputs", "targets", "mask", "example"} for b in batches)
    _assert_batches_equal(
        batches,
        pipeline.make_eval_batches(in_memory[split], seq_len=SEQ_LEN, batch_size=8, max_batches=3),
    )
    ref = prepared_data.reference_bpb(split)
    assert {k: ref[k] for k in ("gzip", "xz")} == compression.split_bpb(in_memory[split])
    # Keyed by the shards' checksums, the baselines are those of the same documents in memory.
    assert ref == baselines.reference(in_memory, split, tmp_path / "data")
    assert prepared_data.num_bytes(split) == sum(map(len, in_memory[split]))
  uncapped = pipeline.make_prepared_eval_batches(
      prepared_data.readers["val"], seq_len=SEQ_LEN, batch_size=8
  )
  _assert_batches_equal(
      uncapped, pipeline.make_eval_batches(in_memory["val"], seq_len=SEQ_LEN, batch_size=8)
  )
  # Lazy documents: indexing, negative indexing and slices read single records.
  test_docs = prepared_data.splits["test"]
  assert test_docs[0] == in_memory["test"][0] and test_docs[-1] == in_memory["test"][-1]
  assert test_docs[1:3] == in_memory["test"][1:3] and len(test_docs) == len(in_memory["test"])


def test_split_membership_is_stable_under_streaming_and_across_processes(corpus, tmp_path):
  docs = corpora.load_documents(corpus)
  whole = _hash_split(docs)
  assert all(whole[k] for k in shards.SPLITS)
  # Different shard sizes and a prefix of the stream (max_bytes) put each document in the same split.
  a = _prepare(corpus, tmp_path / "a", shard_bytes=10**9)
  prefix_bytes = sum(map(len, docs)) // 2
  _prepare(corpus, tmp_path / "b", max_bytes=prefix_bytes)
  splits_a = pipeline.load_splits(_config(f"prepared:{tmp_path / 'a'}").data)
  splits_b = pipeline.load_splits(_config(f"prepared:{tmp_path / 'b'}").data)
  assert all(len(a["splits"][k]["shards"]) == 1 for k in shards.SPLITS)
  for k in shards.SPLITS:
    assert list(splits_a[k]) == whole[k]
    in_prefix = set(corpora.load_documents(corpus, max_bytes=prefix_bytes))
    assert list(splits_b[k]) == [d for d in whole[k] if d in in_prefix]
  # Another interpreter (another hash seed) assigns the same splits; a new split seed does not.
  code = (
      "import sys; from tokjax.data import corpora, shards;"
      f"docs = corpora.load_documents({corpus!r});"
      "print(''.join(shards.split_of(d, seed=0, val_fraction=0.15, test_fraction=0.15)[:2]"
      " for d in docs))"
  )
  env = dict(os.environ, PYTHONHASHSEED="12345")
  other = subprocess.run(
      [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
  ).stdout.strip()
  here = "".join(
      shards.split_of(d, seed=0, val_fraction=0.15, test_fraction=0.15)[:2] for d in docs
  )
  assert other == here
  assert here != "".join(
      shards.split_of(d, seed=1, val_fraction=0.15, test_fraction=0.15)[:2] for d in docs
  )


def test_every_byte_of_a_split_appears_once_per_epoch(corpus, tmp_path):
  _prepare(corpus, tmp_path / "p")
  _, readers = shards.open_splits(str(tmp_path / "p"))
  train = readers["train"]
  docs = list(train.iter_documents())
  stream = pipeline.pack_documents(docs)
  n = train.num_examples(SEQ_LEN)
  assert n == pipeline.num_examples(stream, SEQ_LEN)
  every = pipeline.get_examples(stream, np.arange(n), seq_len=SEQ_LEN)
  assert every["targets"][every["mask"] == 1].astype(np.uint8).tobytes() == b"".join(docs)
  iterator = pipeline.make_train_iterator(
      train, seq_len=SEQ_LEN, batch_size=4, seed=0, process_index=0, process_count=1
  )
  rows = [r for b in _take(iterator, -(-n // 4)) for r in _rows(b)][:n]
  assert collections.Counter(rows) == collections.Counter(_rows(every))


def test_resume_mid_epoch_reproduces_the_uninterrupted_sequence(corpus, tmp_path):
  _prepare(corpus, tmp_path / "p")
  config = _config(f"prepared:{tmp_path / 'p'}", seed=4)
  uninterrupted = _take(pipeline.build_data(config).train_iter, 12)
  iterator = pipeline.build_data(config).train_iter
  _take(iterator, 7)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(
        7, args=ocp.args.Composite(data=pipeline.iterator_checkpoint_args(iterator, save=True))
    )
    manager.wait_until_finished()
  fresh = pipeline.build_data(config).train_iter
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.restore(
        7, args=ocp.args.Composite(data=pipeline.iterator_checkpoint_args(fresh, save=False))
    )
  _assert_batches_equal(_take(fresh, 5), uninterrupted[7:])
  assert not np.array_equal(uninterrupted[0]["inputs"], uninterrupted[7]["inputs"])


def test_two_processes_read_disjoint_rows_forming_the_global_batch(corpus, tmp_path):
  _prepare(corpus, tmp_path / "p")
  _, readers = shards.open_splits(str(tmp_path / "p"))
  make = lambda index, count: pipeline.make_train_iterator(
      readers["train"],
      seq_len=SEQ_LEN,
      batch_size=8,
      seed=2,
      process_index=index,
      process_count=count,
  )
  whole, p0, p1 = _take(make(0, 1), 6), _take(make(0, 2), 6), _take(make(1, 2), 6)
  for full, a, b in zip(whole, p0, p1):
    assert a["inputs"].shape == b["inputs"].shape == (4, SEQ_LEN)
    assert not set(_rows(a)) & set(_rows(b))
    assert collections.Counter(_rows(a) + _rows(b)) == collections.Counter(_rows(full))
  with pytest.raises(UserError, match="not divisible"):
    make(0, 3)


def _error(capsys, argv):
  assert prepare.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err
  return err


def test_bad_prepared_folders_give_one_clear_line(corpus, tmp_path, capsys):
  good = tmp_path / "good"
  manifest = _prepare(corpus, good)
  assert prepare.main(["--verify", str(good)]) == 0
  capsys.readouterr()

  def broken(name, change):
    folder = tmp_path / name
    subprocess.run(["cp", "-r", str(good), str(folder)], check=True)
    change(folder)
    return str(folder)

  shard = manifest["splits"]["train"]["shards"][1]["file"]
  no_manifest = broken("no_manifest", lambda f: (f / shards.MANIFEST).unlink())
  missing = broken("missing", lambda f: (f / shard).unlink())
  truncated = broken("truncated", lambda f: os.truncate(f / shard, os.path.getsize(f / shard) - 9))

  def rewrite_manifest(folder, edit):
    m = json.loads((folder / shards.MANIFEST).read_text())
    edit(m)
    (folder / shards.MANIFEST).write_text(json.dumps(m))

  def bad_sum(m):
    m["splits"]["train"]["shards"][1]["sha256"] = "0" * 64

  checksum = broken("checksum", lambda f: rewrite_manifest(f, bad_sum))
  old = broken("old", lambda f: rewrite_manifest(f, lambda m: m.update(format_version=0)))
  expected = {
      no_manifest: r"is not a prepared corpus \(no manifest.json",
      missing: f"shard file {shard} named in manifest.json is missing",
      truncated: f"{shard} has .* bytes but manifest.json says .* \\(truncated or rewritten\\)",
      checksum: f"{shard} has sha256 .* but manifest.json says",
      old: "prepared in format version 0, this tokjax reads version 1; prepare it again",
  }
  for folder, message in expected.items():
    err = _error(capsys, ["--verify", folder])
    assert re.search(message, err), err
    if folder != checksum:  # Start-up checks sizes; only --verify reads every byte.
      with pytest.raises(UserError, match=message):
        pipeline.build_data(_config(f"prepared:{folder}"))
  # --out that exists and is not empty: refused, and the file in it is untouched.
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "keep.txt").write_bytes(b"mine")
  err = _error(capsys, [corpus, "--out", str(tmp_path / "busy"), "--no_progress"])
  assert "exists and is not empty" in err
  assert os.listdir(tmp_path / "busy") == ["keep.txt"]
  assert (tmp_path / "busy" / "keep.txt").read_bytes() == b"mine"
  err = _error(capsys, [corpus, "--out", str(good), "--no_progress"])
  assert "exists and is not empty" in err and prepare.main(["--verify", str(good)]) == 0


def test_corrupt_byte_inside_a_shard_is_caught_on_read(corpus, tmp_path):
  manifest = _prepare(corpus, tmp_path / "p", shard_bytes=10**9)
  path = tmp_path / "p" / manifest["splits"]["train"]["shards"][0]["file"]
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))
  docs = pipeline.load_splits(_config(f"prepared:{tmp_path / 'p'}").data)["train"]
  with pytest.raises(UserError, match="cannot read .*--verify"):
    list(docs)


def test_cloud_url_without_its_filesystem_package(tmp_path, capsys):
  try:
    import gcsfs  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import

    pytest.skip("gcsfs is installed; this checks the message shown without it")
  except ImportError:
    pass
  err = _error(capsys, ["stdlib", "--out", "gs://some-bucket/prepared", "--no_progress"])
  assert "needs the gcsfs package for gs:// paths; run `pip install gcsfs`" in err
  with pytest.raises(UserError, match="needs the gcsfs package"):
    pipeline.build_data(_config("prepared:gs://some-bucket/prepared"))
  with pytest.raises(UserError, match="unknown URL scheme"):
    paths.resolve("nosuch://x/y")


def test_local_paths_through_paths_helpers(tmp_path):
  root = paths.makedirs(tmp_path / "a" / "b")
  assert paths.is_empty_or_missing(root) and paths.is_empty_or_missing(tmp_path / "none")
  paths.write_text(paths.join(root, "x.txt"), "hello")
  assert paths.exists(paths.join(root, "x.txt")) and paths.read_text(root / "x.txt") == "hello"
  assert not paths.is_empty_or_missing(root)
  paths.remove(root / "x.txt")
  paths.remove(root / "x.txt")
  assert not paths.exists(root / "x.txt")
  assert paths.resolve(f"file://{tmp_path}") == paths.resolve(str(tmp_path))
  assert paths.is_local("~/x") and not paths.is_local("gs://b/x") and paths.scheme("s3://b") == "s3"


def test_prepare_cli_round_trip_with_file_url(corpus, tmp_path, capsys):
  out = f"file://{tmp_path / 'p'}"
  assert prepare.main([corpus, "--out", out, "--shard_bytes", "3000", "--no_progress"]) == 0
  assert f"--config.data.corpus=prepared:{out}" in capsys.readouterr().out
  splits = pipeline.load_splits(_config(f"prepared:{out}").data)
  assert [list(splits[k]) for k in shards.SPLITS] == [
      _hash_split(corpora.load_documents(corpus), val=0.05, test=0.05)[k] for k in shards.SPLITS
  ]
  with pytest.raises(UserError, match="already prepared"):
    corpora.load_documents(f"prepared:{out}")
  err = _error(capsys, ["nonsense"])
  assert "give --out DIR" in err
