"""Attention heatmaps (seq2seq.visualize): the weights the decoder returns, for each wiring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import config_of, wired_model

from seq2seq.config import DecodingConfig, TokenizerConfig
from seq2seq.data.tokenizer import Tokenizer, train_sentencepiece
from seq2seq.model.transformer import Transformer
from seq2seq.translator import Translator


def translator(model: Transformer) -> Translator:
    """`model` with a 40-piece SentencePiece model of a few toy sentences, greedy decoding."""
    words = ["a dog runs", "the cat sleeps", "a man reads a book", "two children play"] * 20
    spm = train_sentencepiece(
        words,
        config_of("tokenizer/sentencepiece", TokenizerConfig, vocab_size=40, byte_fallback=False),
    )
    return Translator(model, Tokenizer(spm, spm), config_of("decoding/greedy", DecodingConfig))


@pytest.mark.parametrize(
    "cross", [("target", "source"), ("source", "target"), ("source", "source")]
)
def test_heatmaps_for_each_wiring(cross, tmp_path: Path) -> None:
    from seq2seq.visualize import attention_maps, plot

    maps, query, key, _ = attention_maps(
        translator(wired_model(cross=cross)), "a dog reads", "cross"
    )
    assert len(maps) == 2 and all(m.shape == (4, len(query), len(key)) for m in maps)
    expected_query = "</s>" if cross[0] == "source" else "<s>"
    assert expected_query in query
    plot(maps, query, key, per_head=True, title="t", output=tmp_path / "x.png")
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


def test_decoder_self_attention_heatmap_is_causal() -> None:
    from seq2seq.visualize import attention_maps

    maps, query, key, _ = attention_maps(translator(wired_model()), "a dog reads", "decoder_self")
    assert query == key and query[0] == "<s>"
    for weights in maps:  # (heads, T, T): position t attends to positions <= t only
        assert weights.shape == (4, len(query), len(key))
        assert (np.triu(weights, k=1) == 0).all()
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
