"""Byte-level data: corpora -> documents (bytes) -> packed grain batches.

Modules:
  registry: the named corpora, one declaration each (catalog.py declares the built-in ones).
  corpora: `load_documents(spec)` turns a corpus spec into a list of documents.
  prepare: `python -m tokjax.data.prepare NAME` downloads a registered corpus that has a fetch;
    `... prepare SPEC --out DIR` writes any corpus as ArrayRecord shards; `--list` lists them.
  shards: the prepared-folder format: writing, checking, random-access reading.
  pipeline: splits, packing, train iterator, eval batches, `build_data(config)`
    (in memory, or 'prepared:DIR' by random access).
  compression: gzip / xz bits-per-byte reference numbers.
  ngram: a Witten-Bell byte n-gram language model (numpy).
  baselines: gzip, xz, PPMd and the n-gram as bits-per-byte references of val and test, cached.

This file only names the byte vocabulary (tokjax/vocab.py), so that importing it stays cheap
(the prepare command must not pull in jax or grain).
"""

from tokjax.vocab import BOS_ID, PAD_ID, VOCAB_SIZE

__all__ = ['BOS_ID', 'PAD_ID', 'VOCAB_SIZE']
