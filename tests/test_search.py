"""Greedy and beam search: beam 1 is greedy, beam finds a better path, batching changes nothing,
scores are the normalised log-probabilities, n-best lists are the best finished hypotheses."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from helpers import A, B, C, TableModel, padded_sources, teacher_forced_score, tiny_transformer

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decoding.search import beam_search, greedy_search, max_output_len
from seq2seq.model.transformer import Transformer


@pytest.mark.parametrize("ids", [(PAD_ID, BOS_ID, EOS_ID), (3, 0, 1)])
def test_beam_search_finds_the_better_sequence_greedy_misses(ids: tuple[int, int, int]) -> None:
    model, src, max_len = TableModel(*ids), torch.full((1, 2), 2), torch.tensor([6])
    [[greedy]] = greedy_search(model, src, max_len, length_penalty=0.0)
    [[beam]] = beam_search(model, src, max_len, beam=2, length_penalty=0.0)
    assert greedy.tokens[0] == A
    assert beam.tokens == [B]  # ended by the model's EOS id, whichever it is
    assert model.score(beam.tokens) > model.score(greedy.tokens)
    assert math.isclose(math.exp(model.score(beam.tokens)), 0.4 * 0.95, rel_tol=1e-6)
    assert beam.score == pytest.approx(model.score(beam.tokens), abs=1e-6)
    assert greedy.score == pytest.approx(model.score(greedy.tokens), abs=1e-6)


@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 1.0, 1.4])
def test_scores_are_log_probabilities_over_length_with_eos(length_penalty: float) -> None:
    model, src, max_len = TableModel(), torch.full((1, 2), 2), torch.tensor([6])
    [greedy] = greedy_search(model, src, max_len, length_penalty)
    [nbest] = beam_search(model, src, max_len, 3, length_penalty, nbest=3)
    assert len(greedy) == 1 and len(nbest) == 3
    for hypothesis in [*greedy, *nbest]:
        length = len(hypothesis.tokens) + 1  # EOS counted
        expected = model.score(hypothesis.tokens) / length**length_penalty
        assert hypothesis.score == pytest.approx(expected, abs=1e-5)
    scores = [h.score for h in nbest]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(h.tokens) for h in nbest}) == 3  # distinct hypotheses
    [[best]] = beam_search(model, src, max_len, 3, length_penalty, nbest=1)
    assert best == nbest[0]


def test_nbest_is_the_best_finished_hypotheses_of_the_beam() -> None:
    """Beam 2, at most 2 tokens, on the default table, by hand. Step 1's candidates are B EOS
    .38, A A .21, A B .21, A EOS .18: B EOS ranks within the beam and finishes; A EOS ranks
    third, so it is dropped, although better than A A EOS; A A and A B go on. Step 2 is at the
    limit: A A EOS (.063) and A B EOS (.1995) finish. Normalised by length with EOS, the best
    two are B (log .38 / 2) and A B (log .1995 / 3)."""
    model, src, max_len = TableModel(), torch.full((1, 2), 2), torch.tensor([2])
    [nbest] = beam_search(model, src, max_len, beam=2, length_penalty=1.0, nbest=2)
    assert [h.tokens for h in nbest] == [[B], [A, B]]
    expected = [math.log(0.38) / 2, math.log(0.6 * 0.35 * 0.95) / 3]
    assert [h.score for h in nbest] == pytest.approx(expected, abs=1e-5)


def test_without_length_penalty_search_goes_on_until_the_best_candidate_ends() -> None:
    """EOS at once (0.3) and B EOS (0.2) finish first, filling a beam of 2; A C EOS (0.45)
    is better. A sentence stops only once a step's best candidate is an EOS, as in
    CTranslate2, so beam search finds A C."""
    table = {BOS_ID: {A: 0.5, "eos": 0.3, B: 0.2}, A: {C: 0.9, "eos": 0.1}, B: {"eos": 1.0}}
    table[C] = {"eos": 1.0}
    model, src, max_len = TableModel(next_tokens=table), torch.full((1, 2), 2), torch.tensor([6])
    [nbest] = beam_search(model, src, max_len, beam=2, length_penalty=0.0, nbest=2)
    assert [h.tokens for h in nbest] == [[A, C], []]
    assert nbest[0].score == pytest.approx(math.log(0.45), abs=1e-6)


def test_nbest_above_the_beam_is_refused() -> None:
    model, src, max_len = TableModel(), torch.full((1, 2), 2), torch.tensor([6])
    with pytest.raises(ValueError, match="nbest=3"):
        beam_search(model, src, max_len, beam=2, nbest=3)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_size_one_equals_greedy(length_penalty: float) -> None:
    model, src = tiny_transformer(), padded_sources()
    max_len = torch.tensor([3, 8, 12, 0, 15])
    greedy = greedy_search(model, src, max_len, length_penalty)
    beam = beam_search(model, src, max_len, beam=1, length_penalty=length_penalty)
    assert [[h.tokens] for [h] in beam] == [[h.tokens] for [h] in greedy]
    for [b], [g] in zip(beam, greedy, strict=True):
        assert b.score == pytest.approx(g.score, abs=1e-5)
    assert all(len(g.tokens) <= m for [g], m in zip(greedy, max_len.tolist(), strict=True))
    assert greedy[3][0].tokens == []  # max_len 0: EOS at once


@pytest.mark.parametrize("beam", [1, 3])
def test_batched_search_equals_one_sentence_at_a_time(beam: int) -> None:
    model, src = tiny_transformer(), padded_sources()
    max_len = max_output_len(src, 1.5, 4, limit=256, pad_id=PAD_ID)
    batched = beam_search(model, src, max_len, beam=beam)
    for i in range(len(src)):
        row = src[i : i + 1]
        row = row[:, : int((row != PAD_ID).sum())]
        [alone] = beam_search(model, row, max_len[i : i + 1], beam=beam)
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-5)
    assert all(len(h.tokens) <= m for [h], m in zip(batched, max_len.tolist(), strict=True))


class RowCounter:
    """The tiny Transformer, recording how many rows each decoding step computes."""

    def __init__(self, model: Transformer) -> None:
        self.model, self.rows = model, []
        self.pad_id, self.bos_id, self.eos_id = model.pad_id, model.bos_id, model.eos_id
        self.never_ids = model.never_ids

    def start_decoding(self, src: torch.Tensor, beam: int = 1):
        return self.model.start_decoding(src, beam)

    def decode_step(self, state, tokens: torch.Tensor) -> torch.Tensor:
        self.rows.append(len(tokens))
        return self.model.decode_step(state, tokens)


@pytest.mark.parametrize("beam", [1, 3])
def test_finished_sentences_leave_the_batch(beam: int) -> None:
    """A sentence stops costing decoder work once it is done: here sentence 3 may output
    nothing (max_len 0) and leaves after the first step; the others at their own limits."""
    counter, src = RowCounter(tiny_transformer()), padded_sources()
    max_len = torch.tensor([3, 8, 12, 0, 15])
    search = greedy_search if beam == 1 else partial(beam_search, beam=beam)
    search(counter, src, max_len)
    assert counter.rows[0] == 5 * beam
    assert counter.rows[1] <= 4 * beam
    assert counter.rows == sorted(counter.rows, reverse=True)
    assert len(counter.rows) <= 16 and counter.rows[-1] <= beam  # the longest decodes alone


def test_search_never_outputs_pad_bos_or_a_tag() -> None:
    src = padded_sources()
    max_len = torch.full((len(src),), 6)
    models = {tags: tiny_transformer(tag_ids=tags) for tags in ((), (C,))}
    [[first]] = greedy_search(models[()], src[:1], max_len[:1])
    for model in models.values():
        with torch.no_grad():  # make BOS, PAD and C the most likely outputs
            weight = model.output_projection.weight
            weight[BOS_ID] *= 50
            weight[PAD_ID] *= 50
            weight[C] = 3 * weight[first.tokens[0]]
    [[untagged]] = greedy_search(models[()], src[:1], max_len[:1])
    assert C in untagged.tokens  # a model without tags writes C
    model = models[(C,)]
    for out in (greedy_search(model, src, max_len), beam_search(model, src, max_len, beam=3)):
        assert all(tok not in (PAD_ID, BOS_ID, C) for [h] in out for tok in h.tokens)
    model = tiny_transformer(tag_ids=(C,))  # scores renormalised without the tag too
    for out in (greedy_search(model, src, max_len), beam_search(model, src, max_len, beam=3)):
        for row, [h] in zip(src.tolist(), out, strict=True):
            source = row[: row.index(EOS_ID)]
            assert h.score == pytest.approx(teacher_forced_score(model, source, h.tokens), abs=1e-4)


def test_max_output_len() -> None:
    src = torch.tensor([[5, 6, 7, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]])
    assert max_output_len(src, 1.5, 2, limit=256, pad_id=PAD_ID).tolist() == [6, 3]
    assert max_output_len(src, 1.5, 2, limit=5, pad_id=PAD_ID).tolist() == [4, 3]


@pytest.mark.parametrize("beam", [1, 2])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_a_prefix_is_forced_and_scored(beam: int, length_penalty: float) -> None:
    """Greedy would start with A; a prefix of B (or A A) is output first, the rest searched,
    and the score is the model's log-probability of the whole output, prefix included."""
    model, src = TableModel(), torch.full((3, 2), 2)
    max_len = torch.tensor([6, 6, 6])
    prefixes = [[B], [A, A], []]
    search = partial(beam_search, beam=beam) if beam > 1 else greedy_search
    found = search(model, src, max_len, length_penalty=length_penalty, prefixes=prefixes)
    free = search(model, src[:1], max_len[:1], length_penalty=length_penalty)
    for [h], prefix in zip(found, prefixes, strict=True):
        assert h.tokens[: len(prefix)] == prefix
        expected = model.score(h.tokens) / (len(h.tokens) + 1) ** length_penalty
        assert h.score == pytest.approx(expected, abs=1e-5)
    assert found[0][0].tokens == [B]  # B then EOS (0.95)
    assert found[2][0].tokens == free[0][0].tokens  # no prefix: as without any


@pytest.mark.parametrize("beam", [1, 3])
def test_prefixes_in_a_batch_equal_one_sentence_at_a_time(beam: int) -> None:
    model, src = tiny_transformer(), padded_sources()
    max_len = max_output_len(src, 1.5, 4, limit=256, pad_id=PAD_ID)
    prefixes = [[7, 8], [], [9], [10, 11, 12], [13]]
    batched = beam_search(model, src, max_len, beam=beam, prefixes=prefixes)
    for i in range(len(src)):
        row = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        [alone] = beam_search(model, row, max_len[i : i + 1], beam=beam, prefixes=[prefixes[i]])
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-5)
        assert batched[i][0].tokens[: len(prefixes[i])] == prefixes[i]


def test_a_prefix_longer_than_the_limit_is_output_whole() -> None:
    model, src = TableModel(), torch.full((1, 2), 2)
    [[h]] = beam_search(model, src, torch.tensor([1]), beam=2, prefixes=[[A, B, A]])
    assert h.tokens == [A, B, A]
    assert h.score == pytest.approx(model.score([A, B, A]) / 4, abs=1e-5)


def test_beam_search_ranks_a_prefix_by_its_continuation_and_scores_it_whole() -> None:
    """The improbable prefix A (0.01) weighs on A B (3 tokens with EOS) more than on A A B
    (4) under the length penalty: whole, A A B scores higher (-1.53 against -1.77); by the
    continuation, as CTranslate2 ranks, A B does (-0.23 against -0.38). The reported scores
    are still the whole outputs'."""
    table = {BOS_ID: {A: 0.01, B: 0.99}, A: {B: 0.55, A: 0.45}, B: {"eos": 0.9, A: 0.1}}
    model, src = TableModel(next_tokens=table), torch.full((1, 2), 2)
    [found] = beam_search(model, src, torch.tensor([6]), beam=2, nbest=2, prefixes=[[A]])
    assert [h.tokens for h in found] == [[A, B], [A, A, B]]
    expected = [model.score(h.tokens) / (len(h.tokens) + 1) for h in found]
    assert [h.score for h in found] == pytest.approx(expected, abs=1e-5)
    assert expected[0] < expected[1]


def test_right_after_a_prefix_only_the_best_candidate_ends() -> None:
    """After the prefix A, ending (0.4) is second to A (0.5): CTranslate2's rule keeps [A]
    from ending there, so A A (then EOS: 0.5 x 0.4 of the continuation) wins. After the prefix
    B, the same second-ranked EOS comes a step later and ends B A as usual (0.4, over 0.2)."""
    table = {BOS_ID: {A: 0.5, B: 0.5}, A: {A: 0.5, "eos": 0.4, B: 0.1}, B: {A: 1.0}}
    model, src = TableModel(next_tokens=table), torch.full((2, 2), 2)
    found = beam_search(
        model, src, torch.tensor([6, 6]), beam=2, length_penalty=0.0, prefixes=[[A], [B]]
    )
    assert [[h.tokens for h in n] for n in found] == [[[A, A]], [[B, A]]]
    assert found[0][0].score == pytest.approx(model.score([A, A]), abs=1e-5)
