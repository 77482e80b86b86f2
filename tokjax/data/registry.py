"""The registry of named corpora: one declaration per corpus, read by the loaders, prepare, docs.

A corpus is declared with `register(Corpus(...))`; the built-in ones in tokjax/data/catalog.py,
one entry each. From the registry come: what `--config.data.corpus=NAME` reads
(`corpora.load_documents`), what `python -m tokjax.data.prepare NAME` downloads, the corpus names
that errors list, the independent units of `corpora.document_clusters`, and the table of
docs/data.md (`python -m tokjax.data.prepare --list` prints it; tests/test_corpus_registry.py keeps
the two equal). Adding a corpus is one entry in catalog.py (or a file of your own that registers
when imported) plus its test. Spec forms that are not names (a path, 'hf:FILE.parquet',
'prepared:DIR') are read by corpora.py and shards.py, not declared here.
"""

import dataclasses
import importlib
import re
from typing import Callable, Iterable

from tokjax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Corpus:
  """One named corpus.

  name: the value of config.data.corpus.
  description: what the text is and where it comes from, one line for docs/data.md's table.
  size: its size as the table shows it ('5.06 MB'; for a stream, what one read gives).
  licence: the terms the text comes under, one line.
  read: () -> its raw documents, for a corpus read where it lies (no prepare step).
  fetch: a temporary folder -> its whole text, for a corpus that `python -m tokjax.data.prepare
    NAME` downloads once into the data folder as NAME.txt (exactly one of read and fetch).
  shipped: (file beside this module, sha256 of its decompressed bytes) for a fetched corpus that
    also ships with tokjax xz-compressed: the shipped bytes are read unless the prepared copy
    holds the same ones.
  units: a raw document -> the offsets where its independent units start (the works of a
    collection), the clusters of a clustered standard error; None: each raw document is one unit.
  max_bytes: the cap when none is given, for a stream that never ends.
  """

  name: str
  description: str
  size: str
  licence: str
  read: Callable[[], Iterable[bytes]] | None = None
  fetch: Callable[..., bytes] | None = None
  shipped: tuple[str, str] | None = None
  units: Callable[[bytes], list[int]] | None = None
  max_bytes: int | None = None


_CORPORA: dict[str, Corpus] = {}
# One element once the built-in declarations are imported (a flag, no `global`).
_DISCOVERED: list[bool] = []
# The module that declares the built-in corpora, loaded by name the first time the registry is read:
# it imports this module to declare them, so this module must not import it.
_BUILTIN_MODULE = 'tokjax.data.catalog'
# A fetched corpus is cached as NAME.txt, so its name must be a plain file name.
_FILE_NAME = re.compile(r'[a-z0-9_]+')


def register(corpus: Corpus) -> Corpus:
  """Adds a corpus (one already registered under that name is replaced by the new one)."""
  if (corpus.read is None) == (corpus.fetch is None):
    raise ValueError(f'corpus {corpus.name!r} needs exactly one of read and fetch')
  if corpus.fetch is not None and not _FILE_NAME.fullmatch(corpus.name):
    raise ValueError(f'fetched corpus {corpus.name!r} must be named with [a-z0-9_] only')
  if corpus.shipped is not None and corpus.fetch is None:
    raise ValueError(f'shipped corpus {corpus.name!r} needs a fetch that rebuilds it')
  if corpus.name.startswith('prepared:') or not corpus.name:
    raise ValueError(f'{corpus.name!r} cannot name a corpus')
  _CORPORA[corpus.name] = corpus
  return corpus


def unregister(name: str) -> None:
  """Removes a corpus added with `register` (for notebooks and tests that add one for a while)."""
  _CORPORA.pop(name, None)


def corpora() -> dict[str, Corpus]:
  """Every registered corpus by name, in the order declared."""
  if not _DISCOVERED:
    _DISCOVERED.append(True)
    importlib.import_module(_BUILTIN_MODULE)
  return dict(_CORPORA)


def find(name: str) -> Corpus | None:
  """The corpus called `name`, or None (the spec is then a path or another spec form)."""
  return corpora().get(name)


def names(fetched: bool = False) -> tuple[str, ...]:
  """The registered names (only those `prepare NAME` downloads, with fetched=True)."""
  return tuple(n for n, c in corpora().items() if not fetched or c.fetch is not None)


def get_fetched(name: str) -> Corpus:
  """The corpus `prepare NAME` downloads, or a UserError listing those there are."""
  corpus = find(name)
  if corpus is None or corpus.fetch is None:
    raise UserError(
        f'{name!r} is not a corpus to download; use one of {", ".join(names(fetched=True))}, '
        'or give --out DIR to write any corpus as shards'
    )
  return corpus


def _access(c: Corpus) -> str:
  """How a corpus is had, said from its declaration so that the table cannot drift from it."""
  prepare = f'`python -m tokjax.data.prepare {c.name}`'
  if c.shipped is not None:
    return (
        f'shipped with tokjax as `tokjax/data/{c.shipped[0]}`, the bytes {prepare} builds; a '
        'prepared copy in the cache folder is read only when it holds these bytes (one that '
        'differs gets a one-line warning: name its path as the corpus to train on it)'
    )
  if c.fetch is not None:
    return f'built once by {prepare} into `$TOKJAX_DATA_DIR` or `~/.cache/tokjax`'
  if c.max_bytes is not None:
    return f'streamed: the first {c.max_bytes / 2**20:g} MiB unless `config.data.max_bytes` is set'
  return 'on every machine, no download'


def table() -> str:
  """docs/data.md's table of the registered corpora (markdown)."""
  rows = ['| `--config.data.corpus=` | what | size | licence |', '|---|---|---|---|']
  for c in corpora().values():
    rows.append(f'| `{c.name}` | {c.description}; {_access(c)} | {c.size} | {c.licence} |')
  return '\n'.join(rows) + '\n'
