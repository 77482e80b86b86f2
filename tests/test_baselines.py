"""Tests of the classical baselines: the Witten-Bell byte n-gram, primed PPMd, their cache."""

from fractions import Fraction
import glob
import json
import os
import types

import numpy as np
import pyppmd
import pytest

from tokjax.config import defaults
from tokjax.data import baselines, compression, corpora, ngram, pipeline
from tokjax.errors import UserError

# A real corpus, small enough to fit and search every order in seconds.
_SPLIT = dict(
    max_bytes=400_000, val_fraction=0.1, test_fraction=0.1, split_seed=0, split_by="document"
)


@pytest.fixture(name="splits", scope="module")
def fixture_splits():
  docs = corpora.load_documents("shakespeare", max_bytes=_SPLIT["max_bytes"])
  return pipeline.split_documents(
      docs, val_fraction=_SPLIT["val_fraction"], test_fraction=_SPLIT["test_fraction"]
  )


@pytest.fixture(name="cached", scope="module")
def fixture_cached(splits, tmp_path_factory):
  """(data_dir, reference of val) computed once into a fresh cache."""
  data_dir = str(tmp_path_factory.mktemp("data"))
  return data_dir, baselines.reference(splits, "val", data_dir)


# ---------------------------------------------------------------- n-gram


def test_witten_bell_matches_hand_computed_probabilities():
  model = ngram.fit([b"aab", b"ab"], max_order=3)
  f = Fraction
  # Unigram: a 3 times, b twice, 2 distinct bytes, over a uniform 1/256.
  p1 = {c: (n + f(2, 256)) / 7 for c, n in (("a", 3), ("b", 2), ("c", 0))}
  # Bigram contexts: BOS -> a (twice, 1 distinct); a -> a once, b twice (2 distinct); b never.
  p2 = {
      ("BOS", "a"): (2 + p1["a"]) / 3,
      ("a", "b"): (2 + 2 * p1["b"]) / 5,
      ("a", "a"): (1 + 2 * p1["a"]) / 5,
      ("BOS", "b"): p1["b"] / 3,
      ("b", "a"): p1["a"],  # Unseen context: the unigram.
      ("BOS", "c"): p1["c"] / 3,
  }
  # Trigram: (BOS, BOS) -> a twice; (BOS, a) -> a once, b once; (a, a) -> b once.
  p3_aab = [(2 + p2[("BOS", "a")]) / 3, (1 + 2 * p2[("a", "a")]) / 4, (1 + p2[("a", "b")]) / 2]
  got = ngram.probabilities(model, [b"ab", b"ba", b"c"])
  want1 = [p1["a"], p1["b"], p1["b"], p1["a"], p1["c"]]
  want2 = [p2[k] for k in (("BOS", "a"), ("a", "b"), ("BOS", "b"), ("b", "a"), ("BOS", "c"))]
  np.testing.assert_allclose(got[0], [float(x) for x in want1], rtol=1e-12)
  np.testing.assert_allclose(got[1], [float(x) for x in want2], rtol=1e-12)
  np.testing.assert_allclose(
      ngram.probabilities(model, [b"aab"])[2], [float(x) for x in p3_aab], rtol=1e-12
  )
  bits = ngram.bits_per_order(model, [b"ab", b"ba", b"c"])
  np.testing.assert_allclose(bits[1], -sum(np.log2(float(x)) for x in want2), rtol=1e-12)


def test_ngram_distributions_sum_to_one(splits):
  model = ngram.fit(splits["train"], ngram.MAX_ORDER)
  for context in (b"", b"ROMEO.\n", b"the kin", b"\x00\xff\x01q"):
    docs = [context + bytes([w]) for w in range(256)]
    last = np.cumsum([len(d) for d in docs]) - 1
    p = ngram.probabilities(model, docs)[:, last]
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    assert (p > 0).all()


def test_ngram_rejects_bad_orders():
  for order in (0, ngram.MAX_ORDER + 1):
    with pytest.raises(ValueError, match="max_order"):
      ngram.fit([b"abc"], order)


# ---------------------------------------------------------------- PPMd


def test_primed_ppmd_is_train_plus_split_less_train(splits):
  train, data = b"".join(splits["train"])[:150_000], b"".join(splits["val"])[:30_000]

  def size(x):
    encoder = pyppmd.Ppmd8Encoder(5, baselines.PPMD_MEMORY, 0)
    return len(encoder.encode(x) + encoder.flush())

  primed = baselines.ppmd_bits(train, data, 5)
  literal = 8 * (size(train + data) - size(train))
  assert 0 <= primed - literal <= 8 * baselines.PPMD_FLUSH_BYTES
  assert primed < 0.9 * 8 * size(data)  # Having seen train helps.


# ---------------------------------------------------------------- reference and cache


def test_reference_chooses_orders_on_val_and_applies_them_to_test(splits, cached):
  data_dir, val = cached
  (path,) = glob.glob(os.path.join(baselines.cache_folder(data_dir), "*.json"))
  with open(path) as f:
    saved = json.load(f)
  assert saved["val"] == val
  assert set(val) == {"gzip", "xz", "ppmd", "ppmd_order", "ngram", "ngram_order", "bytes"}
  for name in ("ppmd", "ngram"):
    by_order = {int(k): v for k, v in saved[f"{name}_val_by_order"].items()}
    assert val[f"{name}_order"] == min(by_order, key=by_order.get)
    assert val[name] == by_order[val[f"{name}_order"]]
  assert val["ppmd"] < val["xz"] < val["gzip"] and val["ngram"] < val["xz"]
  assert {k: val[k] for k in ("gzip", "xz")} == compression.split_bpb(splits["val"])
  test = baselines.reference(splits, "test", data_dir)  # From the same file.
  assert test == saved["test"] and test["ngram_order"] == val["ngram_order"]
  model = ngram.fit(splits["train"], val["ngram_order"])
  n = sum(map(len, splits["test"]))
  assert test["ngram"] == pytest.approx(ngram.bits_per_order(model, splits["test"])[-1] / n)
  assert test["ppmd"] == baselines.ppmd_bits(
      b"".join(splits["train"]), b"".join(splits["test"]), val["ppmd_order"]
  ) / len(b"".join(splits["test"]))
  assert set(baselines.reference(splits, "train", data_dir)) == {"gzip", "xz"}


def test_reference_reads_its_cache_keyed_by_content(splits, cached, tmp_path):
  data_dir, val = cached
  folder = tmp_path / "data"
  (path,) = glob.glob(os.path.join(baselines.cache_folder(data_dir), "*.json"))
  saved = json.load(open(path))
  saved["val"]["ppmd"] = 123.0
  os.makedirs(baselines.cache_folder(folder))
  with open(os.path.join(baselines.cache_folder(folder), os.path.basename(path)), "w") as f:
    json.dump(saved, f)
  assert baselines.reference(splits, "val", folder)["ppmd"] == 123.0
  # Another test split is another corpus: computed afresh, beside the first file.
  changed = dict(splits, test=splits["test"][:-1] + [splits["test"][-1][:-1]])
  assert baselines.reference(changed, "val", folder) == val
  assert len(os.listdir(baselines.cache_folder(folder))) == 2


def test_classical_bpb_of_a_corpus_name(splits, cached):
  data_dir, val = cached
  config = types.SimpleNamespace(data_dir=data_dir, **_SPLIT)
  got = pipeline.classical_bpb("shakespeare", "val", config)
  assert got == val and {"gzip", "xz", "ppmd", "ngram"} <= set(got)
  with pytest.raises(UserError, match="val or test"):
    pipeline.classical_bpb("shakespeare", "train", config)
  # Without a config it splits as the default config does.
  d = defaults.base_config().data
  for field in ("data_dir", "max_bytes", "val_fraction", "test_fraction", "split_seed", "split_by"):
    assert getattr(pipeline._DefaultSplit, field) == d[field]  # pylint: disable=protected-access


def test_describe_names_every_baseline(cached):
  _, val = cached
  line = baselines.describe(val)
  assert f"ppmd-{val['ppmd_order']} {val['ppmd']:.3f}" in line
  assert f"{val['ngram_order']}-gram {val['ngram']:.3f}" in line and "gzip -9" in line
