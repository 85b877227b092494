"""Sampling: draws follow the model's distribution (at a temperature, truncated by top-k and
top-p), each sentence's draws depend on its seed alone, scores are the model's own."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
import torch
from helpers import (
    A,
    B,
    C,
    TableModel,
    config_of,
    padded_sources,
    teacher_forced_score,
    tiny_transformer,
    toy_corpus,
    toy_tokenizer,
    trained_toy_model,
)

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from seq2seq.decoding.backend import source_batch
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.sampling import draw, sample_search, truncate
from seq2seq.decoding.search import greedy_search, max_output_len
from seq2seq.decoding.translator import Translator
from seq2seq.errors import ConfigError
from seq2seq.evaluate import decoding_tag
from seq2seq.model.transformer import Transformer

DRAWS = 4000
# the first token's distribution: A 0.5, B 0.3, C 0.2; then EOS at once
TABLE = {BOS_ID: {A: 0.5, B: 0.3, C: 0.2}, A: {"eos": 1.0}, B: {"eos": 1.0}, C: {"eos": 1.0}}


def first_tokens(**sampling) -> Counter:
    """How often each first token was drawn in DRAWS samples of one sentence (seed 7)."""
    model = TableModel(next_tokens=TABLE)
    src, max_len = torch.full((1, 2), EOS_ID), torch.tensor([3])
    [samples] = sample_search(model, src, max_len, [(7, 1)], samples=DRAWS, **sampling)
    return Counter(h.tokens[0] for h in samples)


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        ({}, {A: 0.5, B: 0.3, C: 0.2}),
        # temperature 0.5: p^2 renormalised (0.25, 0.09, 0.04 of 0.38)
        ({"temperature": 0.5}, {A: 0.25 / 0.38, B: 0.09 / 0.38, C: 0.04 / 0.38}),
        ({"top_k": 2}, {A: 0.5 / 0.8, B: 0.3 / 0.8, C: 0.0}),
        ({"top_p": 0.75}, {A: 0.5 / 0.8, B: 0.3 / 0.8, C: 0.0}),  # A + B reach 0.75
        ({"top_p": 0.5}, {A: 1.0, B: 0.0, C: 0.0}),
    ],
)
def test_draws_follow_the_distribution(sampling: dict, expected: dict[int, float]) -> None:
    """Frequencies within 0.035 of the probabilities: over 4.5 standard deviations of a
    binomial proportion at 4,000 draws (sd <= 0.0079), and the seed is fixed."""
    counts = first_tokens(**sampling)
    assert set(counts) <= {t for t, p in expected.items() if p > 0}  # never outside the set
    for token, probability in expected.items():
        assert counts[token] / DRAWS == pytest.approx(probability, abs=0.035), token


def test_truncation_keeps_exactly_the_allowed_tokens() -> None:
    log_probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.2, 0.3, 0.4, 0.1]]).log()
    top_k = truncate(log_probs, 1.0, top_k=2, top_p=1.0)
    assert (top_k > 0).tolist() == [[False, True, False, True], [False, True, True, False]]
    torch.testing.assert_close(top_k.sum(-1), torch.ones(2))
    top_p = truncate(log_probs, 1.0, top_k=0, top_p=0.6)  # 0.4 + 0.3 in both rows
    assert (top_p > 0).sum(-1).tolist() == [2, 2]
    assert top_p[0].tolist() == pytest.approx([0, 4 / 7, 0, 3 / 7])


def test_a_draw_never_takes_a_token_of_probability_zero() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 4)
    uniforms = torch.tensor([0.0, 0.49, 0.5, 1 - 2**-53], dtype=torch.float64)
    assert draw(probs, uniforms).tolist() == [1, 1, 2, 2]


def test_scores_are_the_models_log_probabilities_of_the_draws() -> None:
    model = TableModel()  # A 0.6 / B 0.4, then more tokens: samples of several lengths
    src, max_len = torch.full((1, 2), EOS_ID), torch.tensor([6])
    [samples] = sample_search(
        model, src, max_len, [(3, 0)], samples=50, temperature=1.5, length_penalty=1.0
    )
    assert len({tuple(h.tokens) for h in samples}) > 3
    for h in samples:
        assert h.score == pytest.approx(model.score(h.tokens) / (len(h.tokens) + 1), abs=1e-5)
        assert len(h.tokens) <= 6
    assert [h.score for h in samples] == sorted((h.score for h in samples), reverse=True)


def test_a_sentences_draws_depend_on_its_seed_alone() -> None:
    """The same (seed, line) gives the same samples alone or in a batch, in any position;
    another seed gives others."""
    model, src = tiny_transformer(), padded_sources()
    max_len = max_output_len(src, 1.5, 4, limit=256, pad_id=PAD_ID)
    seeds = [(11, line) for line in range(len(src))]
    options = {"samples": 3, "temperature": 2.0}
    batched = sample_search(model, src, max_len, seeds, **options)
    for i in range(len(src)):
        row = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        [alone] = sample_search(model, row, max_len[i : i + 1], [seeds[i]], **options)
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
    order = [4, 2, 0, 3, 1]
    shuffled = sample_search(
        model, src[order], max_len[order], [seeds[i] for i in order], **options
    )
    assert [[h.tokens for h in s] for s in shuffled] == [
        [h.tokens for h in batched[i]] for i in order
    ]
    other = sample_search(model, src, max_len, [(12, line) for line in range(5)], **options)
    assert [[h.tokens for h in s] for s in other] != [[h.tokens for h in s] for s in batched]


def test_top_k_of_one_is_greedy() -> None:
    model, src = tiny_transformer(), padded_sources()
    max_len = max_output_len(src, 1.5, 4, limit=256, pad_id=PAD_ID)
    seeds = [(0, line) for line in range(len(src))]
    sampled = sample_search(model, src, max_len, seeds, samples=2, top_k=1)
    greedy = greedy_search(model, src, max_len)
    for draws, [best] in zip(sampled, greedy, strict=True):
        assert [h.tokens for h in draws] == [best.tokens] * 2
        assert all(h.score == pytest.approx(best.score, abs=1e-5) for h in draws)
    assert not math.isnan(sampled[0][0].score)


@pytest.fixture(scope="module")
def toy() -> tuple[Tokenizer, Transformer]:
    tokenizer = toy_tokenizer(60)
    return tokenizer, trained_toy_model(tokenizer).eval()


def sampler(toy, **fields) -> Translator:
    tokenizer, model = toy
    options = {"nbest": 3, "temperature": 1.3, "seed": 5, **fields}
    return Translator(model, tokenizer, config_of("decoding/sample", DecodingConfig, **options))


@pytest.mark.slow
def test_the_same_seed_gives_the_same_samples_at_batch_sizes_1_and_64(toy) -> None:
    lines = toy_corpus(70)[0]
    one, many = sampler(toy, batch_size=1), sampler(toy, batch_size=64)
    expected = [[t.text for t in n] for n in one.translate_nbest(lines)]
    assert [[t.text for t in n] for n in many.translate_nbest(lines)] == expected
    assert any(len(set(n)) > 1 for n in expected)  # the draws differ from one another
    later = many.translate_nbest(lines[40:], first_line=41)  # a line keeps its number's seed
    assert [[t.text for t in n] for n in later] == expected[40:]
    other = sampler(toy, batch_size=64, seed=6).translate_nbest(lines)
    assert [[t.text for t in n] for n in other] != expected


@pytest.mark.slow
def test_samples_of_a_trained_model_carry_its_teacher_forced_scores(toy) -> None:
    """Against the model's own full pass over each drawn sequence (the ids: a drawn
    segmentation need not be the one SentencePiece gives its text)."""
    tokenizer, model = toy
    sources = tokenizer.encode_src(toy_corpus(12)[0])
    src = source_batch(sources)
    max_len = max_output_len(src, 1.5, 10, limit=64, pad_id=PAD_ID)
    seeds = [(5, line) for line in range(len(sources))]
    drawn = sample_search(model, src, max_len, seeds, samples=3, temperature=1.3, top_p=0.95)
    for source, samples in zip(sources, drawn, strict=True):
        for sample in samples:
            expected = teacher_forced_score(model, source, sample.tokens)
            assert sample.score == pytest.approx(expected, abs=1e-4), sample.tokens


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ({"temperature": 0.0}, "decoding.temperature", "must be > 0"),
        ({"top_k": -1}, "decoding.top_k", "must be >= 0"),
        ({"top_p": 0.0}, "decoding.top_p", "must be in (0, 1]"),
        ({"search": "nucleus"}, "decoding.search", "use beam or sample"),
    ],
)
def test_bad_sampling_settings_are_refused(overrides: dict, key: str, words: str) -> None:
    config = config_of("decoding/sample", DecodingConfig, **overrides)
    with pytest.raises(ConfigError, match=re.escape(words)) as error:
        config.check()
    assert key in str(error.value)


def test_samples_are_not_bounded_by_the_beam_and_name_their_files() -> None:
    config = config_of("decoding/sample", DecodingConfig, nbest=8, top_p=0.9)
    config.check()  # 8 samples from beam_size 1
    assert decoding_tag(config) == "sample8-t1-k0-p0.9-lp1-seed0"
    assert decoding_tag(config_of("decoding/beam", DecodingConfig)) == "beam5-lp1"


def test_draws_start_with_the_prefix_and_do_not_depend_on_other_rows_prefixes() -> None:
    """A prefix spends no random numbers, so a sentence's draws are the same next to a
    sentence with a prefix of another length, or alone."""
    model, src = tiny_transformer(), padded_sources()
    max_len = max_output_len(src, 1.5, 4, limit=256, pad_id=PAD_ID)
    seeds = [(3, line) for line in range(len(src))]
    prefixes = [[7, 8], [], [9], [10, 11, 12], []]
    options = {"samples": 2, "temperature": 1.5}
    batched = sample_search(model, src, max_len, seeds, prefixes=prefixes, **options)
    for i in range(len(src)):
        row = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        [alone] = sample_search(
            model, row, max_len[i : i + 1], [seeds[i]], prefixes=[prefixes[i]], **options
        )
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert all(h.tokens[: len(prefixes[i])] == prefixes[i] for h in batched[i])
