"""Parallel text files: locate (and download), read, check alignment and encoding, normalise.

A split is two files (line i of `src` translates line i of `tgt`) or one tab-separated bitext
(`source<TAB>target` per line, as OPUS and Tatoeba ship them), plain or gzipped, UTF-8. Lines
end with `\n`, `\r\n` or `\r` alone, in any mixture (universal newlines), and are numbered as
an editor numbers them; nothing else breaks a line (str.splitlines would also split on U+2028
and others, and silently misalign a parallel corpus). A UTF-8 byte-order mark is dropped, at
the start of a file and at the start of a bitext's field (a stray one left by joining files).
A bitext's first line that names its two languages is a header, not a pair: skipped.
"""

from __future__ import annotations

import codecs
import functools
import gzip
import itertools
import logging
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pycountry

from seq2seq.data.config import DataConfig
from seq2seq.data.download import fetch_missing, verify_file
from seq2seq.errors import DataError

log = logging.getLogger(__name__)

# Bumped whenever reading lines or `normalize` changes, so that caches built on the old text are
# not reused (2: universal newlines; 3: a bitext's header line and its fields' byte-order marks).
NORMALIZATION_VERSION = "nfkc-ws-3"
BOM = "\ufeff"
# what a bitext's header may call its columns besides the languages' codes and names
HEADER_WORDS = ({"source", "src"}, {"target", "tgt"})


def normalize(line: str) -> str:
    """NFKC, then whitespace runs collapsed to one space and stripped at both ends.

    Applied before tokenizer training and encoding; references for BLEU stay raw.
    """
    return " ".join(unicodedata.normalize("NFKC", line).split())


@dataclass(frozen=True)
class SplitPaths:
    name: str
    src: Path
    tgt: Path  # the same file as `src` for a tab-separated bitext
    tsv: bool = False
    languages: tuple[str, ...] = ()  # (source, target) codes: what a bitext's header names
    skip_malformed: bool = False  # a bitext line without exactly one tab: skipped, not an error

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.src,) if self.tsv else (self.src, self.tgt)

    def __str__(self) -> str:
        return str(self.src) if self.tsv else f"{self.src} and {self.tgt}"


def phrase_lists(lines: list[str], where: str, first: int) -> list[list[str]]:
    """Each line's tab-separated phrases (a constraints file: translate's and evaluate's
    `constraints=`), `first` the number of the first line; an empty one (two tabs in a row,
    or one at an end) is refused, naming `where` and the line."""
    lists = [line.split("\t") if line else [] for line in lines]
    for number, phrases in enumerate(lists, start=first):
        if any(not phrase.strip() for phrase in phrases):
            raise DataError(
                f"{where}, line {number}: an empty phrase (two tabs in a row, or one at an "
                "end); separate the phrases by single tabs"
            )
    return lists


def split_paths(data: DataConfig, name: str) -> SplitPaths:
    """The files of split `name`, `{src}` and `{tgt}` in their names read as data.src_lang and
    data.tgt_lang."""
    files = data.splits[name]
    root = Path(data.dir)

    def path(file: str) -> Path:
        return root / file.replace("{src}", data.src_lang).replace("{tgt}", data.tgt_lang)

    languages, skip = (data.src_lang, data.tgt_lang), data.on_malformed == "skip"
    if files.tsv is not None:
        return SplitPaths(name, path(files.tsv), path(files.tsv), True, languages, skip)
    return SplitPaths(name, path(files.src), path(files.tgt), False, languages, skip)


def ensure_available(data: DataConfig, names: list[str]) -> list[SplitPaths]:
    """Return the files of the named splits, downloading missing ones where the dataset allows."""
    splits = [split_paths(data, name) for name in names]
    files = list(dict.fromkeys(p for s in splits for p in s.files))
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


LINE_END = re.compile(r"\r\n|\r|\n")
CHUNK_BYTES = 1 << 20
# byte-order marks of encodings that are not UTF-8, longest first (UTF-32's starts as UTF-16's)
FOREIGN_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
LONGEST_BOM = max(len(bom) for bom, _ in FOREIGN_BOMS)
STDIN = "standard input"  # how errors name it


def line_blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The stream regrouped into blocks of whole lines, each ending with its line end, the last
    block perhaps without one. A UTF-8 character never spans two blocks: no byte of one is a
    line end."""
    pending: list[bytes] = []  # a line begun in earlier chunks (however long: joined once)
    for chunk in chunks:
        end = len(chunk) - chunk.endswith(b"\r")  # a last \r may be half of \r\n: held back
        cut = max(chunk.rfind(b"\n", 0, end), chunk.rfind(b"\r", 0, end)) + 1
        if cut == 0:
            pending.append(chunk)
            continue
        yield b"".join([*pending, chunk[:cut]])
        pending = [chunk[cut:]]
    if any(pending):
        yield b"".join(pending)


def split_block(text: str) -> list[str]:
    """A block's lines without their ends (`\\n`, `\\r\\n` or `\\r`)."""
    lines = LINE_END.split(text) if "\r" in text else text.split("\n")
    if text.endswith(("\n", "\r")):
        lines.pop()  # the empty string after the last line end
    return lines


def conversion(path: Path | None, encoding: str) -> str:
    """The command that converts `path` (standard input: None) from `encoding` to UTF-8."""
    command = f"iconv -f {encoding} -t UTF-8"
    return f"pipe it through {command}" if path is None else f"{command} {path.name}"


def check_encoding(path: Path | None, head: bytes) -> None:
    """UTF-16 and UTF-32 text (by its byte-order mark) is named, with the conversion."""
    for bom, encoding in FOREIGN_BOMS:
        if head.startswith(bom):
            how = conversion(path, encoding)
            if path is not None:
                how += f" > {path.stem}.utf8{path.suffix}"
            raise DataError(
                f"{path or STDIN} is {encoding} text (it starts with a {encoding} byte-order "
                f"mark); convert it to UTF-8, e.g. {how}"
            )


def decode_block(path: Path | None, first_line: int, block: bytes) -> str:
    """A block as text; bad bytes and NULs are named by line (counted from `first_line`) and
    column."""
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as e:
        before = block[: e.start].decode("utf-8")
        number, column = where(before, first_line)
        raise DataError(
            f"{path or STDIN}, line {number}: not valid UTF-8 (byte {block[e.start]:#04x} at "
            f"column {column}). Convert it to UTF-8, e.g. {conversion(path, 'latin1')}"
        ) from None
    if "\0" in text:
        number, column = where(text[: text.index("\0")], first_line)
        raise DataError(
            f"{path or STDIN}, line {number}: a NUL byte at column {column}: not a text file, or "
            f"UTF-16 without a byte-order mark; convert it to UTF-8 text, e.g. "
            f"{conversion(path, 'UTF-16LE')}"
        )
    return text


def where(before: str, first_line: int) -> tuple[int, int]:
    """(line, column) of the character after `before`, the text of a block up to it."""
    lines = LINE_END.split(before)
    return first_line + len(lines) - 1, len(lines[-1].encode("utf-8")) + 1


def stream_lines(stream: BinaryIO, path: Path | None) -> Iterator[str]:
    """Yield the lines of a binary stream (`path`'s, or standard input's: None) as they arrive,
    without their line ends (line ends and byte-order marks: module docstring). Reads what is
    there rather than waiting for a full chunk, so a pipe's lines are not held back."""
    chunks = iter(lambda: stream.read1(CHUNK_BYTES), b"")
    head = b""
    while len(head) < LONGEST_BOM and (chunk := next(chunks, b"")):
        head += chunk
    check_encoding(path, head)
    number = 1  # of the next line
    for block in line_blocks(itertools.chain([head.removeprefix(codecs.BOM_UTF8)], chunks)):
        lines = split_block(decode_block(path, number, block))
        number += len(lines)
        yield from lines


def iter_lines(path: Path) -> Iterator[str]:
    """Yield one sentence per line, exactly as stored (no normalisation), plain or gzip,
    without holding the file in memory (line ends and byte-order marks: module docstring)."""
    content = False
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for line in stream_lines(f, path):
                content = content or bool(line.strip())
                yield line
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if not content:
        raise DataError(f"{path} is empty: a data file needs at least one sentence per line")


def read_lines(path: Path) -> list[str]:
    """All lines of `path` (see iter_lines): for evaluation sets and hypothesis files."""
    return list(iter_lines(path))


@functools.cache
def language_words(code: str) -> frozenset[str]:
    """What a header may call a language, lowercased: its code and its ISO 639 English names
    (pycountry's: "yo" is "yoruba", "nso" is "pedi")."""
    try:
        found = pycountry.languages.get(**{"alpha_2" if len(code) == 2 else "alpha_3": code})
    except (KeyError, LookupError):  # pycountry before 22.1 raised for an unknown code
        found = None
    names = [getattr(found, key, None) for key in ("name", "common_name", "inverted_name")]
    return frozenset({code.lower(), *(n.lower() for n in names if n)})


def is_header(line: str, languages: tuple[str, ...]) -> bool:
    """Whether a bitext's first line names its columns: each field the code or English name
    of its language (any case), or source/src and target/tgt."""
    fields = [field.strip().lstrip(BOM).lower() for field in line.split("\t")]
    if len(fields) != 2 or len(languages) != 2:
        return False
    return all(
        field in words | language_words(code)
        for field, words, code in zip(fields, HEADER_WORDS, languages, strict=True)
    )


def bitext_header(split: SplitPaths) -> str | None:
    """The header line of a tab-separated split, if its first line is one (prepare says so)."""
    if not split.tsv:
        return None
    first = next(iter_lines(split.src), "")
    return first if is_header(first, split.languages) else None


def bitext_reading(split: SplitPaths) -> dict[str, bool]:
    """How a bitext's lines become pairs beyond its bytes, for cache keys."""
    return {"header": bitext_header(split) is not None, "skip_malformed": split.skip_malformed}


def bitext_lines(path: Path, languages: tuple[str, ...]) -> Iterator[tuple[int, str, int]]:
    """(line number, line, tabs) of a bitext's lines, a first line naming the `languages`
    (a header) left out."""
    for number, line in enumerate(iter_lines(path), start=1):
        if not (number == 1 and is_header(line, languages)):
            yield number, line, line.count("\t")


def malformed_lines(split: SplitPaths) -> list[tuple[int, int]]:
    """(line number, tabs) of each line of a bitext without exactly one tab (its header
    aside): what data.on_malformed=skip leaves out."""
    if not split.tsv:
        return []
    return [(n, tabs) for n, _, tabs in bitext_lines(split.src, split.languages) if tabs != 1]


def iter_bitext(
    path: Path, name: str, languages: tuple[str, ...] = (), skip_malformed: bool = False
) -> Iterator[tuple[str, str]]:
    """The (source, target) pairs of a tab-separated bitext: exactly one tab per line (others
    skipped with `skip_malformed`, else an error); a first line naming the `languages` is a
    header, skipped."""
    for number, line, tabs in bitext_lines(path, languages):
        if tabs != 1 and skip_malformed:
            continue
        if tabs != 1:
            raise DataError(
                f"{path}, line {number}: {tabs} tabs, where a tab-separated bitext has exactly "
                "one (source<TAB>target); remove tabs inside sentences, give two files with "
                f"data.splits.{name}.src=... data.splits.{name}.tgt=..., or leave such lines "
                "out with data.on_malformed=skip"
            )
        source, target = line.split("\t")
        yield source.removeprefix(BOM), target.removeprefix(BOM)


def side_lines(split: SplitPaths, side: str) -> Iterator[str]:
    """The lines of one side ("src" or "tgt") of a split."""
    if split.tsv:
        column = ("src", "tgt").index(side)
        pairs = iter_bitext(split.src, split.name, split.languages, split.skip_malformed)
        return (pair[column] for pair in pairs)
    return iter_lines(getattr(split, side))


def iter_parallel(split: SplitPaths) -> Iterator[tuple[str, str]]:
    """Yield the split's (source, target) line pairs; unequal line counts are an error."""
    if split.tsv:
        yield from iter_bitext(split.src, split.name, split.languages, split.skip_malformed)
        return
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
