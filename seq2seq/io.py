"""File helpers that never leave a half-written file under the final name."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds.

    The temp name starts with a dot and ends in `.part` so that a crash leaves a file that no
    reader mistakes for the real one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes it private; use the usual mode
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: Path, replace: bool = False) -> Iterator[Path]:
    """Yield a temp directory beside `path`; rename it onto `path` only if the block succeeds.
    An existing `path` is kept (another process finished first) unless `replace`: then it is
    moved aside, the new one renamed into place, and the old one deleted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part"))
    old = tmp_path.with_suffix(".old")
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o777 & ~_umask())
        if path.exists():
            if not replace:
                return
            os.replace(path, old)
        os.replace(tmp_path, path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
