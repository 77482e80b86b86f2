"""Reference bits-per-byte of classic compressors, to put model numbers in context."""

from collections.abc import Sequence
import gzip
import lzma

# xz at preset 9 runs at roughly 1-3 MB/s, so a split is judged by its first
# 8 MiB; both compressors see the same bytes, and 8 MiB exceeds their windows.
SPLIT_MAX_BYTES = 8 * 2**20


def compressed_bpb(data: bytes) -> dict[str, float]:
  """Bits per byte of `data` under gzip (level 9) and xz (preset 9)."""
  if not data:
    raise ValueError("bits per byte of empty data is undefined")
  sizes = {
      "gzip": len(gzip.compress(data, compresslevel=9, mtime=0)),
      "xz": len(lzma.compress(data, preset=9)),
  }
  return {name: 8.0 * size / len(data) for name, size in sizes.items()}


def split_bpb(docs: Sequence[bytes], max_bytes: int = SPLIT_MAX_BYTES) -> dict[str, float]:
  """`compressed_bpb` of the split's documents concatenated, first max_bytes only."""
  return compressed_bpb(b"".join(docs)[:max_bytes])
