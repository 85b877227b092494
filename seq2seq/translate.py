"""`python -m seq2seq.translate ckpt_path=... < input.txt > output.txt`: text in, translations
out (or `input=... output=...` files).

One output line per input line, in order (a line ends with `\\n`, `\\r\\n` or `\\r`, as in data
files); an empty line gives an empty line. With `decoding.nbest=k` (k > 1), k lines per input
line instead, best first, each
`<input line number, 1-based>\t<score>\t<text>` (the score of an empty line's k empty texts is
0). `ckpt_path` may be a checkpoint or a directory written by seq2seq.export; `checkpoints=[...]`
adds checkpoints decoded with it as one ensemble. `prefixes=FILE`: line i is the text output i
starts with; `constraints=FILE`: line i holds the phrases output i must contain, separated by
tabs (seq2seq.decoding.constraints). Reads in chunks,
so output to stdout starts before the input ends; an output file appears only when complete.
Logs go to stderr.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from seq2seq.cli import entrypoint
from seq2seq.data.corpus import STDIN, phrase_lists, stream_lines
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translation, Translator, default_device
from seq2seq.errors import DataError
from seq2seq.io import atomic_path

CHUNK_LINES = 1000


@dataclass
class TranslateConfig:
    """What `translate` reads (conf/translate.yaml): a checkpoint and how to decode."""

    ckpt_path: str
    checkpoints: list[str]  # more checkpoints, decoded with ckpt_path as one ensemble
    input: str | None  # a text file; default: standard input
    output: str | None  # written when complete (temp file, then rename); default: stdout
    prefixes: str | None  # a text file aligned with the input: what each output starts with
    constraints: str | None  # a text file aligned with the input: phrases, tab-separated
    decoding: DecodingConfig

    def check(self) -> None:
        self.decoding.check()


@contextlib.contextmanager
def open_input(path: str | None) -> Iterator[tuple[Iterator[str], str]]:
    """The input's lines, split as the corpus reader splits them, and its name for errors."""
    if path is None:
        yield stream_lines(sys.stdin.buffer, None), STDIN
        return
    if Path(path).is_dir():
        raise DataError(f"input={path} is a directory; give a text file, one sentence per line")
    if not Path(path).is_file():
        raise DataError(f"input={path} does not exist; check the path")
    with open(path, "rb") as f:
        yield stream_lines(f, Path(path)), path


@contextlib.contextmanager
def open_output(path: str | None) -> Iterator[TextIO]:
    if path is None:
        yield sys.stdout
        return
    folder = Path(path).parent
    if Path(path).is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise DataError(
            f"output={path}: not a file in a writable directory; give a file name in an "
            "existing directory you can write to"
        )
    with atomic_path(Path(path)) as tmp, open(tmp, "w", encoding="utf-8") as f:
        yield f


def nbest_lines(translations: list[list[Translation]], first_line: int) -> str:
    """The n-best format: `line number<TAB>score<TAB>text`, k lines per input line."""
    return "".join(
        f"{number}\t{score:.4f}\t{text}\n"
        for number, nbest in enumerate(translations, start=first_line)
        for text, score in nbest
    )


@contextlib.contextmanager
def open_aligned(path: str | None, setting: str) -> Iterator[tuple[Iterator[str] | None, str]]:
    """The lines of a file of one line per input line (`setting`=FILE), or nothing."""
    if path is None:
        yield None, setting
        return
    if not Path(path).is_file():
        raise DataError(
            f"{setting}={path} is not a file; give a text file, one line per input line"
        )
    with open(path, "rb") as f:
        yield stream_lines(f, Path(path)), path


def aligned_lines(
    file: Iterator[str] | None, where: str, count: int, first: int
) -> list[str] | None:
    """The next `count` lines of a file aligned with the input (None without one); one that
    ends before the input is refused."""
    if file is None:
        return None
    lines = list(itertools.islice(file, count))
    if len(lines) < count:
        raise DataError(
            f"{where} ends at line {first + len(lines) - 1}, the input goes on: give one line "
            "per input line (an empty line for none)"
        )
    return lines


def check_ended(file: Iterator[str] | None, where: str, lines: int) -> None:
    if file is not None and next(file, None) is not None:
        raise DataError(
            f"{where} has more lines than the input ({lines}): give one line per input line"
        )


@entrypoint(config_name="translate", schema=TranslateConfig)
def main(config: TranslateConfig) -> None:
    checkpoints = [config.ckpt_path, *config.checkpoints]
    translator = Translator.from_checkpoint(checkpoints, config.decoding, default_device())
    with (
        open_input(config.input) as (source, where),
        open_aligned(config.prefixes, "prefixes") as (prefix_file, prefix_where),
        open_aligned(config.constraints, "constraints") as (phrase_file, phrase_where),
        open_output(config.output) as target,
    ):
        first = 1
        while lines := list(itertools.islice(source, CHUNK_LINES)):
            prefixes = aligned_lines(prefix_file, prefix_where, len(lines), first)
            phrases = aligned_lines(phrase_file, phrase_where, len(lines), first)
            constraints = phrases and phrase_lists(phrases, phrase_where, first)
            if config.decoding.nbest > 1:
                nbest = translator.translate_nbest(lines, where, first, prefixes, constraints)
                target.write(nbest_lines(nbest, first))
            else:
                outputs = translator.translate(lines, where, first, prefixes, constraints)
                target.write("".join(t + "\n" for t in outputs))
            target.flush()
            first += len(lines)
        check_ended(prefix_file, prefix_where, first - 1)
        check_ended(phrase_file, phrase_where, first - 1)


if __name__ == "__main__":
    main()
