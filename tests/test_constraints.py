"""Lexically constrained beam search: every phrase appears in the output where the limits allow,
overlapping phrases count where they overlap, scores are the model's own, and sentences
without phrases are searched exactly as by beam search."""

from __future__ import annotations

import math
import re

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

from seq2seq.data.tokenizer import BOS_ID, PAD_ID, Tokenizer
from seq2seq.decoding.backend import Request
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.constraints import PhraseMatcher, constrained_beam_search
from seq2seq.decoding.search import beam_search, max_output_len
from seq2seq.decoding.translator import Translator
from seq2seq.errors import ConfigError, DataError
from seq2seq.model.transformer import Transformer


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i : i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def matched(matcher: PhraseMatcher, tokens: list[int]) -> tuple[int, int]:
    met, node = 0, 0
    for token in tokens:
        met, node = matcher.advance(met, node, token)
    return met, node


def test_the_matcher_finds_phrases_anywhere_and_where_they_overlap() -> None:
    matcher = PhraseMatcher([[4, 5], [5], [5, 6, 7]])
    assert matched(matcher, [4, 5])[0] == 0b011  # "red ball" holds "ball"
    assert matched(matcher, [9, 4, 5, 6, 7])[0] == 0b111
    assert matched(matcher, [5, 6, 8])[0] == 0b010
    met, node = matched(matcher, [9, 5, 6])
    assert met == 0b010 and matcher.progress(met, node) == 1 + 2  # "ball", then 2 of 3
    assert matcher.advancing(met, node) == {7, 4, 5}  # on into [5, 6, 7], or start one
    assert matcher.progress(*matched(matcher, [4, 5, 6, 7])) == matcher.total


@pytest.mark.parametrize(("length_penalty", "nbest"), [(1.0, 1), (0.0, 1), (1.0, 3)])
def test_without_phrases_it_is_beam_search(length_penalty: float, nbest: int) -> None:
    model, src = tiny_transformer(), padded_sources()
    max_len = max_output_len(src, 1.5, 4, limit=256, pad_id=PAD_ID)
    expected = beam_search(model, src, max_len, 4, length_penalty, nbest)
    got = constrained_beam_search(model, src, max_len, 4, [[]] * 5, length_penalty, nbest)
    assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in expected]
    for a, b in zip(got, expected, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize(
    "phrases",
    [[[C]], [[B, A]], [[C, A], [A, B]], [[A, B], [B, A]], [[A, C, B], [C]]],
    ids=["unlikely token", "two words", "two phrases", "overlapping", "one inside another"],
)
def test_every_phrase_appears_with_the_models_score(phrases: list[list[int]]) -> None:
    """The table model's unconstrained best is B (then EOS): each phrase list is met, and
    the score is the model's log-probability of the output over its length."""
    model, src, max_len = TableModel(), torch.full((1, 2), 2), torch.tensor([8])
    [[free]] = beam_search(model, src, max_len, 4)
    assert not all(contains(free.tokens, p) for p in phrases)
    [[h]] = constrained_beam_search(model, src, max_len, 4, [phrases])
    assert all(contains(h.tokens, p) for p in phrases), h.tokens
    assert h.score == pytest.approx(renormalised_score(model, h.tokens), abs=1e-5)


def renormalised_score(model: TableModel, tokens: list[int]) -> float:
    """The table model's log-probability of `tokens` and EOS, each step renormalised without
    PAD and BOS (as search scores), over the length with EOS."""
    path = [model.bos_id, *tokens, model.eos_id]
    total = 0.0
    for last, token in zip(path, path[1:], strict=False):
        p = model.log_p[last].exp()
        total += float(model.log_p[last, token]) - math.log(1 - float(p[PAD_ID] + p[BOS_ID]))
    return total / (len(tokens) + 1)


def test_overlapping_phrases_share_their_tokens() -> None:
    model, src, max_len = TableModel(), torch.full((1, 2), 2), torch.tensor([8])
    [[h]] = constrained_beam_search(model, src, max_len, 8, [[[A, B], [B, A]]], 0.0)
    assert h.tokens == [B, A, B]  # the best of A B A and B A B: one token serves both phrases


def test_a_phrase_beyond_the_length_limit_gives_the_best_output_without_it() -> None:
    model, src = TableModel(), torch.full((1, 2), 2)
    [[h]] = constrained_beam_search(model, src, torch.tensor([1]), 3, [[[C, C, C]]])
    assert len(h.tokens) <= 1 and not contains(h.tokens, [C, C, C])


def test_phrases_in_a_batch_equal_one_sentence_at_a_time() -> None:
    model, src = tiny_transformer(), padded_sources()
    max_len = max_output_len(src, 1.5, 6, limit=256, pad_id=PAD_ID)
    phrases = [[[7, 8]], [], [[9], [10, 11]], [[12]], [[13, 14, 15]]]
    batched = constrained_beam_search(model, src, max_len, 5, phrases)
    for i in range(len(src)):
        row = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        [alone] = constrained_beam_search(model, row, max_len[i : i + 1], 5, [phrases[i]])
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert all(contains(batched[i][0].tokens, p) for p in phrases[i])


@pytest.fixture(scope="module")
def toy() -> tuple[Tokenizer, Transformer]:
    tokenizer = toy_tokenizer(60)
    return tokenizer, trained_toy_model(tokenizer).eval()


LINES = toy_corpus(30)[0][:12]
PHRASES = [["BALL"], [], ["RED DOG", "CAT"], ["UNDER THE"], *[[]] * 8]


@pytest.mark.slow
def test_translations_contain_their_phrases_and_carry_the_models_scores(toy) -> None:
    tokenizer, model = toy
    # "RED DOG" and "CAT" are 10 pieces of this 60-piece vocabulary: a beam of 12 has room
    decoding = config_of("decoding/beam", DecodingConfig, beam_size=12)
    translator = Translator(model, tokenizer, decoding)
    free = translator.translate(LINES)
    constrained = translator.translate(LINES, constraints=PHRASES)
    for output, phrases, unconstrained in zip(constrained, PHRASES, free, strict=True):
        assert all(p in output for p in phrases), (output, phrases)
        if not phrases:
            assert output == unconstrained
    sources = tokenizer.encode_src(LINES)
    requests = [
        Request(s, i + 1, [], tokenizer.encode_tgt(p) if p else [])
        for i, (s, p) in enumerate(zip(sources, PHRASES, strict=True))
    ]
    for request, [best] in zip(
        requests, translator.backend.decode(requests, decoding), strict=True
    ):
        assert best.score == pytest.approx(
            teacher_forced_score(model, request.source, best.tokens), abs=1e-4
        )


@pytest.mark.slow
def test_prefix_and_constraints_together(toy) -> None:
    tokenizer, model = toy
    translator = Translator(model, tokenizer, config_of("decoding/beam", DecodingConfig))
    [output] = translator.translate(LINES[:1], prefixes=["A"], constraints=[["BALL"]])
    assert output.startswith("A") and "BALL" in output


@pytest.mark.slow
def test_unmet_phrases_are_warned_with_the_line(toy, caplog: pytest.LogCaptureFixture) -> None:
    tokenizer, model = toy
    decoding = config_of("decoding/beam", DecodingConfig, max_len_a=0.0, max_len_b=1)
    translator = Translator(model, tokenizer, decoding)
    translator.translate(LINES[:2], "in.txt", 7, constraints=[["RED BALL UNDER THE CAT"], []])
    assert "in.txt, line 7: no translation within the length limit and beam holds" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("constraints", "words"),
    [
        ([["A"]], "constraints for 1 lines, 12 input lines"),
        ([["A", " "], *[[]] * 11], "constraints of input, line 1: an empty phrase"),
    ],
)
def test_bad_constraints_are_refused(toy, constraints: list, words: str) -> None:
    tokenizer, model = toy
    with pytest.raises(DataError, match=re.escape(words)):
        Translator(model, tokenizer).translate(LINES, constraints=constraints)


@pytest.mark.slow
def test_sampling_with_constraints_is_refused(toy) -> None:
    tokenizer, model = toy
    translator = Translator(model, tokenizer, config_of("decoding/sample", DecodingConfig))
    with pytest.raises(ConfigError, match="decoding=sample cannot take constraints"):
        translator.translate(LINES[:1], constraints=[["BALL"]])
