"""Reading parallel files: exact lines, and a clear error for each kind of bad input."""

from __future__ import annotations

import gzip
import io
import os
import threading
from pathlib import Path

import pytest
from helpers import write_lines

from seq2seq.data.corpus import (
    SplitPaths,
    normalize,
    read_lines,
    read_parallel,
    stream_lines,
)
from seq2seq.errors import DataError


def test_reads_plain_and_gzip_identically(tmp_path: Path) -> None:
    lines = ["Ein Hund läuft.", "", "  zwei  Leerzeichen ", "crlf"]
    plain = write_lines(tmp_path / "a.txt", lines)
    zipped = write_lines(tmp_path / "a.txt.gz", lines)
    assert read_lines(plain) == read_lines(zipped) == lines


def test_only_newline_ends_a_line(tmp_path: Path) -> None:
    # U+2028 and \x1c are line breaks to str.splitlines; here they must stay inside the line
    path = tmp_path / "x.txt"
    path.write_bytes("a\u2028b\nc\x1cd\r\ne".encode())
    assert read_lines(path) == ["a\u2028b", "c\x1cd", "e"]


def test_standard_input_yields_each_line_as_it_arrives() -> None:
    """translate reads standard input with the corpus reader: a line is yielded once it has
    ended, not when a chunk is full (the writer waits for the first line to be read)."""
    read_end, write_end = os.pipe()
    first_read = threading.Event()
    waited = []

    def write() -> None:
        with open(write_end, "wb", buffering=0) as pipe:
            pipe.write(b"first\r\nsecond")
            waited.append(first_read.wait(timeout=10))
            pipe.write(b"\rthird\n")

    writer = threading.Thread(target=write)
    writer.start()
    with open(read_end, "rb") as pipe:
        lines = stream_lines(pipe, None)
        first = next(lines)
        first_read.set()
        rest = list(lines)
    writer.join()
    assert (first, rest, waited) == ("first", ["second", "third"], [True])


def test_bad_standard_input_is_named_with_the_conversion() -> None:
    with pytest.raises(DataError) as info:
        list(stream_lines(io.BytesIO("gut\nschön\n".encode("latin-1")), None))
    assert str(info.value) == (
        "standard input, line 2: not valid UTF-8 (byte 0xf6 at column 4). Convert it to UTF-8, "
        "e.g. pipe it through iconv -f latin1 -t UTF-8"
    )
    with pytest.raises(DataError, match="^standard input is UTF-16 text .* pipe it through"):
        list(stream_lines(io.BytesIO("a dog\n".encode("utf-16")), None))


def test_normalize() -> None:
    assert normalize("  A  man\u00a0in\ta  hat. ") == "A man in a hat."
    assert normalize("ﬁne ①") == "fine 1"  # NFKC
    assert normalize("   ") == ""


def test_unequal_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    src = write_lines(tmp_path / "train.en", ["a", "b", "c"])
    tgt = write_lines(tmp_path / "train.de", ["a", "b"])
    with pytest.raises(DataError) as info:
        read_parallel(SplitPaths("train", src, tgt))
    message = str(info.value)
    assert str(src) in message and "3 lines" in message
    assert str(tgt) in message and "has 2" in message


def test_non_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.de.gz"
    path.write_bytes(gzip.compress("gut\nschön\n".encode("latin-1")))
    with pytest.raises(DataError) as info:
        read_lines(path)
    message = str(info.value)
    assert f"{path}, line 2" in message
    assert "0xf6" in message and "UTF-8" in message


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_file_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.en"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"{path} is empty"):
        read_lines(path)


def test_corrupt_gzip_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.en.gz"
    path.write_bytes(gzip.compress(b"a line\n")[:-6])
    with pytest.raises(DataError, match=f"cannot read {path}"):
        read_lines(path)
