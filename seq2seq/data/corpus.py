"""Parallel text files: locate (and download), read, check alignment and encoding, normalise."""

from __future__ import annotations

import gzip
import itertools
import logging
import unicodedata
from collections.abc import Iterator
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


def iter_lines(path: Path) -> Iterator[str]:
    """Yield one sentence per line, exactly as stored (no normalisation), plain or gzip,
    without holding the file in memory.

    Splits on '\\n' only: str.splitlines would also split on characters such as U+2028
    and silently misalign a parallel corpus.
    """
    content = False
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                try:
                    text = line.removesuffix(b"\n").decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{path}, line {number}: not valid UTF-8 (byte {e.object[e.start]:#04x} "
                        f"at column {e.start + 1}). Convert the file to UTF-8, e.g. "
                        f"iconv -f latin1 -t utf-8 {path.name}"
                    ) from None
                content = content or bool(text.strip())
                yield text.removesuffix("\r")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if not content:
        raise DataError(f"{path} is empty: a data file needs at least one sentence per line")


def read_lines(path: Path) -> list[str]:
    """All lines of `path` (see iter_lines): for evaluation sets and hypothesis files."""
    return list(iter_lines(path))


def iter_parallel(split: SplitPaths) -> Iterator[tuple[str, str]]:
    """Yield the split's (source, target) line pairs; unequal line counts are an error."""
    sources, targets = iter_lines(split.src), iter_lines(split.tgt)
    for pairs, pair in enumerate(itertools.zip_longest(sources, targets)):
        if None in pair:
            src = pairs + (pair[0] is not None) + sum(1 for _ in sources)
            tgt = pairs + (pair[1] is not None) + sum(1 for _ in targets)
            raise DataError(
                f"split '{split.name}' is not aligned: {split.src} has {src} lines but "
                f"{split.tgt} has {tgt}. Line i of one file must translate line i of the other."
            )
        yield pair


def read_parallel(split: SplitPaths) -> tuple[list[str], list[str]]:
    pairs = list(iter_parallel(split))
    return [src for src, _ in pairs], [tgt for _, tgt in pairs]
