"""Corpus specs -> documents (list[bytes]).

A spec is one of:
  NAME                     a registered corpus: tokjax/data/catalog.py declares them, docs/data.md's
                           table lists them (`python -m tokjax.data.prepare --list`)
  "hf:PATH.parquet", "hf:PATH.jsonl[#FIELD]"   local table, field "text" by default
  anything else            a local file, a folder (recursively) or a glob pattern
("prepared:DIR", a folder written by `python -m tokjax.data.prepare SPEC --out DIR`, is read by
pipeline.load_splits / build_data through tokjax.data.shards, not here.)

Documents are raw bytes, never decoded. Long documents are cut into
pseudo-documents at newlines, because train/val/test splits are by document.
"""

import ast
from collections.abc import Callable, Iterable, Iterator
import difflib
import functools
import glob
import hashlib
import json
import lzma
import os
from pathlib import Path
import re
import sysconfig
from typing import cast

from absl import logging
import numpy as np

from tokjax.data import registry
from tokjax.errors import UserError


def default_data_dir() -> Path:
  """Returns $TOKJAX_DATA_DIR if set, else ~/.cache/tokjax."""
  return Path(os.environ.get("TOKJAX_DATA_DIR") or "~/.cache/tokjax").expanduser()


def corpus_path(name: str, data_dir: str | os.PathLike | None = None) -> Path:
  """Where `python -m tokjax.data.prepare NAME` writes the registered corpus `name`."""
  return Path(data_dir or default_data_dir()).expanduser() / f"{name}.txt"


# Directory names whose .py files are tests or third-party code, not stdlib.
_STDLIB_SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)


def _spec_help(spec: str) -> str:
  """How to name a corpus, with every registered name, so that the list cannot fall behind them."""
  close = difflib.get_close_matches(spec, registry.names(), n=1)
  guess = f"did you mean {close[0]!r}? " if close else ""
  return (
      f"{guess}use a registered corpus ({', '.join(registry.names())}), 'hf:PATH.parquet', "
      "'hf:PATH.jsonl#FIELD', or an existing file, folder or glob (docs/data.md)"
  )


def split_long_document(doc: bytes, target_bytes: int = 32768) -> list[bytes]:
  """Cuts `doc` after the first newline at or past every `target_bytes` bytes.

  Pieces are at least target_bytes long (except the last) and concatenate back
  to `doc` exactly. A document without such a newline stays whole.
  """
  pieces, start = [], 0
  while len(doc) - start > target_bytes:
    cut = doc.find(b"\n", start + target_bytes)
    if cut < 0:
      break
    pieces.append(doc[start : cut + 1])
    start = cut + 1
  if start < len(doc):
    pieces.append(doc[start:])
  return pieces


# Each of Shakespeare's works opens with its title on the line before this one (glued to the end of
# the previous work, as in "[Exeunt.]AS YOU LIKE IT"), where some works close on "THE END".
_SHAKESPEARE_BYLINE = re.compile(rb"\n\n?by William Shakespeare\n")
_TITLE_AT_LINE_END = re.compile(rb"[A-Z][A-Z0-9 ,;'.]*$")


def shakespeare_works(text: bytes) -> list[tuple[int, str]]:
  """(offset, title) of each work (play or poem) in the shakespeare corpus's text, in file order:
  where its title starts, found from the byline under it."""
  works = []
  for m in _SHAKESPEARE_BYLINE.finditer(text):
    line_start = text.rfind(b"\n", 0, m.start()) + 1
    title = _TITLE_AT_LINE_END.search(text, line_start, m.start())
    start = title.start() if title else line_start
    if text.startswith(b"THE END", start) and start + 7 < m.start():
      start += 7  # The closing words of the previous work, not part of this title.
    works.append((start, text[start : m.start()].decode()))
  return works


def document_clusters(spec: str, docs, data_dir: str | None = None) -> list[int]:
  """The independent unit of the corpus `spec` each of `docs` (documents of any of its splits)
  comes from, as an index in the corpus: the unit of a clustered standard error
  (`tokjax.significance.paired_difference`), since pieces cut from one unit share its text.

  A unit is what the corpus's registered `units` finds in a document as its source yields it: for
  "shakespeare" a work, play or poem (`shakespeare_works`; a piece that spans two works belongs to
  the one with more of its bytes). A corpus without `units`, and any spec that is not a registered
  name, has one unit per such document (a file, a table row, for "stdlib" a source file, for
  "stdlib_docs" one module's docstrings or one pydoc topic) before `split_long_document` cuts it.
  Identical documents share the first one's unit. UserError when a document is not one of the
  corpus's.
  """
  unit_of = _unit_of_document(spec, data_dir)
  out = []
  for i, doc in enumerate(docs):
    unit = unit_of.get(bytes(doc))
    if unit is None:
      raise UserError(
          f"document {i} ({len(doc)} bytes) is not a document of corpus {spec!r}; "
          "pass the documents of that corpus's splits"
      )
    out.append(unit)
  return out


@functools.lru_cache(maxsize=4)
def _unit_of_document(spec: str, data_dir: str | None) -> dict[bytes, int]:
  corpus = registry.find(spec)
  unit_of: dict[bytes, int] = {}
  units_before = 0
  for raw in _raw_documents(spec, data_dir):
    pieces = split_long_document(raw)
    starts = corpus.units(raw) if corpus and corpus.units else []
    if starts:
      offsets = np.cumsum([0] + [len(p) for p in pieces])
      for piece, lo, hi in zip(pieces, offsets[:-1], offsets[1:]):
        # Bytes of the piece in each work: work k spans [starts[k], starts[k + 1]).
        bounds = np.clip(np.array(starts[1:] + [len(raw)]), lo, hi)
        inside = np.diff(np.concatenate([[lo], bounds]))
        unit_of.setdefault(piece, units_before + int(np.argmax(inside)))
      units_before += len(starts)
    else:
      for piece in pieces:
        unit_of.setdefault(piece, units_before)
      units_before += 1
  return unit_of


def stdlib_files() -> list[Path]:
  """The standard library's .py files, without test folders or site-packages."""
  root = Path(sysconfig.get_paths()["stdlib"])
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP_DIRS]
    files += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
  return sorted(files)


def stdlib_sources() -> Iterator[bytes]:
  """The bytes of each of `stdlib_files`, in order."""
  return (p.read_bytes() for p in stdlib_files())


def stdlib_docstrings(min_chars: int = 200) -> Iterator[bytes]:
  """English embedded in the standard library, as UTF-8 documents in a fixed order (no download).

  One document per module (sorted by path): its module, class and function docstrings longer than
  `min_chars` characters, in source order, dedented, separated by blank lines. Then one document per
  topic of `pydoc_data/topics.py` (the language reference `help()` shows), in file order.
  """
  kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  topics = None
  for path in stdlib_files():
    if path.parts[-2:] == ("pydoc_data", "topics.py"):
      topics = path
      continue
    try:
      tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
      continue  # A stdlib file this Python cannot parse carries no docstrings we can read.
    nodes = sorted(
        (n for n in ast.walk(tree) if isinstance(n, kinds)),
        key=lambda n: getattr(n, "lineno", 0),
    )
    docs = [d for d in map(ast.get_docstring, nodes) if d and len(d) > min_chars]
    if docs:
      yield "\n\n".join(docs).encode("utf-8", errors="surrogatepass") + b"\n"
  if topics is not None:
    tree = ast.parse(topics.read_bytes())
    for node in tree.body:
      if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
        for text in ast.literal_eval(node.value).values():
          yield text.encode("utf-8", errors="surrogatepass")


def load_documents(
    spec: str = "stdlib", *, data_dir: str | None = None, max_bytes: int | None = None
) -> list[bytes]:
  """Loads the corpus `spec` as a list of non-empty documents.

  Args:
    spec: corpus spec, see the module docstring.
    data_dir: cache folder of prepared corpora (default: default_data_dir()).
    max_bytes: stop adding documents once their total reaches this (the result
      is a deterministic prefix of the corpus). None: no cap.

  Returns:
    Documents; long ones are cut into ~32 KiB pieces (see `split_long_document`).
  """
  return list(iter_documents(spec, data_dir=data_dir, max_bytes=max_bytes))


def iter_documents(
    spec: str = "stdlib", *, data_dir: str | None = None, max_bytes: int | None = None
) -> Iterator[bytes]:
  """`load_documents` one document at a time, so a corpus of any size streams in bounded memory."""
  if max_bytes is not None and max_bytes <= 0:
    raise UserError(
        f"max_bytes must be positive, got {max_bytes}; " "use None (or 0 in configs) for no cap"
    )
  if spec.startswith("prepared:"):
    raise UserError(
        f"{spec!r} is already prepared; train on it with --config.data.corpus={spec}, "
        "or prepare its source spec again"
    )
  corpus = registry.find(spec)
  if max_bytes is None and corpus is not None:
    max_bytes = corpus.max_bytes
  # Sources are lazy, so a small max_bytes reads only a prefix of the corpus. Errors about the spec
  # itself come before the first document is asked for.
  raw_documents = _raw_documents(spec, data_dir)
  return _capped(raw_documents, spec, max_bytes)


def _capped(raw_documents: Iterator[bytes], spec: str, max_bytes: int | None) -> Iterator[bytes]:
  total = 0
  for raw in raw_documents:
    for doc in split_long_document(raw):
      if max_bytes is not None and total >= max_bytes:
        return
      yield doc
      total += len(doc)
  if not total:
    raise UserError(f"corpus {spec!r} has no non-empty documents; {_spec_help(spec)}")


def _raw_documents(spec: str, data_dir: str | None) -> Iterator[bytes]:
  corpus = registry.find(spec)
  if corpus is not None and corpus.read is not None:
    return iter(corpus.read())
  if corpus is not None:
    path = corpus_path(spec, data_dir)
    if corpus.shipped is not None:
      return iter([_shipped_bytes(corpus, path)])
    if path.is_file():
      return iter([path.read_bytes()])
    raise UserError(
        f"corpus {spec!r} is not prepared ({path} is missing); run "
        f"`python -m tokjax.data.prepare {spec}` first"
    )
  if spec.startswith("hf:"):
    return _hf_documents(spec)
  return _local_documents(spec)


def _shipped_bytes(corpus: registry.Corpus, path: Path) -> bytes:
  """The corpus as shipped, read from its prepared copy at path when that copy holds the same bytes
  (its `shipped` sha256). A copy that differs (an older download, an edited file) is left unread
  with a warning: a stale cache must not change what a config trains on unless the user names it."""
  assert corpus.shipped is not None  # Its one caller passes only shipped corpora.
  if path.is_file():
    data = path.read_bytes()
    digest, shipped = hashlib.sha256(data).hexdigest(), corpus.shipped[1]
    if digest == shipped:
      return data
    logging.warning(
        "corpus %r: %s differs from the copy shipped with tokjax (sha256 %s..., not %s...), so the "
        "shipped copy is read; to train on that file name it: --config.data.corpus=%s",
        corpus.name,
        path,
        digest[:12],
        shipped[:12],
        path,
    )
  return embedded_bytes(corpus.name)


def embedded_bytes(name: str) -> bytes:
  """The registered corpus `name` as shipped with tokjax (its `shipped` file), decompressed."""
  # Callers name a registered, shipped corpus (as the docstring says); other names fail as before.
  corpus = cast(registry.Corpus, registry.find(name))
  shipped = cast(tuple[str, str], corpus.shipped)
  return lzma.decompress((Path(__file__).parent / shipped[0]).read_bytes())


def _local_documents(spec: str) -> Iterator[bytes]:
  path = Path(spec).expanduser()
  if path.is_file():
    try:
      data = path.read_bytes()
    except OSError as e:
      raise UserError(f"cannot read corpus file {path} ({e.strerror}); fix its permissions") from e
    if not data:
      raise UserError(f"corpus file {path} is empty; point config.data.corpus at a file with text")
    return iter([data])
  if path.is_dir():
    return _read_files(_folder_files(path), f"corpus folder {path}")
  if any(c in spec for c in "*?["):
    files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
    files = [f for f in files if f.is_file()]
    if not files:
      raise UserError(
          f"corpus glob {spec!r} matches no files; " "check the pattern (quote it in shells)"
      )
    return _read_files(files, f"corpus glob {spec!r}")
  raise UserError(f"corpus path {spec!r} does not exist; {_spec_help(spec)}")


def _folder_files(root: Path) -> list[Path]:
  """Regular files under root, recursively, sorted, hidden files and folders skipped."""
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if not d.startswith(".")]
    files += [Path(dirpath, f) for f in filenames if not f.startswith(".")]
  return sorted(f for f in files if f.is_file())


def _read_files(files: Iterable[Path], what: str) -> Iterator[bytes]:
  """Yields the non-empty readable files; raises if there were none."""
  found = False
  for f in files:
    try:
      data = f.read_bytes()
    except OSError:
      continue  # Unreadable files in a big folder are skipped, not fatal.
    if data:
      found = True
      yield data
  if not found:
    raise UserError(
        f"{what} has no readable non-empty files; " "put text files in it or pick another corpus"
    )


def _import_datasets():
  try:
    import datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise UserError(
        "Hugging Face corpora need the `datasets` package; " "run `pip install -e .[hf]`"
    ) from e
  return datasets


def _hub_problem(path: str, spec: str, e: Exception) -> str:
  reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
  return (
      f"cannot reach the Hugging Face dataset {path!r} for corpus {spec!r} ({reason}); connect to "
      "the Hub, or train on local data: a file, a folder, 'hf:PATH.parquet', or a folder that "
      "`python -m tokjax.data.prepare SPEC --out DIR` wrote on a connected machine "
      "(--config.data.corpus=prepared:DIR)"
  )


def _check_hub(path: str, spec: str) -> None:
  """UserError at once when the Hub does not answer for dataset `path`: `datasets` would retry for
  about half a minute, logging each try, and end in a ConnectionError traceback. One request to the
  Hub's API, made as `datasets` makes its own (HF_ENDPOINT, proxies, token, offline mode)."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top  (a dependency of `datasets`)

  try:
    huggingface_hub.HfApi().dataset_info(path)
  except Exception as e:  # pylint: disable=broad-except
    # Unreachable, offline mode, not found, gated: each means load_dataset cannot stream it.
    raise UserError(_hub_problem(path, spec, e)) from None


def hf_stream(
    spec: str, path: str, config_name: str | None, field: str, min_bytes: int = 0
) -> Callable[[], Iterator[bytes]]:
  """A registered corpus's `read`: the train split of the Hugging Face dataset `path` (its config
  `config_name`), streamed, one document per row's `field` longer than `min_bytes`; `spec` names
  the corpus in errors."""

  def read() -> Iterator[bytes]:
    # Errors about the install and the network come here, before the first document is asked for.
    datasets = _import_datasets()
    _check_hub(path, spec)
    try:
      rows = datasets.load_dataset(path, name=config_name, split="train", streaming=True)
    except ConnectionError as e:
      raise UserError(_hub_problem(path, spec, e)) from None
    return (d for d in _field_documents(rows, field, spec) if len(d) > min_bytes)

  return read


def _hf_documents(spec: str) -> Iterator[bytes]:
  name = spec.removeprefix("hf:")
  file_name, _, field = name.partition("#")
  file = Path(file_name).expanduser()
  kind = {".parquet": "parquet", ".jsonl": "json"}.get(file.suffix)
  if kind is None:
    raise UserError(f"unknown Hugging Face corpus {spec!r}; {_spec_help(spec)}")
  if not file.is_file():
    raise UserError(f"corpus file {file} (from {spec!r}) does not exist; fix the path")
  # Read here, not through `datasets`: local tables need no extra install, and the same file gives
  # the same documents whether or not it is installed (its JSON reader rejects blank lines and
  # lone surrogates, which these readers keep).
  if kind == "parquet":
    rows = _parquet_rows(file, field or "text", spec)
  else:
    rows = _jsonl_rows(file, spec)
  return _field_documents(rows, field or "text", spec)


def _field_documents(rows: Iterable[dict], field: str, spec: str) -> Iterator[bytes]:
  """Yields row[field] as bytes (str is UTF-8 encoded), skipping empty values."""
  for row in rows:
    if field not in row:
      raise UserError(
          f"{spec!r} has no field {field!r} (fields: {', '.join(sorted(row))}); "
          "append #FIELD to the spec to pick one"
      )
    value = row[field]
    if isinstance(value, str):
      # JSON can carry lone surrogates; keep them as bytes instead of failing.
      value = value.encode("utf-8", errors="surrogatepass")
    if value:
      yield bytes(value)


def _jsonl_rows(file: Path, spec: str) -> Iterator[dict]:
  with open(file, "rb") as f:
    for line_number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError as e:
        raise UserError(
            f"{file}:{line_number} is not valid JSON ({e}); " "fix or drop that line"
        ) from e
      if not isinstance(row, dict):
        raise UserError(
            f"{file}:{line_number} is not a JSON object; " f"{spec!r} needs one object per line"
        )
      yield row


def _parquet_rows(file: Path, field: str, spec: str) -> Iterator[dict]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise UserError("parquet corpora need pyarrow; run `pip install -e .[hf]`") from e
  table = pq.ParquetFile(file)
  names = table.schema_arrow.names
  if field not in names:
    raise UserError(
        f"{spec!r} has no column {field!r} (columns: {', '.join(names)}); "
        "append #COLUMN to the spec to pick one"
    )
  for batch in table.iter_batches(columns=[field]):
    yield from batch.to_pylist()
