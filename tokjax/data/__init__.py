"""Byte-level data: corpora -> documents (bytes) -> packed grain batches.

Modules:
  corpora: `load_documents(spec)` turns a corpus spec into a list of documents.
  prepare: `python -m tokjax.data.prepare {shakespeare,bible}` downloads corpora (shakespeare also
    ships with tokjax: shakespeare.txt.xz);
    `... prepare SPEC --out DIR` writes any corpus as ArrayRecord shards.
  shards: the prepared-folder format: writing, checking, random-access reading.
  pipeline: splits, packing, train iterator, eval batches, `build_data(config)`
    (in memory, or 'prepared:DIR' by random access).
  compression: gzip / xz bits-per-byte reference numbers.

This file only names the byte vocabulary (tokjax/vocab.py), so that importing it stays cheap
(the prepare command must not pull in jax or grain).
"""

from tokjax.vocab import BOS_ID, PAD_ID, VOCAB_SIZE

__all__ = ['BOS_ID', 'PAD_ID', 'VOCAB_SIZE']
