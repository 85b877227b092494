"""Encoded splits: exact ids and filter counts on a fixture, the same arrays from a pool of
processes, memory-mapped caches, and Multi30k's arrays and tokenizer unchanged byte for byte."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_config, config_of, toy_corpus, toy_overrides, write_lines

from seq2seq.data import dataset
from seq2seq.data.config import FilterConfig, TokenizerConfig
from seq2seq.data.corpus import normalize
from seq2seq.data.datamodule import prepare
from seq2seq.data.dataset import EncodedSplit
from seq2seq.data.tokenizer import Tokenizer, train_sentencepiece

ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets", "line")

# sha256 of Multi30k en-de's default tokenizer model and encoded arrays, recorded on
# 2026-11-24 from the cache written before the streaming encoder (the earlier pipeline's .npz
# caches); the streaming, memory-mapped pipeline must reproduce them exactly.
MULTI30K_TOKENIZER = "c3dc45015b2940210fae8667cf4aa86c0039e4901d597562f84f0a365da487e2"
MULTI30K_ARRAYS = {
    "train": {
        "src": "78d75a1bb8ab342b97809a175550bb03e2b61ffea8b1b1e49cf87de1299dcd13",
        "src_offsets": "12c57eb0a946eb96f283311d5277d532c0e8e8d085bee3a7894fe63c2f1f17d2",
        "tgt": "c27c1ac8df3972046047ef48ee9a87542230370391c2c43026af04311534eae2",
        "tgt_offsets": "250b45d329a2953d324133826250e3d98bea9a00432e8bb823c57b7654372197",
        "line": "9108611c9aad3400a61e20585f67baef7187f6768226d71e73906dd1d53579ab",
    },
    "val": {
        "src": "a231be424141b62b4ec715d80ac34c6723768c9ecb07fe21422993dd119c85e5",
        "src_offsets": "cd717887d8451ca438f2cac8f5442ec7e3331eaca78b7818a2718afd4e9c721e",
        "tgt": "6a026c8cd1f3d9408cb4e7b1eb8a25e3914fdd1d5fc08ffc6f3528510efb81c4",
        "tgt_offsets": "654197cbc884e13e2e71265a06207dc8f1ec89121ba05e46976eae16ac5bb2b4",
        "line": "54aa0c00722e3bab80f00bf9c7209a7f962fcb4d07a632c52238ebdc14b00b76",
    },
}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    src, tgt = toy_corpus()
    model = train_sentencepiece(
        src + tgt,
        config_of("tokenizer/sentencepiece", TokenizerConfig, vocab_size=60, byte_fallback=False),
    )
    return Tokenizer(model, model)


def encode(src, tgt, tokenizer, limits, directory: Path, processes: int = 1) -> EncodedSplit:
    return EncodedSplit.encode(zip(src, tgt, strict=True), tokenizer, limits, directory, processes)


def test_filters_count_each_reason(tokenizer: Tokenizer, tmp_path: Path) -> None:
    long = " ".join(["dog"] * 20)
    src = ["the dog", "", "a cat", long, "dog", "the big red ball", "child"]
    tgt = ["DOG THE", "CAT A", "", "DOG", long, "BALL RED BIG THE", "CHILD"]
    limits = FilterConfig(max_len=20, max_ratio=3.0, ratio_min_len=4)  # toy pieces ~ chars
    split = encode(src, tgt, tokenizer, limits, tmp_path / "a")
    c = split.counts
    assert (c.total, c.empty, c.too_long, c.bad_ratio, c.kept) == (7, 2, 2, 0, 3)
    assert split.line.tolist() == [0, 5, 6]

    ratio = FilterConfig(max_len=100, max_ratio=3.0, ratio_min_len=4)
    split = encode(["dog", "dog dog"], [long, "DOG DOG"], tokenizer, ratio, tmp_path / "b")
    assert (split.counts.bad_ratio, split.line.tolist()) == (1, [1])


def test_ids_match_the_tokenizer_and_the_cache_is_memory_mapped(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    src, tgt = toy_corpus(20)
    src[3] = "  the   dog\u00a0"  # normalised before encoding
    split = encode(src, tgt, tokenizer, None, tmp_path / "x")
    assert split.counts.kept == 20 and split.line.tolist() == list(range(20))
    for i in (0, 3, 7, 19):
        _, s, t = split[i]
        assert s.tolist() == tokenizer.encode_src([normalize(src[i])])[0]
        assert t.tolist() == tokenizer.encode_tgt([tgt[i]])[0]
    loaded = EncodedSplit.load(tmp_path / "x")
    assert loaded.counts == split.counts
    for name in ARRAYS:
        array = getattr(loaded, name)
        assert isinstance(array, np.memmap) and not array.flags.writeable
        np.testing.assert_array_equal(array, np.load(tmp_path / "x" / f"{name}.npy"))
    assert [p.name for p in tmp_path.iterdir()] == ["x"]  # no temp directory left
    umask = os.umask(0)
    os.umask(umask)
    for path in (tmp_path / "x").iterdir():  # not mkstemp's 0600
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path


def test_a_pool_of_processes_gives_the_arrays_of_one(
    tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, tgt = toy_corpus()
    src[10], tgt[20], src[30] = "", "", " ".join(["dog"] * 200)  # filtered in several chunks
    limits = FilterConfig(max_len=150, max_ratio=100.0, ratio_min_len=4)
    monkeypatch.setattr(dataset, "CHUNK_PAIRS", 7)  # 43 chunks, so the pool is used
    pooled = encode(src, tgt, tokenizer, limits, tmp_path / "pool", processes=2)
    single = encode(src, tgt, tokenizer, limits, tmp_path / "one", processes=1)
    monkeypatch.setattr(dataset, "CHUNK_PAIRS", 1 << 16)
    whole = encode(src, tgt, tokenizer, limits, tmp_path / "whole", processes=2)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(pooled, name), getattr(single, name))
        np.testing.assert_array_equal(getattr(pooled, name), getattr(whole, name))
    assert pooled.counts == single.counts == whole.counts
    assert (pooled.counts.empty, pooled.counts.too_long) == (2, 1)
    # against encoding each kept pair alone
    kept = [i for i in range(len(src)) if i not in (10, 20, 30)]
    assert pooled.line.tolist() == kept
    for row, i in enumerate(kept):
        _, s, t = pooled[row]
        assert s.tolist() == tokenizer.encode_src([src[i]])[0]
        assert t.tolist() == tokenizer.encode_tgt([tgt[i]])[0]


def test_multi30k_tokenizer_and_arrays_are_unchanged(multi30k) -> None:
    assert hashlib.sha256(multi30k.tokenizer.src_model).hexdigest() == MULTI30K_TOKENIZER
    assert multi30k.tokenizer.joint
    for name, expected in MULTI30K_ARRAYS.items():
        split = multi30k.splits[name]
        digests = {
            array: hashlib.sha256(np.ascontiguousarray(getattr(split, array)).tobytes()).hexdigest()
            for array in ARRAYS
        }
        assert digests == expected, name


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
