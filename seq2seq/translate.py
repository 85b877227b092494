"""`python -m seq2seq.translate ckpt_path=... < input.txt > output.txt`.

One output line per input line, in order; an empty line gives an empty line. Reads in chunks,
so output starts before the input ends. Logs go to stderr.
"""

from __future__ import annotations

import itertools
import sys

from seq2seq.cli import entrypoint
from seq2seq.config import TranslateConfig
from seq2seq.errors import DataError
from seq2seq.translator import Translator, default_device

CHUNK_LINES = 1000


@entrypoint(config_name="translate", schema=TranslateConfig)
def main(config: TranslateConfig) -> None:
    translator = Translator.from_checkpoint(config.ckpt_path, config.decoding, default_device())
    stdin, number = sys.stdin.buffer, 0
    while chunk := list(itertools.islice(stdin, CHUNK_LINES)):
        lines = []
        for raw in chunk:
            number += 1
            try:
                lines.append(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as e:
                raise DataError(
                    f"standard input, line {number}: not valid UTF-8 (byte "
                    f"{raw[e.start]:#04x}); convert the input to UTF-8 (e.g. with iconv)"
                ) from None
        sys.stdout.write("".join(t + "\n" for t in translator.translate(lines)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
