"""Encoded splits: exact ids and filter counts on a fixture; counts are logged per split."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_config, config_of, toy_corpus, toy_overrides, write_lines

from seq2seq.config import FilterConfig, TokenizerConfig
from seq2seq.data.datamodule import prepare
from seq2seq.data.dataset import EncodedSplit
from seq2seq.data.tokenizer import Tokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    src, tgt = toy_corpus()
    model = train_sentencepiece(
        src + tgt,
        config_of("tokenizer/sentencepiece", TokenizerConfig, vocab_size=60, byte_fallback=False),
    )
    return Tokenizer(model, model)


def test_filters_count_each_reason(tokenizer: Tokenizer) -> None:
    long = " ".join(["dog"] * 20)
    src = ["the dog", "", "a cat", long, "dog", "the big red ball", "child"]
    tgt = ["DOG THE", "CAT A", "", "DOG", long, "BALL RED BIG THE", "CHILD"]
    limits = FilterConfig(max_len=20, max_ratio=3.0, ratio_min_len=4)  # toy pieces ~ chars
    split = EncodedSplit.encode(src, tgt, tokenizer, limits)
    c = split.counts
    assert (c.total, c.empty, c.too_long, c.bad_ratio, c.kept) == (7, 2, 2, 0, 3)
    assert split.line.tolist() == [0, 5, 6]

    ratio = FilterConfig(max_len=100, max_ratio=3.0, ratio_min_len=4)
    split = EncodedSplit.encode(["dog", "dog dog"], [long, "DOG DOG"], tokenizer, ratio)
    assert (split.counts.bad_ratio, split.line.tolist()) == (1, [1])


def test_ids_match_the_tokenizer_and_round_trip_to_disk(tokenizer: Tokenizer, tmp_path) -> None:
    src, tgt = toy_corpus(20)
    split = EncodedSplit.encode(src, tgt, tokenizer, None)
    assert split.counts.kept == 20 and split.line.tolist() == list(range(20))
    for i in (0, 7, 19):
        _, s, t = split[i]
        assert s.tolist() == tokenizer.encode_src([src[i]])[0]
        assert t.tolist() == tokenizer.encode_tgt([tgt[i]])[0]
    split.save(tmp_path / "x.npz")
    loaded = EncodedSplit.load(tmp_path / "x.npz")
    assert loaded.counts == split.counts
    for name in ("src", "src_offsets", "tgt", "tgt_offsets", "line"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(split, name))
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "x.npz").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_evaluation_sets_are_never_filtered(toy_files: Path, tmp_path: Path, caplog) -> None:
    src, tgt = toy_corpus()
    write_lines(toy_files / "test.src", ["", *src[271:300]])  # an empty source line stays
    config = compose_config(toy_overrides(toy_files, tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="seq2seq.data.datamodule"):
        prepared = prepare(config)
    assert prepared.splits["test"].counts.kept == 30
    assert prepared.splits["test"].src_lens[0] == 0
    logged = [r.getMessage() for r in caplog.records]
    for name in ("train", "val", "test"):
        assert any(m.startswith(f"{name}: ") and "pairs kept of" in m for m in logged), logged
