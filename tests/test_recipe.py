"""The corpus-derived recipe (derive_from_corpus): raw counts, the rule, and how its settings
reach the run's config."""

from __future__ import annotations

import gzip
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    compose_config,
    few_pairs_overrides,
    multilingual_overrides,
    write_aligned,
    write_lines,
)
from omegaconf import OmegaConf

from seq2seq.config import config_to_dict
from seq2seq.data.corpus import SplitPaths
from seq2seq.data.corpus_counts import SideCounts, count_split, load_or_count
from seq2seq.data.datamodule import prepare
from seq2seq.errors import ConfigError
from seq2seq.io import sha256_file
from seq2seq.training.corpus_rules import (
    GREEDY_COST,
    MODEL_SIZES,
    VALIDATION_SHARE,
    SubwordLengths,
    from_counts,
    from_lengths,
    graded,
)
from seq2seq.training.recipe import derive, measure_lengths, pooled
from seq2seq.upgrade import load_config


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


def test_rule_1_gives_multi30k_sized_text_the_settings_chosen_for_multi30k() -> None:
    derived = values(from_counts(667_403, val_pairs=1014, rule=1))
    assert derived["tokenizer.vocab_size"] == 8000  # multi30k_cpu_1h_tuned's
    wu2021 = compose_config(["model=transformer_wu2021"]).model
    for key in ("d_model", "heads", "encoder_layers", "decoder_layers", "ffn_dim", "dropout"):
        assert derived[f"model.{key}"] == getattr(wu2021, key), key
    assert derived["data.val_subset"] == 0  # 1,014 pairs: all of them


def test_rule_1_gives_less_text_a_smaller_vocabulary_and_model_and_more_regularisation() -> None:
    sizes = [100_000, 1_000_000, 10_000_000]
    derived = [values(from_counts(w, val_pairs=5000, rule=1)) for w in sizes]
    vocab = [d["tokenizer.vocab_size"] for d in derived]
    assert vocab == sorted(vocab) and len(set(vocab)) == 3
    widths = [d["model.d_model"] * d["model.encoder_layers"] for d in derived]
    assert widths[0] < widths[1] < widths[2]
    assert derived[0]["model.token_replacement"] > 0 == derived[1]["model.token_replacement"]
    assert derived[0]["model.dropout"] >= derived[1]["model.dropout"] > derived[2]["model.dropout"]
    assert all(d["data.val_subset"] == 1000 for d in derived)
    assert MODEL_SIZES[-1][0] == float("inf")  # every corpus falls in a band


def test_rule_1_keeps_the_vocabulary_within_its_bounds() -> None:
    assert values(from_counts(2_000, val_pairs=10, rule=1))["tokenizer.vocab_size"] == 1000
    assert values(from_counts(10**9, val_pairs=10, rule=1))["tokenizer.vocab_size"] == 32000


def test_rule_2_grades_word_dropout_with_the_text_and_has_no_cliff() -> None:
    sizes = [50_000, 100_000, 200_000, 299_999, 300_000, 500_000, 999_999, 1_000_000, 10**8]
    derived = [values(from_counts(w, val_pairs=5000, rule=2)) for w in sizes]
    word = [d["model.token_replacement"] for d in derived]
    assert word[:2] == [0.1, 0.1] and word[-2:] == [0.0, 0.0]
    assert word == sorted(word, reverse=True)
    steps = [a - b for a, b in zip(word, word[1:], strict=False)]
    assert max(steps) < 0.04  # no step like rule 1's 0.1 -> 0
    assert word[2] == pytest.approx(0.1 * (1 - math.log(2) / math.log(10)), abs=1e-3)
    layers = [d["model.encoder_layers"] for d in derived]
    assert layers == [3, 3, 3, 3, 4, 4, 4, 4, 4]  # no 6+6 tier that was never measured
    assert {d["model.d_model"] for d in derived} == {128}
    assert [d["tokenizer.vocab_size"] for d in derived[:3]] == [1000, 1000, 2500]  # as rule 1
    assert "past the 850,000 the rule was checked on" in from_counts(10**8, 10, 2)[1].reason
    assert "past" not in from_counts(846_000, 10, 2)[1].reason


def test_graded_is_linear_in_log_words_between_its_points() -> None:
    points = ((100, 1.0), (10_000, 0.0))
    assert [graded(w, points) for w in (10, 100, 1000, 10_000, 10**6)] == [1, 1, 0.5, 0, 0]


def test_length_limits_batch_and_warmup_follow_the_subword_lengths() -> None:
    longer = np.full(1000, 20)
    longer[-1] = 200  # one outlier: above the 99.9th percentile
    lengths = SubwordLengths(
        longer_side=longer,
        ratio=np.full(1000, 1.2),
        tokens_per_epoch=22.0 * 50_000,
        val_longest=400,
        val_tokens=22.0 * 1000,
    )
    derived = values(from_lengths(lengths, max_ratio=3.0, rule=1))
    assert derived["data.filter.max_len"] == 128  # 1.5 x 20.2 = 30: the floor, not the outlier
    assert derived["model.max_len"] == 448  # the validation line: 400 + 2, to 64s
    assert derived["decoding.max_len_a"] == 1.5  # at least today's default
    assert derived["data.max_tokens"] == 8192  # 1.1M tokens / 128 = 8,594: nearest power of 2
    assert derived["optim.warmup_steps"] == 2000  # 16 x 134 updates, capped
    short = SubwordLengths(np.full(100, 10), np.full(100, 2.04), 12.0 * 5000, 20, 12.0 * 1000)
    small = values(from_lengths(short, max_ratio=3.0, rule=1))
    assert small["data.max_tokens"] == 2048
    assert small["optim.warmup_steps"] == 500  # 16 x 29 updates = 469, at least 500
    assert small["decoding.max_len_a"] == 2.1
    assert small["model.max_len"] == 256
    assert values(from_lengths(short, max_ratio=2.0, rule=1))["decoding.max_len_a"] == 2.0
    long = SubwordLengths(np.full(100, 200), np.full(100, 1.0), 202.0 * 5000, 100, 202.0 * 100)
    assert values(from_lengths(long, 3.0, rule=1))["data.filter.max_len"] == 320  # 300, to 32s
    assert values(from_lengths(long, 3.0, rule=1))["model.max_len"] == 384  # 322, to 64s
    rule_2 = values(from_lengths(lengths, max_ratio=3.0, rule=2))
    assert rule_2["data.max_tokens"] == 4096  # rule 1's 8,192 halved: twice the updates
    assert rule_2["optim.warmup_ratio"] == 0.25 and "optim.warmup_steps" not in rule_2
    assert values(from_lengths(short, 3.0, rule=2))["data.max_tokens"] == 2048
    unbudgeted = values(from_lengths(short, 3.0, rule=2, budget=False))  # epochs, as rule 1
    assert unbudgeted["optim.warmup_steps"] == 500 and "optim.warmup_ratio" not in unbudgeted
    assert "trainer.check_val_every_n_epoch" in unbudgeted
    assert "trainer.check_val_every_n_epoch" not in values(from_lengths(short, 3.0, rule=1))


@pytest.mark.parametrize("pairs", [2_000, 5_000, 10_000, 29_000, 200_000])
def test_rule_2_validates_as_often_as_its_share_of_the_clock_allows(pairs: int) -> None:
    lengths = SubwordLengths(np.full(100, 14), np.full(100, 1.1), 16.0 * pairs, 40, 16.0 * 1014)
    every = values(from_lengths(lengths, 3.0, rule=2))["trainer.check_val_every_n_epoch"]

    def share(n: int) -> float:  # of the clock, one validation per n epochs
        validation = GREEDY_COST * lengths.val_tokens
        return validation / (n * lengths.tokens_per_epoch + validation)

    assert share(every) <= VALIDATION_SHARE + 1e-9
    assert every == 1 or share(every - 1) > VALIDATION_SHARE  # no less often than it must


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


def test_an_unknown_rule_is_refused_and_old_configs_keep_rule_1(
    corpus: Path, tmp_path: Path
) -> None:
    config = compose_config(
        [
            *few_pairs_overrides(corpus, tmp_path / "cache"),
            "derive_from_corpus=true",
            "derive_rule=3",
        ]
    )
    with pytest.raises(ConfigError, match="derive_rule.*3 is no rule; use one of 1, 2"):
        derive(config, fixed=set())
    today = ["derive_from_corpus=true", "derive_rule=2", "optim.warmup_ratio=0.25"]
    saved = config_to_dict(compose_config([*today, "trainer.max_steps=10"]))
    del saved["derive_rule"], saved["optim"]["warmup_ratio"]
    old = load_config(saved)  # a run derived before rule 2 existed was derived by rule 1
    assert old.derive_rule == 1 and old.optim.warmup_ratio == 0.0


def test_rule_2_derives_a_budgeted_warmup_and_rule_1_an_epoch_one(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    overrides = [*few_pairs_overrides(corpus, tmp_path / "cache"), "derive_from_corpus=true"]
    config = compose_config([*overrides, "trainer.max_steps=100"])  # rule 2: the default
    with caplog.at_level(logging.INFO, logger="seq2seq.training.recipe"):
        derived = derive(config, fixed=set())
    assert derived.optim.warmup_ratio == 0.25 and derived.data.max_tokens == 2048
    assert "derive_from_corpus (rule 2)" in caplog.text
    assert "optim.warmup_ratio=0.25: the warm-up's share of the clock" in caplog.text
    # validation decodes the training split itself here: a pass costs GREEDY_COST epochs
    share = (1 - VALIDATION_SHARE) / VALIDATION_SHARE
    assert derived.trainer["check_val_every_n_epoch"] == math.ceil(share * GREEDY_COST) == 15
    sampled = compose_config(
        [*overrides, "trainer.max_steps=100", "derive_rule=2", "data.val_subset=100"]
    )
    sampled = derive(sampled, fixed={"data.val_subset"})  # a quarter of the pairs validated
    assert sampled.trainer["check_val_every_n_epoch"] == math.ceil(share * GREEDY_COST / 4) == 4
    unbudgeted = derive(compose_config([*overrides, "derive_rule=2"]), set())  # max_epochs only
    assert unbudgeted.optim.warmup_ratio == 0 and unbudgeted.optim.warmup_steps == 500
    rule_1 = derive(compose_config([*overrides, "trainer.max_steps=100", "derive_rule=1"]), set())
    assert rule_1.optim.warmup_ratio == 0 and rule_1.optim.warmup_steps == 500
    assert rule_1.trainer["check_val_every_n_epoch"] == 1  # every epoch, as configured


def test_pooled_lengths_are_one_split_of_all_directions() -> None:
    def lengths(longer: list[int], epoch: float, val_longest: int, val_tokens: float):
        ratio = np.ones(len(longer))
        return SubwordLengths(np.array(longer), ratio, epoch, val_longest, val_tokens)

    both = pooled([lengths([3, 9], 1000.0, 12, 50.0), lengths([5], 400.0, 20, 30.0)])
    assert sorted(both.longer_side.tolist()) == [3, 5, 9] and len(both.ratio) == 3
    assert (both.tokens_per_epoch, both.val_longest, both.val_tokens) == (1400.0, 20, 80.0)


def test_a_tagged_source_is_one_position_longer(tmp_path: Path) -> None:
    data = write_aligned(tmp_path / "aligned")
    config = compose_config(multilingual_overrides(data, tmp_path / "cache"))
    tokenizer = prepare(config).tokenizer
    en = (data / "train.en").read_text().splitlines()
    xx = (data / "train.xx").read_text().splitlines()
    pairs = list(zip(en, xx, strict=True))
    plain = measure_lengths(tokenizer, pairs, len(pairs), pairs[:10], 10)
    tagged = measure_lengths(tokenizer, pairs, len(pairs), pairs[:10], 10, tagged=True)
    src = np.array([len(x) for x in tokenizer.encode_src(en)])
    tgt = np.array([len(x) for x in tokenizer.encode_tgt(xx)])
    assert tagged.longer_side.tolist() == np.maximum(src + 1, tgt).tolist()
    assert plain.longer_side.tolist() == np.maximum(src, tgt).tolist()
    assert tagged.ratio.tolist() == plain.ratio.tolist()  # of the text: the tag is no word
    assert tagged.val_longest == max(np.maximum(src[:10] + 1, tgt[:10]))


def test_a_multilingual_run_derives_from_all_its_directions_together(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = write_aligned(tmp_path / "aligned")
    overrides = [
        *multilingual_overrides(data, tmp_path / "cache"),
        "derive_from_corpus=true",
        "trainer.max_steps=100",
    ]
    with caplog.at_level(logging.INFO, logger="seq2seq.training.recipe"):
        derived = derive(compose_config(overrides), fixed=set())
    words = {
        lang: count_split(SplitPaths("train", data / "train.en", data / f"train.{lang}")).words
        for lang in ("xx", "yy")
    }
    total = words["xx"] + words["yy"]
    assert f"training splits of 2 directions, {total:,} words in all; en-xx: " in caplog.text
    # the rule was given the sum: each count-derived setting's reason names it
    expected = values(from_counts(total, 30, 2))
    assert f"model.token_replacement={expected['model.token_replacement']}: {total:,} words" in (
        caplog.text
    )
    assert derived.model.token_replacement == expected["model.token_replacement"]
    # the vocabulary is the joint one, tags included, that the run itself then loads
    assert "the most pieces SentencePiece can make" in caplog.text
    prepared = prepare(derived)
    assert "tokenizer" not in prepared.built  # derive trained the run's own tokenizer
    assert prepared.tokenizer.src_vocab_size == derived.tokenizer.vocab_size
    assert derived.optim.warmup_ratio == 0.25 and derived.data.multilingual
