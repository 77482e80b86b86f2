"""Byte-level data: corpora -> documents (bytes) -> packed grain batches.

Modules:
  corpora: `load_documents(spec)` turns a corpus spec into a list of documents.
  prepare: `python -m tokjax.data.prepare {shakespeare,bible}` downloads corpora;
    `... prepare SPEC --out DIR` writes any corpus as ArrayRecord shards.
  shards: the prepared-folder format: writing, checking, random-access reading.
  pipeline: splits, packing, train iterator, eval batches, `build_data(config)`
    (in memory, or 'prepared:DIR' by random access).
  bench_prepared: start-up time and memory against corpus size (results/data/).
  compression: gzip / xz bits-per-byte reference numbers.

This file only holds the byte vocabulary, so that importing it stays cheap
(the prepare command must not pull in jax or grain).
"""

# Token ids 0..255 are the raw bytes; documents are `bytes`, never decoded, so
# non-UTF-8 input is data rather than an error.
PAD_ID = 256
BOS_ID = 257
VOCAB_SIZE = 258
