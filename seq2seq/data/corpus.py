"""Parallel text files: locate (and download), read, check alignment and encoding, normalise."""

from __future__ import annotations

import gzip
import logging
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from seq2seq.config import DataConfig
from seq2seq.data.download import fetch_missing, verify_file
from seq2seq.errors import DataError

log = logging.getLogger(__name__)

# Bumped whenever `normalize` changes, so that caches built on the old text are not reused.
NORMALIZATION_VERSION = "nfkc-ws-1"


def normalize(line: str) -> str:
    """NFKC, then whitespace runs collapsed to one space and stripped at both ends.

    Applied before tokenizer training and encoding; references for BLEU stay raw.
    """
    return " ".join(unicodedata.normalize("NFKC", line).split())


@dataclass(frozen=True)
class SplitPaths:
    name: str
    src: Path
    tgt: Path


def split_paths(data: DataConfig, name: str) -> SplitPaths:
    files = data.splits[name]
    root = Path(data.dir)
    return SplitPaths(name, root / files.src, root / files.tgt)


def ensure_available(data: DataConfig, names: list[str]) -> list[SplitPaths]:
    """Return the files of the named splits, downloading missing ones where the dataset allows."""
    splits = [split_paths(data, name) for name in names]
    files = list(dict.fromkeys(p for s in splits for p in (s.src, s.tgt)))
    missing = [p for p in files if not p.exists()]
    if missing and data.download is not None:
        fetch_missing(missing, data.download.url, data.download.sha256, "paths.data_dir")
    elif missing:
        listing = "\n".join(f"  {p}" for p in missing)
        raise DataError(
            f"data file(s) not found:\n{listing}\nCheck data.dir (now '{data.dir}') and "
            "data.splits.<split>.src / .tgt, e.g. data.splits.train.src=train.en"
        )
    for path in files:
        if path.is_dir():
            raise DataError(f"{path} is a directory; data.splits must name text files")
        if (
            data.verify_checksums
            and data.download is not None
            and path.name in data.download.sha256
        ):
            verify_file(path, data.download.sha256[path.name])
    return splits


def read_lines(path: Path) -> list[str]:
    """Read one sentence per line, exactly as stored (no normalisation), plain or gzip.

    Splits on '\\n' only: str.splitlines would also split on characters such as U+2028
    and silently misalign a parallel corpus.
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if not raw.strip():
        raise DataError(f"{path} is empty: a data file needs at least one sentence per line")
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path}, line {number}: not valid UTF-8 (byte {e.object[e.start]:#04x} at "
                f"column {e.start + 1}). Convert the file to UTF-8, e.g. "
                f"iconv -f latin1 -t utf-8 {path.name}"
            ) from None
        out.append(text.removesuffix("\r"))
    return out


def read_parallel(split: SplitPaths) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(split.src), read_lines(split.tgt)
    if len(src) != len(tgt):
        raise DataError(
            f"split '{split.name}' is not aligned: {split.src} has {len(src)} lines but "
            f"{split.tgt} has {len(tgt)}. Line i of one file must translate line i of the other."
        )
    return src, tgt
