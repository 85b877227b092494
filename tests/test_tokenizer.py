"""SentencePiece: exact round trip on Multi30k, fixed special ids, reproducible, cached by key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import compose_config, config_of, toy_corpus, toy_overrides, write_lines

from seq2seq.data.config import TokenizerConfig
from seq2seq.data.corpus import normalize, read_lines
from seq2seq.data.datamodule import prepare
from seq2seq.data.tokenizer import UNK_ID, sample_sentences, train_sentencepiece


@pytest.mark.parametrize("lang", ["en", "de"])
def test_round_trip_on_every_multi30k_line(multi30k, shared_data: Path, lang: str) -> None:
    tokenizer = multi30k.tokenizer
    for split in ("train", "val", "test_2016_flickr"):
        lines = [normalize(x) for x in read_lines(shared_data / "multi30k" / f"{split}.{lang}.gz")]
        encode = tokenizer.encode_src if lang == "en" else tokenizer.encode_tgt
        ids = encode(lines)
        decoded = tokenizer.decode_tgt(ids)
        mismatches = [(a, b) for a, b in zip(lines, decoded, strict=True) if a != b]
        assert mismatches == [], f"{split}.{lang}: {mismatches[:3]}"
        assert not any(UNK_ID in seq for seq in ids)


def test_unseen_characters_fall_back_to_bytes(multi30k) -> None:
    text = "Ein Hund 🐕 läuft über die Straße – ẞ"
    ids = multi30k.tokenizer.encode_tgt([text])
    assert UNK_ID not in ids[0]
    assert multi30k.tokenizer.decode_tgt(ids) == [text]


def test_special_ids_and_vocabulary(multi30k) -> None:
    tok = multi30k.tokenizer
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    pieces = [tok.src.id_to_piece(i) for i in range(4)]
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.joint and tok.src_vocab_size == tok.tgt_vocab_size == 8000


def test_training_is_reproducible() -> None:
    src, tgt = toy_corpus()
    cfg = config_of("tokenizer/sentencepiece", TokenizerConfig, vocab_size=60, byte_fallback=False)
    first = train_sentencepiece(src + tgt, cfg)
    assert train_sentencepiece(src + tgt, cfg) == first
    assert (
        train_sentencepiece(
            src + tgt,
            config_of(
                "tokenizer/sentencepiece", TokenizerConfig, vocab_size=61, byte_fallback=False
            ),
        )
        != first
    )


def test_separate_vocabularies(toy_files: Path, tmp_path: Path) -> None:
    config = compose_config(
        [*toy_overrides(toy_files, tmp_path / "cache"), "tokenizer.joint=false"]
    )
    tok = prepare(config).tokenizer
    assert not tok.joint
    assert tok.src.piece_to_id("▁DOG") == UNK_ID  # target words are not in the source model
    assert tok.tgt.piece_to_id("▁DOG") != UNK_ID


def test_cache_reuse_and_invalidation(toy_files: Path, tmp_path: Path) -> None:
    base = toy_overrides(toy_files, tmp_path / "cache")
    first = prepare(compose_config(base))
    assert first.built == ["tokenizer", "train", "val", "test"]

    again = prepare(compose_config(base))
    assert again.built == []
    assert again.tokenizer.fingerprint == first.tokenizer.fingerprint
    for name, split in first.splits.items():
        np.testing.assert_array_equal(again.splits[name].src, split.src)
        np.testing.assert_array_equal(again.splits[name].tgt_offsets, split.tgt_offsets)

    changed_setting = prepare(compose_config([*base, "tokenizer.vocab_size=55"]))
    assert changed_setting.built == ["tokenizer", "train", "val", "test"]
    assert changed_setting.tokenizer.fingerprint != first.tokenizer.fingerprint

    changed_filter = prepare(compose_config([*base, "data.filter.max_len=5"]))
    assert changed_filter.built == ["train"]  # evaluation sets are not filtered
    assert changed_filter.splits["train"].counts.too_long > 0

    src, tgt = toy_corpus()
    write_lines(toy_files / "test.tgt", [t + " EXTRA" for t in tgt[270:300]])
    assert prepare(compose_config(base)).built == ["test"]

    write_lines(toy_files / "train.src", [s + " the" for s in src[:240]])
    assert prepare(compose_config(base)).built == ["tokenizer", "train", "val", "test"]


def test_sample_sentences_is_the_seeded_bottom_k_in_corpus_order() -> None:
    lines = [f"line {i}" for i in range(150_000)]  # more than two chunks of 65,536
    sample = sample_sentences(iter(lines), 1000, seed=7)
    # reference: the 1,000 positions with the smallest keys, keys drawn in one go from the seed
    keys = np.random.default_rng(7).random(len(lines))
    expected = np.sort(np.argsort(keys)[:1000])
    assert sample == [lines[i] for i in expected]
    assert sample == sample_sentences(lines, 1000, seed=7)
    assert sample != sample_sentences(lines, 1000, seed=8)


@pytest.mark.parametrize("size", [0, 300, 301])
def test_a_corpus_no_larger_than_the_sample_is_used_whole(size: int) -> None:
    lines = [f"line {i}" for i in range(300)]
    assert sample_sentences(iter(lines), size, seed=1) == lines


def test_input_sentence_size_trains_on_the_sample(toy_files: Path, tmp_path: Path) -> None:
    base = toy_overrides(toy_files, tmp_path / "cache")
    whole = prepare(compose_config(base)).tokenizer
    sampled = prepare(compose_config([*base, "tokenizer.input_sentence_size=200"]))
    src, tgt = toy_corpus()
    joint = [*src[:240], *tgt[:240]]  # the training split, source then target
    cfg = compose_config([*base, "tokenizer.input_sentence_size=200"]).tokenizer
    expected = train_sentencepiece(sample_sentences(joint, 200, cfg.seed), cfg)
    assert sampled.tokenizer.src_model == sampled.tokenizer.tgt_model == expected
    assert sampled.tokenizer.fingerprint != whole.fingerprint
    assert sampled.built == ["tokenizer", "train", "val", "test"]
