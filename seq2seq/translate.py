"""`python -m seq2seq.translate ckpt_path=... < input.txt > output.txt`: text in, translations
out (or `input=... output=...` files).

One output line per input line, in order; an empty line gives an empty line. With
`decoding.nbest=k` (k > 1), k lines per input line instead, best first, each
`<input line number, 1-based>\t<score>\t<text>` (the score of an empty line's k empty texts is
0). `ckpt_path` may be a checkpoint or a directory written by seq2seq.export. Reads in chunks,
so output to stdout starts before the input ends; an output file appears only when complete.
Logs go to stderr.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from seq2seq.cli import entrypoint
from seq2seq.config import TranslateConfig
from seq2seq.decoding.translator import Translation, Translator, default_device
from seq2seq.errors import DataError
from seq2seq.io import atomic_path

CHUNK_LINES = 1000


@contextlib.contextmanager
def open_input(path: str | None) -> Iterator[tuple[BinaryIO, str]]:
    if path is None:
        yield sys.stdin.buffer, "standard input"
        return
    if Path(path).is_dir():
        raise DataError(f"input={path} is a directory; give a text file, one sentence per line")
    if not Path(path).is_file():
        raise DataError(f"input={path} does not exist; check the path")
    with open(path, "rb") as f:
        yield f, path


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


@entrypoint(config_name="translate", schema=TranslateConfig)
def main(config: TranslateConfig) -> None:
    translator = Translator.from_checkpoint(config.ckpt_path, config.decoding, default_device())
    with open_input(config.input) as (source, where), open_output(config.output) as target:
        number = 0
        while chunk := list(itertools.islice(source, CHUNK_LINES)):
            lines = []
            for raw in chunk:
                number += 1
                try:
                    lines.append(raw.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{where}, line {number}: not valid UTF-8 (byte {raw[e.start]:#04x}); "
                        "convert the input to UTF-8 (e.g. with iconv)"
                    ) from None
            first = number - len(lines) + 1
            if config.decoding.nbest > 1:
                target.write(nbest_lines(translator.translate_nbest(lines, where, first), first))
            else:
                target.write("".join(t + "\n" for t in translator.translate(lines, where, first)))
            target.flush()


if __name__ == "__main__":
    main()
