"""Fetch dataset files by URL, verified by sha256 before they take their final name."""

from __future__ import annotations

import hashlib
import logging
import urllib.error
import urllib.request
from pathlib import Path

from seq2seq.concurrency import build_lock
from seq2seq.errors import DataError
from seq2seq.io import atomic_path, sha256_file

log = logging.getLogger(__name__)


def download_file(url: str, dest: Path, sha256: str | None, timeout: float = 60.0) -> None:
    """Download `url` to `dest`; on a checksum mismatch or a broken transfer, leave nothing."""
    with atomic_path(dest) as tmp:
        digest = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        got = digest.hexdigest()
        if sha256 is not None and got != sha256:
            raise DataError(
                f"checksum mismatch for {dest.name} downloaded from {url}: expected sha256 "
                f"{sha256}, got {got}. Nothing was saved; the source may have changed or the "
                "transfer was altered. Download it by hand and point paths.data_dir at it."
            )


def verify_file(path: Path, sha256: str) -> None:
    got = sha256_file(path)
    if got != sha256:
        raise DataError(
            f"checksum mismatch for {path}: expected sha256 {sha256}, got {got}. The file is "
            "damaged or a different version: delete it to download it again, or set "
            "data.verify_checksums=false if you changed it on purpose."
        )


def fetch_missing(
    files: list[Path], url_pattern: str, sha256: dict[str, str], data_dir_key: str
) -> None:
    """Download every missing file in `files`; report all failures in one error. Processes
    started together download a file once: the others wait for it."""
    failed: list[tuple[Path, str, str]] = []
    for path in files:
        url = url_pattern.format(file=path.name)
        try:
            with build_lock(path):
                if path.exists():  # another process downloaded it while this one waited
                    continue
                log.info("downloading %s from %s", path.name, url)
                download_file(url, path, sha256.get(path.name))
        except (urllib.error.URLError, OSError, ValueError) as e:
            failed.append((path, url, str(getattr(e, "reason", e))))
    if failed:
        listing = "\n".join(f"  {path}  <-  {url}  ({why})" for path, url, why in failed)
        raise DataError(
            f"{len(failed)} data file(s) are missing and could not be downloaded:\n{listing}\n"
            f"Download them by hand (and check their sha256), or point at a local copy with "
            f"{data_dir_key}=/path/to/data (the directory that holds the dataset's folder)."
        )
