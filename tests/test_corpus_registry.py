"""The corpus registry (tokjax/data/registry.py): one declaration makes a corpus loadable, listed,
preparable and documented."""

import dataclasses
from pathlib import Path
import re

import ml_collections
import pytest

from tokjax.data import corpora, pipeline, prepare, registry
from tokjax.errors import UserError

DOCS = Path(__file__).parent.parent / 'docs' / 'data.md'
_TEXT = b''.join(b'work %d line %d\n' % (w, i) for w in range(3) for i in range(3000))


@pytest.fixture(name='tiny')
def fixture_tiny():
  """A corpus declared here and nowhere else: three works of text in one document."""
  corpus = registry.register(
      registry.Corpus(
          name='tiny_test_corpus',
          description='three made-up works',
          size='81 KB',
          licence='none (made up)',
          read=lambda: iter([_TEXT]),
          units=lambda text: [text.index(b'work %d' % w) for w in range(3)],
      )
  )
  yield corpus
  registry.unregister(corpus.name)
  corpora._unit_of_document.cache_clear()  # pylint: disable=protected-access


def test_docs_table_is_the_registrys():
  text = DOCS.read_text()
  start, end = '<!-- corpus table: python -m tokjax.data.prepare --list -->\n', '<!-- end corpus'
  found = re.search(f'{re.escape(start)}(.*?){re.escape(end)}', text, re.S)
  assert found, 'docs/data.md lost its corpus table markers'
  assert found.group(1) == registry.table(), 'run `python -m tokjax.data.prepare --list`'


def test_list_prints_the_table(capsys):
  assert prepare.main(['--list']) == 0
  assert capsys.readouterr().out == registry.table()


def test_every_builtin_corpus_is_declared_once_with_its_facts():
  found = registry.corpora()
  assert list(found)[:4] == ['stdlib_docs', 'stdlib', 'shakespeare', 'bible']
  assert {'hf:fineweb', 'hf:codeparrot'} <= set(found)
  for corpus in found.values():
    assert corpus.description and corpus.size and corpus.licence, corpus.name
    assert f'| `{corpus.name}` |' in registry.table()
  assert registry.names(fetched=True) == ('shakespeare', 'bible')


def test_a_registered_corpus_is_loadable_by_name_with_no_other_edit(tiny):
  docs = corpora.load_documents(tiny.name)
  assert b''.join(docs) == _TEXT and len(docs) == 5  # Cut into ~32 KiB pieces as any corpus.
  # Its own units: one raw document, yet each piece is clustered with the work it mostly holds.
  clusters = corpora.document_clusters(tiny.name, docs)
  assert clusters == sorted(clusters) and set(clusters) == {0, 1, 2}
  data = ml_collections.ConfigDict(
      dict(corpus=tiny.name, data_dir='', max_bytes=0, val_fraction=0.3, test_fraction=0.3)
  )
  data.split_seed = 0
  splits = pipeline.load_splits(data)
  assert sorted(d for s in splits.values() for d in s) == sorted(docs)
  assert f'| `{tiny.name}` | three made-up works' in registry.table()
  with pytest.raises(UserError, match=tiny.name):
    corpora.load_documents('no_such_corpus')
  registry.unregister(tiny.name)
  with pytest.raises(UserError, match='does not exist'):
    corpora.load_documents(tiny.name)


def test_unknown_name_lists_every_registered_corpus_in_one_line():
  for spec, message in [('shakespear', 'corpus path'), ('hf:fineweeb', 'unknown Hugging Face')]:
    with pytest.raises(UserError, match=message) as error:
      corpora.load_documents(spec)
    line = str(error.value)
    assert '\n' not in line
    for name in registry.names():
      assert name in line, name
    assert 'stdlib_docs' in line
  with pytest.raises(UserError, match="did you mean 'shakespeare'"):
    corpora.load_documents('shakespear')


def test_a_fetched_corpus_is_prepared_then_read_by_name(tmp_path, monkeypatch, capsys):
  calls = []

  def fetch(tmp):
    calls.append(tmp)
    return b'fetched text\n' * 100

  corpus = registry.Corpus(name='tiny_fetched', description='d', size='1 KB', licence='l')
  registry.register(dataclasses.replace(corpus, fetch=fetch))
  try:
    monkeypatch.setenv('TOKJAX_DATA_DIR', str(tmp_path))
    with pytest.raises(UserError, match='python -m tokjax.data.prepare tiny_fetched'):
      corpora.load_documents('tiny_fetched')
    assert prepare.main(['tiny_fetched']) == 0 and len(calls) == 1
    assert (tmp_path / 'tiny_fetched.txt').is_file()
    assert b''.join(corpora.load_documents('tiny_fetched')) == b'fetched text\n' * 100
    assert prepare.main(['stdlib']) == 2  # Read where it lies: nothing to download.
    err = capsys.readouterr().err
    assert 'shakespeare, bible, tiny_fetched' in err and '--out DIR' in err
  finally:
    registry.unregister('tiny_fetched')


def test_register_refuses_a_declaration_that_cannot_be_read():
  corpus = registry.Corpus(name='x', description='d', size='s', licence='l')
  for bad in [
      corpus,  # Neither read nor fetch.
      dataclasses.replace(corpus, read=list, fetch=bytes),
      dataclasses.replace(corpus, name='hf:x', fetch=bytes),  # Not a file name.
      dataclasses.replace(corpus, read=list, shipped=('x.xz', '0' * 64)),
  ]:
    with pytest.raises(ValueError):
      registry.register(bad)
  assert 'x' not in registry.corpora() and 'hf:x' not in registry.corpora()
