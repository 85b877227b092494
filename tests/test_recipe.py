"""The corpus-derived recipe (derive_from_corpus): raw counts, the rule, and how its settings
reach the run's config."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_config, few_pairs_overrides, write_lines
from omegaconf import OmegaConf

from seq2seq.config import config_to_dict
from seq2seq.data.corpus import SplitPaths
from seq2seq.data.corpus_counts import CorpusCounts, SideCounts, count_split, load_or_count
from seq2seq.io import sha256_file
from seq2seq.training.recipe import (
    MODEL_SIZES,
    SubwordLengths,
    derive,
    from_counts,
    from_lengths,
)


def counts_of(words: int, pairs: int = 10_000) -> CorpusCounts:
    side = SideCounts(words // 2, 5 * words // 2, 1000, 30)
    return CorpusCounts(pairs, side, side)


def values(settings) -> dict:
    return {s.key: s.value for s in settings}


def test_counts_of_a_split_are_of_its_normalised_words(tmp_path: Path) -> None:
    src = write_lines(tmp_path / "a.src", ["a  b c", "", "b\u00a0c"])  # NBSP: NFKC -> space
    with gzip.open(tmp_path / "a.tgt.gz", "wt", encoding="utf-8") as f:
        f.write("x y\nz\nx x x x\n")
    counts = count_split(SplitPaths("train", src, tmp_path / "a.tgt.gz"))
    assert counts.pairs == 3
    assert counts.src == SideCounts(words=5, characters=5 + 0 + 3, types=3, longest_words=3)
    assert counts.tgt == SideCounts(words=7, characters=3 + 1 + 7, types=3, longest_words=4)
    assert counts.words == 12


def test_counts_are_cached_by_content(tmp_path: Path) -> None:
    src = write_lines(tmp_path / "s", ["a b", "c"])
    tgt = write_lines(tmp_path / "t", ["x", "y z"])
    split = SplitPaths("train", src, tgt)
    digests = {p: sha256_file(p) for p in split.files}
    first = load_or_count(tmp_path / "cache", split, digests)
    assert len(list((tmp_path / "cache" / "counts").glob("*.json"))) == 1
    write_lines(src, ["a b c d", "c"])  # the same digests given: the cached counts come back
    assert load_or_count(tmp_path / "cache", split, digests) == first
    changed = {p: sha256_file(p) for p in split.files}
    assert load_or_count(tmp_path / "cache", split, changed).src.words == 5


def test_multi30k_sized_text_gets_the_settings_chosen_for_multi30k() -> None:
    derived = values(from_counts(counts_of(667_403, 29_000), val_pairs=1014))
    assert derived["tokenizer.vocab_size"] == 8000  # multi30k_cpu_1h_tuned's
    wu2021 = compose_config(["model=transformer_wu2021"]).model
    for key in ("d_model", "heads", "encoder_layers", "decoder_layers", "ffn_dim", "dropout"):
        assert derived[f"model.{key}"] == getattr(wu2021, key), key
    assert derived["data.val_subset"] == 0  # 1,014 pairs: all of them


def test_less_text_gets_a_smaller_vocabulary_and_model_and_more_regularisation() -> None:
    sizes = [100_000, 1_000_000, 10_000_000]
    derived = [values(from_counts(counts_of(w), val_pairs=5000)) for w in sizes]
    vocab = [d["tokenizer.vocab_size"] for d in derived]
    assert vocab == sorted(vocab) and len(set(vocab)) == 3
    widths = [d["model.d_model"] * d["model.encoder_layers"] for d in derived]
    assert widths[0] < widths[1] < widths[2]
    assert derived[0]["model.token_replacement"] > 0 == derived[1]["model.token_replacement"]
    assert derived[0]["model.dropout"] >= derived[1]["model.dropout"] > derived[2]["model.dropout"]
    assert all(d["data.val_subset"] == 1000 for d in derived)
    assert MODEL_SIZES[-1][0] == float("inf")  # every corpus falls in a band


def test_the_vocabulary_stays_within_its_bounds() -> None:
    assert values(from_counts(counts_of(2_000), val_pairs=10))["tokenizer.vocab_size"] == 1000
    assert values(from_counts(counts_of(10**9), val_pairs=10))["tokenizer.vocab_size"] == 32000


def test_length_limits_batch_and_warmup_follow_the_subword_lengths() -> None:
    longer = np.full(1000, 20)
    longer[-1] = 200  # one outlier: above the 99.9th percentile
    lengths = SubwordLengths(
        longer_side=longer,
        ratio=np.full(1000, 1.2),
        tokens_per_epoch=22.0 * 50_000,
        val_longest=400,
    )
    derived = values(from_lengths(lengths, max_ratio=3.0))
    assert derived["data.filter.max_len"] == 128  # 1.5 x 20.2 = 30: the floor, not the outlier
    assert derived["model.max_len"] == 448  # the validation line: 400 + 2, to 64s
    assert derived["decoding.max_len_a"] == 1.5  # at least today's default
    assert derived["data.max_tokens"] == 8192  # 1.1M tokens / 128 = 8,594: nearest power of 2
    assert derived["optim.warmup_steps"] == 2000  # 16 x 134 updates, capped
    short = SubwordLengths(np.full(100, 10), np.full(100, 2.04), 12.0 * 5000, 20)
    small = values(from_lengths(short, max_ratio=3.0))
    assert small["data.max_tokens"] == 2048
    assert small["optim.warmup_steps"] == 500  # 16 x 29 updates = 469, at least 500
    assert small["decoding.max_len_a"] == 2.1
    assert small["model.max_len"] == 256
    assert values(from_lengths(short, max_ratio=2.0))["decoding.max_len_a"] == 2.0
    long = SubwordLengths(np.full(100, 200), np.full(100, 1.0), 202.0 * 5000, 100)
    assert values(from_lengths(long, max_ratio=3.0))["data.filter.max_len"] == 320  # 300, to 32s
    assert values(from_lengths(long, max_ratio=3.0))["model.max_len"] == 384  # 322, to 64s


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    sentences = [" ".join(f"w{(i * 7 + j) % 53}" for j in range(3 + i % 9)) for i in range(400)]
    write_lines(data / "pairs.src", sentences)
    write_lines(data / "pairs.tgt", [s.upper() for s in sentences])
    return data


def test_derive_sets_the_config_and_keeps_command_line_keys(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    overrides = [*few_pairs_overrides(corpus, tmp_path / "cache"), "tokenizer.byte_fallback=true"]
    config = compose_config([*overrides, "derive_from_corpus=true"])
    with caplog.at_level(logging.INFO, logger="seq2seq.training.recipe"):
        derived = derive(config, fixed={"model.dropout"})
    # 5,600 words: the rule's smallest vocabulary, 1,000, is more than SentencePiece can make
    assert derived.tokenizer.vocab_size == 318
    assert derived.model.dropout == config.model.dropout == 0  # fixed: as configured
    assert (derived.model.d_model, derived.model.encoder_layers) == (128, 3)
    assert derived.model.token_replacement == 0.1
    assert derived.data.max_tokens == 2048 and derived.optim.warmup_steps == 500
    assert derived.derive_from_corpus
    assert "model.dropout=0.0 (command line)" in caplog.text
    assert "tokenizer.vocab_size=318: the most pieces SentencePiece can make" in caplog.text
    again = derive(
        config, fixed={"model.dropout", "data.val_subset"}
    )  # another process, a resume: the same
    assert config_to_dict(again) == config_to_dict(derived)
    saved = OmegaConf.create(config_to_dict(derived))  # what config.yaml and checkpoints hold
    assert saved.tokenizer.vocab_size == 318 and saved.derive_from_corpus


def test_without_derive_from_corpus_the_config_is_untouched(corpus: Path, tmp_path: Path) -> None:
    config = compose_config(few_pairs_overrides(corpus, tmp_path / "cache"))
    assert not config.derive_from_corpus
    assert derive(config, fixed=set()) is config
    assert not (tmp_path / "cache").exists()  # nothing read or trained
