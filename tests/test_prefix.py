"""Target prefixes through the Translator: the output text starts with the prefix, the score
is the model's teacher-forced score of the whole output, lines without a prefix translate as
before, and a prefix list of the wrong length is refused."""

from __future__ import annotations

import pytest
from helpers import (
    config_of,
    teacher_forced_score,
    toy_corpus,
    toy_tokenizer,
    trained_toy_model,
)

from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.backend import Request
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import DataError
from seq2seq.model.transformer import Transformer

LINES = toy_corpus(40)[0][:20]
PREFIXES = ["THE", "", "A BIG", "DOG RUNS", *[""] * 16]


@pytest.fixture(scope="module")
def toy() -> tuple[Tokenizer, Transformer]:
    tokenizer = toy_tokenizer(60)
    return tokenizer, trained_toy_model(tokenizer).eval()


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 4])
def test_outputs_start_with_their_prefix_and_others_are_unchanged(toy, beam_size: int) -> None:
    tokenizer, model = toy
    decoding = config_of("decoding/beam", DecodingConfig, beam_size=beam_size)
    translator = Translator(model, tokenizer, decoding)
    free = translator.translate(LINES)
    forced = translator.translate(LINES, prefixes=PREFIXES)
    for output, prefix, unforced in zip(forced, PREFIXES, free, strict=True):
        assert output.startswith(prefix)
        if not prefix:
            assert output == unforced


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 4])
def test_scores_are_the_teacher_forced_scores_of_the_whole_output(toy, beam_size: int) -> None:
    tokenizer, model = toy
    decoding = config_of("decoding/beam", DecodingConfig, beam_size=beam_size, nbest=1)
    translator = Translator(model, tokenizer, decoding)
    sources, prefixes = tokenizer.encode_src(LINES), tokenizer.encode_tgt(PREFIXES)
    requests = [
        Request(s, i + 1, p) for i, (s, p) in enumerate(zip(sources, prefixes, strict=True))
    ]
    for request, [best] in zip(
        requests, translator.backend.decode(requests, decoding), strict=True
    ):
        assert best.tokens[: len(request.prefix)] == request.prefix
        expected = teacher_forced_score(model, request.source, best.tokens)
        assert best.score == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_a_prefix_list_of_another_length_is_refused(toy) -> None:
    tokenizer, model = toy
    translator = Translator(model, tokenizer)
    with pytest.raises(DataError, match="3 prefixes for 20 input lines"):
        translator.translate(LINES, prefixes=["A", "B", "C"])
