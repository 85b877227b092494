"""Corpora from the wild: every malformed corpus either prepares with the same pairs as its clean
twin (the same lines, one per `\\n`-ended line, UTF-8, two files) or fails with a one-line
DataError naming the file (and line where there is one); never another exception, never a
half-written cache."""

from __future__ import annotations

import codecs
import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_config, run, toy_corpus, toy_overrides
from omegaconf import OmegaConf

from seq2seq.config import config_to_dict, validate_config
from seq2seq.data.corpus import LINE_END, line_blocks, split_block
from seq2seq.data.datamodule import PreparedData, prepare
from seq2seq.errors import DataError
from seq2seq.upgrade import upgrade_config

SOURCES, TARGETS = toy_corpus()
SPLITS = {"train": (0, 240), "val": (240, 270), "test": (270, 300)}
Lines = dict[str, tuple[list[str], list[str]]]  # split -> (sources, targets)


def corpus(sources: list[str] = SOURCES, targets: list[str] = TARGETS) -> Lines:
    return {name: (sources[lo:hi], targets[lo:hi]) for name, (lo, hi) in SPLITS.items()}


def encode(lines: list[str], end: str | list[str] = "\n", last_end: bool = True) -> bytes:
    """Lines joined by `end` (or cycling through several), the last one ended or not."""
    ends = [end] if isinstance(end, str) else end
    text = "".join(line + ends[i % len(ends)] for i, line in enumerate(lines))
    if not last_end:
        text = text.removesuffix(ends[(len(lines) - 1) % len(ends)])
    return text.encode("utf-8")


Writer = Callable[[Path, Lines], list[str]]  # writes the files, returns the data overrides


def two_files(
    transform: Callable[[str, str, bytes], bytes] = lambda split, side, data: data,
    end: str | list[str] = "\n",
    last_end: bool = True,
    suffix: str = "",
) -> Writer:
    """<split>.src / <split>.tgt, each file's bytes passed through `transform`."""

    def write(directory: Path, lines: Lines) -> list[str]:
        overrides = []
        for split, pair in lines.items():
            for side, text in zip(("src", "tgt"), pair, strict=True):
                data = transform(split, side, encode(text, end, last_end))
                name = f"{split}.{side}{suffix}"
                (directory / name).write_bytes(gzip.compress(data) if suffix else data)
                overrides.append(f"data.splits.{split}.{side}={name}")
        return overrides

    return write


def tab_separated(
    end: str = "\n", suffix: str = "", row: Callable[[str, str], str] = lambda s, t: f"{s}\t{t}"
) -> Writer:
    """One <split>.tsv per split: `row(source, target)` per line."""

    def write(directory: Path, lines: Lines) -> list[str]:
        overrides = []
        for split, (sources, targets) in lines.items():
            rows = [row(s, t) for s, t in zip(sources, targets, strict=True)]
            data = codecs.BOM_UTF8 + encode(rows, end)
            name = f"{split}.tsv{suffix}"
            (directory / name).write_bytes(gzip.compress(data) if suffix else data)
            overrides += [
                f"data.splits.{split}.tsv={name}",
                f"data.splits.{split}.src=null",
                f"data.splits.{split}.tgt=null",
            ]
        return overrides

    return write


def on(split: str, side: str, change: Callable[[bytes], bytes]) -> Callable:
    return lambda s, d, data: change(data) if (s, d) == (split, side) else data


def replace_line(number: int, new: bytes) -> Callable[[bytes], bytes]:
    def change(data: bytes) -> bytes:
        lines = data.split(b"\n")
        lines[number - 1] = new
        return b"\n".join(lines)

    return change


SEP = "\u2028"
CASES: dict[str, tuple[Writer, Lines]] = {
    "crlf": (two_files(end="\r\n"), corpus()),
    "cr only": (two_files(end="\r"), corpus()),
    "mixed ends": (two_files(end=["\n", "\r\n", "\r"]), corpus()),
    "cr, no last end": (two_files(end="\r", last_end=False), corpus()),
    "no last end": (two_files(last_end=False), corpus()),
    "utf-8 bom": (two_files(lambda s, d, data: codecs.BOM_UTF8 + data), corpus()),
    "gzip, crlf": (two_files(end="\r\n", suffix=".gz"), corpus()),
    "tabs inside sentences": (
        two_files(lambda s, d, data: data.replace(b" ", b"\t", 3)),
        corpus(),
    ),
    "tsv, bom, crlf": (tab_separated(end="\r\n"), corpus()),
    "tsv gzipped, cr": (tab_separated(end="\r", suffix=".gz"), corpus()),
    "one-line val and test": (
        two_files(),
        {"train": corpus()["train"], "val": (["a dog"], ["DOG A"]), "test": (["x"], ["X"])},
    ),
    "u+2028 is not a line break": (
        two_files(),
        {**corpus(), "val": ([f"a{SEP}dog"], [f"DOG{SEP}A"])},
    ),
    # failures: each names the file, and the line where there is one
    "utf-16": (two_files(on("train", "tgt", lambda d: d.decode().encode("utf-16"))), corpus()),
    "utf-32": (two_files(on("val", "src", lambda d: d.decode().encode("utf-32"))), corpus()),
    "utf-16 without bom": (
        two_files(on("train", "src", lambda d: d.decode().encode("utf-16-le"))),
        corpus(),
    ),
    "latin-1": (two_files(on("train", "src", replace_line(7, "café".encode("latin-1")))), corpus()),
    "nul byte": (two_files(on("test", "tgt", replace_line(3, b"DOG\x00A"))), corpus()),
    "tsv without a tab": (tab_separated(row=lambda s, t: f"{s} {t}"), corpus()),
    "tsv with a tab inside": (tab_separated(row=lambda s, t: f"{s}\t{t}\tx"), corpus()),
    "unequal lengths": (two_files(), {**corpus(), "val": (SOURCES[:5], TARGETS[:4])}),
    "one-line train": (two_files(), {**corpus(), "train": (["a dog"], ["DOG A"])}),
    "empty file": (two_files(), {**corpus(), "test": ([""], [""])}),
    "every pair empty on one side": (
        two_files(),
        {**corpus(), "train": (["a dog", *[""] * 239], ["", *TARGETS[1:240]])},
    ),
    "one line, u+2028 between sentences": (
        two_files(),
        {**corpus(), "train": ([SEP.join(SOURCES[:240])], [SEP.join(TARGETS[:240])])},
    ),
}
FAILS = {  # case -> (file, line or None, words of the message)
    "utf-16": ("train.tgt", None, "is UTF-16 text"),
    "utf-32": ("val.src", None, "iconv -f UTF-32 -t UTF-8"),
    "utf-16 without bom": ("train.src", 1, "a NUL byte at column 2"),
    "latin-1": ("train.src", 7, "not valid UTF-8"),
    "nul byte": ("test.tgt", 3, "a NUL byte at column 4"),
    "tsv without a tab": ("train.tsv", 1, "0 tabs, where a tab-separated bitext has exactly one"),
    "tsv with a tab inside": ("train.tsv", 1, "2 tabs"),
    "unequal lengths": ("val.src", None, "has 5 lines but"),
    "one-line train": ("train.src", None, "too little text for tokenizer.vocab_size=60"),
    "empty file": ("test.src", None, "is empty"),
    "every pair empty on one side": ("train.tgt", None, "none of its 240 pairs has text on both"),
    "one line, u+2028 between sentences": ("train.src", None, "SentencePiece could not train"),
}


def prepared(directory: Path, overrides: list[str]) -> PreparedData:
    settings = toy_overrides(directory, directory / "cache")
    base = [o for o in settings if not o.startswith("data.splits.")]
    return prepare(compose_config([*base, *overrides]))


def arrays(data: PreparedData) -> dict:
    return {
        (name, field): np.asarray(getattr(split, field))
        for name, split in data.splits.items()
        for field in ("src", "tgt", "src_lens", "tgt_lens", "line")
    }


def assert_no_partial_files(cache: Path) -> None:
    assert [p for p in cache.rglob("*") if p.name.endswith((".part", ".old"))] == []


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_corpus_prepares_as_its_clean_twin_or_names_the_file(
    case: str, tmp_path: Path
) -> None:
    write, lines = CASES[case]
    wild, clean = tmp_path / "wild", tmp_path / "clean"
    wild.mkdir()
    clean.mkdir()
    overrides = write(wild, lines)
    if case in FAILS:
        name, line, words = FAILS[case]
        with pytest.raises(DataError) as info:
            prepared(wild, overrides)
        message = str(info.value)
        assert "\n" not in message and words in message
        assert str(wild / name) in message
        if line is not None:
            assert f"{wild / name}, line {line}:" in message
        assert_no_partial_files(wild / "cache")
        return
    expected = prepared(clean, two_files()(clean, lines))
    got = prepared(wild, overrides)
    assert got.tokenizer.fingerprint == expected.tokenizer.fingerprint
    ours, theirs = arrays(got), arrays(expected)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=str(key))
    assert_no_partial_files(wild / "cache")


def test_carriage_return_corpus_through_the_command_gives_the_clean_arrays(
    tmp_path: Path,
) -> None:
    """The issue's case: CR-only files read as one line each and ended in SentencePiece's
    traceback; now `python -m seq2seq.prepare` encodes them as their \\n twin, array for array."""
    caches = {}
    for label, end in (("cr", "\r"), ("lf", "\n")):
        directory = tmp_path / label
        directory.mkdir()
        overrides = two_files(end=end)(directory, corpus())
        settings = toy_overrides(directory, directory / "cache") + overrides
        result = run("prepare", tmp_path, *settings)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        caches[label] = {
            p.relative_to(p.parents[1]).as_posix(): p.read_bytes()
            for p in (directory / "cache").rglob("*.npy")
        }
    assert len(caches["cr"]) == len(caches["lf"]) > 0
    assert sorted(caches["cr"].values()) == sorted(caches["lf"].values())


def test_a_utf16_file_stops_the_command_with_one_line(tmp_path: Path) -> None:
    overrides = two_files(on("train", "src", lambda d: d.decode().encode("utf-16")))(
        tmp_path, corpus()
    )
    settings = toy_overrides(tmp_path, tmp_path / "cache") + overrides
    result = run("prepare", tmp_path, *settings)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {tmp_path / 'train.src'} is UTF-16 text (it starts with a UTF-16 byte-order "
        f"mark); convert it to UTF-8, e.g. iconv -f UTF-16 -t UTF-8 train.src > train.utf8.src"
    ]


def test_filters_that_leave_too_few_pairs_stop_with_the_counts(tmp_path: Path) -> None:
    overrides = two_files()(tmp_path, corpus())
    with pytest.raises(DataError) as info:
        prepared(tmp_path, [*overrides, "data.filter.max_len=1"])
    message = str(info.value)
    assert "split 'train'" in message and str(tmp_path / "train.src") in message
    assert "240 longer than data.filter.max_len=1 subword tokens" in message
    assert "0 of 240 pairs kept, fewer than 1 (data.min_train_pairs)" in message
    with pytest.raises(DataError, match="fewer than 1000 \\(data.min_train_pairs\\)"):
        prepared(tmp_path, [*overrides, "data.min_train_pairs=1000"])
    assert_no_partial_files(tmp_path / "cache")


def test_a_config_from_before_min_train_pairs_and_tsv_still_loads() -> None:
    files = [f"data.splits.{s}.tsv={s}.tsv" for s in SPLITS]
    saved = config_to_dict(compose_config(["data=parallel_files", *files]))
    del saved["data"]["min_train_pairs"]
    for files in saved["data"]["splits"].values():
        del files["tsv"]
    saved["data"]["splits"] = {s: {"src": f"{s}.src", "tgt": f"{s}.tgt"} for s in SPLITS}
    upgraded = validate_config(OmegaConf.create(upgrade_config(saved)))
    assert upgraded.data.min_train_pairs == 1
    assert upgraded.data.splits["train"].tsv is None
    assert upgraded.data.splits["train"].src == "train.src"


@pytest.mark.parametrize("seed", range(20))
def test_lines_are_the_same_however_the_stream_is_cut_into_chunks(seed: int) -> None:
    """Line ends at chunk boundaries (a \\r\\n split in two, a line longer than a chunk, empty
    chunks) give the lines of the whole stream split at once."""
    rng = np.random.default_rng(seed)
    pieces = ["a", "bb", "é", "\u2028", "\t", "\n", "\r", "\r\n", ""]
    text = "".join(rng.choice(pieces, size=int(rng.integers(0, 60))))
    data = text.encode()
    cuts = sorted(rng.integers(0, len(data) + 1, size=int(rng.integers(0, 8))))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    got = [line for block in line_blocks(chunks) for line in split_block(block.decode())]
    expected = LINE_END.split(text)
    if text.endswith(("\n", "\r")) or not text:
        expected.pop()
    assert got == expected
