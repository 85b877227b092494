"""Reading parallel files: exact lines, and a clear error for each kind of bad input."""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import threading
from pathlib import Path

import pytest
from helpers import write_lines

from seq2seq.data.corpus import (
    SplitPaths,
    bitext_header,
    bitext_reading,
    malformed_lines,
    normalize,
    read_lines,
    read_parallel,
    stream_lines,
)
from seq2seq.errors import DataError
from seq2seq.prepare import reading_lines


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


@pytest.mark.parametrize(
    "header",
    ["English\tZulu", "ENGLISH\tzulu", "en\tzu", "Source\tTarget", "src\tTGT", "\ufeffEn\tZU"],
)
def test_a_bitexts_first_line_naming_its_languages_is_skipped(tmp_path: Path, header: str):
    bitext = write_lines(tmp_path / "train.tsv", [header, "A dog.\tInja.", "English\tZulu"])
    split = SplitPaths("train", bitext, bitext, tsv=True, languages=("en", "zu"))
    # only the first line can be a header: the same words later are a pair
    assert read_parallel(split) == (["A dog.", "English"], ["Inja.", "Zulu"])
    assert bitext_header(split) == header.lstrip("\ufeff")  # the file's mark dropped


@pytest.mark.parametrize(
    ("first", "languages"),
    [
        ("Zulu\tEnglish", ("en", "zu")),  # the languages in the other order
        ("English\tGerman", ("en", "zu")),
        ("Hello\tSawubona", ("en", "zu")),
        ("English\tZulu", ()),  # languages unknown: nothing is a header
        ("English\tZulu\textra", ("en", "zu")),
    ],
)
def test_a_first_line_that_names_other_columns_is_a_pair(
    tmp_path: Path, first: str, languages: tuple[str, ...]
) -> None:
    bitext = write_lines(tmp_path / "train.tsv", [first, "A dog.\tInja."])
    split = SplitPaths("train", bitext, bitext, tsv=True, languages=languages)
    assert bitext_header(split) is None
    if first.count("\t") == 1:
        assert read_parallel(split)[0] == [first.split("\t")[0], "A dog."]
    else:
        with pytest.raises(DataError, match="line 1: 2 tabs"):
            read_parallel(split)


def test_a_byte_order_mark_at_a_fields_start_is_dropped(tmp_path: Path) -> None:
    """As one at the start of a file is: MENYO-20k's training file has two."""
    bitext = tmp_path / "train.tsv"
    bitext.write_bytes("\ufeffA dog.\t\ufeffInja.\nTwo\tmid\ufeffword\n".encode())
    split = SplitPaths("train", bitext, bitext, tsv=True, languages=("en", "zu"))
    assert read_parallel(split) == (["A dog.", "Two"], ["Inja.", "mid\ufeffword"])


def test_malformed_bitext_lines_are_refused_or_skipped_and_counted(tmp_path: Path) -> None:
    """data.on_malformed=error (the default) stops at the first line without exactly one tab,
    naming the key that skips them; skip leaves each out, and prepare counts them and names
    the first few."""
    lines = ["en\tzu", "A dog.\tInja."]
    lines += [f"bad {i}\twith\ttwo tabs" if i % 2 else f"no tab {i}" for i in range(7)]
    lines += ["Two cats.\tAmakati amabili."]
    bitext = write_lines(tmp_path / "dev.tsv", lines)
    strict = SplitPaths("val", bitext, bitext, tsv=True, languages=("en", "zu"))
    with pytest.raises(DataError, match=r"dev.tsv, line 3: 0 tabs.*data.on_malformed=skip"):
        read_parallel(strict)
    lenient = dataclasses.replace(strict, skip_malformed=True)
    assert read_parallel(lenient) == (["A dog.", "Two cats."], ["Inja.", "Amakati amabili."])
    assert malformed_lines(lenient) == [(n, 2 if n % 2 == 0 else 0) for n in range(3, 10)]
    assert bitext_reading(strict) != bitext_reading(lenient)  # their caches differ
    header, malformed = reading_lines(lenient)
    assert header == f"header: {bitext}, line 1 (en | zu) names the languages: skipped"
    assert malformed == (
        f"malformed: {bitext}: 7 lines without exactly one tab skipped (data.on_malformed=skip): "
        "line 3 (0 tabs), line 4 (2 tabs), line 5 (0 tabs), line 6 (2 tabs), line 7 (0 tabs) "
        "and 2 more"
    )
    assert reading_lines(strict) == [header]  # nothing is skipped where errors stop reading
