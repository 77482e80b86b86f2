"""Local paths and URLs (gs://, s3://, ...) through one interface, `etils.epath`.

Workdirs, checkpoints and prepared-data folders may live in a cloud bucket. Every function here takes
a local path or a URL; a URL whose filesystem package is missing (gcsfs for gs://, s3fs for s3://)
fails with one UserError line that names the package instead of an ImportError deep in a run:

  from tokjax import paths
  root = paths.resolve(config.train.workdir)      # epath.Path; checks the scheme's package.
  paths.makedirs(root)                            # mkdir -p
  paths.write_text(paths.join(root, 'config.json'), text)
  if paths.exists(paths.join(root, 'metrics.jsonl')): ...
  paths.check_writable(out, '--out')              # before a command's work: one line, not a crash

Local paths keep their meaning (`~` is expanded); `is_local` tells callers that need a POSIX file
(the ArrayRecord reader does) whether they have one. `lock` / `is_locked` / `lock_owner`: an
exclusive file lock (fcntl.flock) on a local file, which a process holds until it ends.
"""

import fcntl
import os
import tempfile
import time

from etils import epath

from tokjax.errors import UserError

# Schemes epath serves only through an optional package, and the package to install.
_SCHEME_PACKAGES = {
    'gs': 'gcsfs',
    's3': 's3fs',
    'az': 'adlfs',
    'abfs': 'adlfs',
    'hf': 'huggingface_hub',
}


def scheme(path: str | os.PathLike) -> str:
  """'gs' for 'gs://b/x', '' for a local path."""
  text = os.fspath(path)
  head, sep, _ = text.partition('://')
  return head if sep else ''


def is_local(path: str | os.PathLike) -> bool:
  return scheme(path) in ('', 'file')


def resolve(path: str | os.PathLike) -> epath.Path:
  """An epath.Path for `path`; raises UserError if the URL's filesystem package is missing."""
  kind = scheme(path)
  if is_local(path):
    return epath.Path(os.path.expanduser(os.fspath(path).removeprefix('file://')))
  try:
    resolved = epath.Path(os.fspath(path))
  except KeyError:
    raise UserError(
        f'{os.fspath(path)!r}: unknown URL scheme {kind}://; use a local path or gs:// / s3:// '
        '(with gcsfs / s3fs installed)'
    ) from None
  package = _SCHEME_PACKAGES.get(kind)
  if package is not None:
    try:
      __import__(package)
    except ImportError:
      raise UserError(
          f'{os.fspath(path)!r} needs the {package} package for {kind}:// paths; '
          f'run `pip install {package}` or use a local path'
      ) from None
  return resolved


def join(path: str | os.PathLike, *parts: str) -> epath.Path:
  return resolve(path).joinpath(*parts)


def exists(path: str | os.PathLike) -> bool:
  return resolve(path).exists()


def makedirs(path: str | os.PathLike) -> epath.Path:
  """mkdir -p; returns the path."""
  p = resolve(path)
  p.mkdir(parents=True, exist_ok=True)
  return p


def write_text(path: str | os.PathLike, text: str) -> None:
  resolve(path).write_text(text)


def read_text(path: str | os.PathLike) -> str:
  return resolve(path).read_text()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
  resolve(path).write_bytes(data)


def read_bytes(path: str | os.PathLike) -> bytes:
  return resolve(path).read_bytes()


def remove(path: str | os.PathLike) -> None:
  """Deletes a file (not a folder); no error if it is already gone."""
  p = resolve(path)
  if p.exists():
    p.unlink()


def is_empty_or_missing(path: str | os.PathLike) -> bool:
  """True if `path` does not exist or is an empty folder."""
  p = resolve(path)
  return not p.exists() or (p.is_dir() and not any(p.iterdir()))


def absolute(path: str | os.PathLike) -> str:
  """`path` as text that means the same from any working directory: an absolute local path, or
  the URL unchanged (a `file://` URL becomes its local path)."""
  p = resolve(path)
  return os.path.abspath(p) if is_local(path) else os.fspath(p)


def check_writable(path: str | os.PathLike, flag: str, suffix: str = '') -> None:
  """UserError unless this process can create the file or folder `path` + `suffix` (`path`: the
  value of `flag`, e.g. '--out'; suffix: what a command adds to a file prefix, '.json'). A command
  checks where it will write before its work, so a place it cannot write to costs one line instead
  of the whole computation. Creates nothing: a probe file in the nearest folder that exists is
  written and removed. An empty path is refused (it would name the current folder). A URL's bucket
  is not probed (its package is checked by `resolve`)."""
  text = os.fspath(path)
  if not text.strip():
    raise UserError(f'{flag} is empty; pass the path to write to.')
  resolved = resolve(text + suffix)
  if not is_local(path):
    return
  target = os.path.abspath(resolved)
  folder = os.path.dirname(target)
  while not os.path.lexists(folder):
    folder = os.path.dirname(folder)
  if not os.path.isdir(folder):
    raise UserError(
        f'cannot write to {flag} {text}: {folder} is a file, not a folder; choose another path.'
    )
  try:
    fd, probe = tempfile.mkstemp(dir=folder, prefix='.tokjax-write-test-')
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    raise UserError(
        f'cannot write to {flag} {text} ({e.strerror or e}); choose a folder you can write.'
    ) from None


def rmtree(path: str | os.PathLike) -> None:
  """Deletes a folder and everything in it; no error if it is already gone."""
  resolve(path).rmtree(missing_ok=True)


def lock(path: str | os.PathLike, owner: str, wait_s: float = 0.5) -> int | None:
  """An exclusive `fcntl.flock` on the local file `path` (created if missing): its file descriptor,
  or None when another open file holds the lock. The lock lasts until the descriptor is closed or
  the process ends (the kernel drops it then, so a killed holder leaves no stale lock). Once locked,
  the file's text becomes `owner`, for those refused to read (`lock_owner`).

  wait_s: how long to keep trying; a reader's `is_locked` probe holds the lock for an instant and must
  not turn a writer away.
  """
  fd = os.open(os.fspath(resolve(path)), os.O_RDWR | os.O_CREAT, 0o644)  # No O_TRUNC: owner's text.
  deadline = time.monotonic() + wait_s
  while True:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      break
    except BlockingIOError:
      if time.monotonic() >= deadline:
        os.close(fd)
        return None
      time.sleep(0.02)
  os.ftruncate(fd, 0)
  os.pwrite(fd, owner.encode(), 0)
  return fd


def lock_owner(path: str | os.PathLike) -> str:
  """The text the holder of `lock(path)` wrote ('' when none is there yet)."""
  try:
    return resolve(path).read_text().strip()
  except (OSError, UnicodeDecodeError):
    return ''


def is_locked(path: str | os.PathLike) -> bool:
  """Whether a process holds `lock(path)` now (False when the file does not exist)."""
  try:
    fd = os.open(os.fspath(resolve(path)), os.O_RDONLY)
  except FileNotFoundError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  finally:
    os.close(fd)  # Closing drops the shared lock, if taken.
