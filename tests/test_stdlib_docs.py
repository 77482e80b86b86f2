"""The embedded English corpus: the standard library's long docstrings and pydoc topics."""

from tokjax.data import corpora


def test_stdlib_docs_is_english_prose_in_a_fixed_order():
  docs = corpora.load_documents('stdlib_docs')
  prefix = corpora.load_documents('stdlib_docs', max_bytes=300_000)
  assert docs[: len(prefix)] == prefix  # Same order and content each time.
  text = b''.join(docs)
  assert len(text) > 1_000_000 and all(docs)
  assert b'The "assert" statement' in text  # A pydoc topic, from pydoc_data/topics.py.
  # Prose, not code: the source files have 2.3 ' the ' and 240 '\ndef ' per MB (this: 7.6 and 2.8).
  assert text.count(b' the ') / len(text) > 5e-3
  assert text.count(b'\ndef ') / len(text) < 20e-6
  assert docs[0].decode('utf-8')  # Valid UTF-8 text.
