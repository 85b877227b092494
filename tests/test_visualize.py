"""Attention heatmaps (seq2seq.analysis.attention, drawn by seq2seq.visualize): the weights the
decoder returns, for each wiring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import config_of, configured_model, wired_model

from seq2seq.data.config import TokenizerConfig
from seq2seq.data.tokenizer import Tokenizer, train_sentencepiece
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.torch_backend import TorchBackend
from seq2seq.errors import ConfigError
from seq2seq.model.transformer import Transformer


def translator(model: Transformer) -> tuple[TorchBackend, DecodingConfig]:
    """`model` with a 40-piece SentencePiece model of a few toy sentences, greedy decoding."""
    words = ["a dog runs", "the cat sleeps", "a man reads a book", "two children play"] * 20
    spm = train_sentencepiece(
        words,
        config_of("tokenizer/sentencepiece", TokenizerConfig, vocab_size=40, byte_fallback=False),
    )
    backend = TorchBackend(model, Tokenizer(spm, spm))
    return backend, config_of("decoding/greedy", DecodingConfig)


@pytest.mark.slow
@pytest.mark.parametrize(
    "cross", [("target", "source"), ("source", "target"), ("source", "source")]
)
def test_heatmaps_for_each_wiring(cross, tmp_path: Path) -> None:
    from seq2seq.analysis.attention import attention_maps, plot_attention

    maps, _ = attention_maps(*translator(wired_model(cross=cross)), "a dog reads", "cross")
    assert [m.layer for m in maps] == [0, 1]
    assert all(m.weights.shape == (4, len(m.query), len(m.key)) for m in maps)
    expected_query = "</s>" if cross[0] == "source" else "<s>"
    assert all(expected_query in m.query for m in maps)
    plot_attention(maps, per_head=True, title="t", output=tmp_path / "x.png")
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


def test_decoder_self_attention_heatmap_is_causal() -> None:
    from seq2seq.analysis.attention import attention_maps

    maps, _ = attention_maps(*translator(wired_model()), "a dog reads", "decoder_self")
    for m in maps:  # (heads, T, T): position t attends to positions <= t only
        assert m.query == m.key and m.query[0] == "<s>"
        assert m.weights.shape == (4, len(m.query), len(m.key))
        assert (np.triu(m.weights, k=1) == 0).all()
        np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)


def test_heatmaps_follow_per_layer_wiring_and_skip_skipped_layers(tmp_path: Path) -> None:
    from seq2seq.analysis.attention import attention_maps, plot_attention

    swapped_last = configured_model(
        "attention.layers=[{layers: last:1, cross: {query: source, key_value: target}}]"
    )
    maps, _ = attention_maps(*translator(swapped_last), "a dog reads", "cross")
    assert maps[0].query[0] == "<s>" and maps[0].key[-1] == "</s>"  # target over source
    assert maps[1].query[-1] == "</s>" and maps[1].key[0] == "<s>"  # source over target
    plot_attention(maps, per_head=False, title="t", output=tmp_path / "x.png")

    first_skipped = configured_model("block.decoder.cross_attention.skip=[0]")
    maps, _ = attention_maps(*translator(first_skipped), "a dog reads", "cross")
    assert [m.layer for m in maps] == [1]
    with pytest.raises(ConfigError, match="site=cross: this model skips it in every layer"):
        attention_maps(
            *translator(configured_model("block.decoder.cross_attention.skip=all")), "a", "cross"
        )


def test_every_site_and_layer_from_one_pass_with_encoder_self_against_a_reference() -> None:
    """attention_of returns encoder self, decoder self and cross weights for every layer; the
    first encoder layer's equal softmax(QK^T / sqrt(d_k)) of its own projections, and the
    encoder's states are the same with weights asked for as without."""
    import torch

    from seq2seq.analysis.attention import attention_of
    from seq2seq.decoding.backend import source_batch

    backend, _ = translator(wired_model())
    model, tokenizer = backend.model.eval(), backend.tokenizer
    src_ids, output = tokenizer.encode_src(["a dog reads a book"])[0], [7, 9, 11]
    attention = attention_of(model, tokenizer, src_ids, output)
    sites = [(m.site, m.layer) for m in attention.maps]
    assert sites == [  # one encoder layer, two decoder layers
        ("encoder_self", 0),
        ("decoder_self", 0),
        ("cross", 0),
        ("decoder_self", 1),
        ("cross", 1),
    ]
    s, t = len(src_ids) + 1, len(output) + 1
    shapes = {m.site: m.weights.shape for m in attention.maps}
    assert shapes == {"encoder_self": (4, s, s), "decoder_self": (4, t, t), "cross": (4, t, s)}
    assert attention.source[-1] == "</s>" and attention.target[0] == "<s>"

    src = source_batch([src_ids])
    layer = model.encoder_layers[0]
    with torch.no_grad():
        h = layer.attention_block.sublayer_input(model.src_embedding(src))
        mha = layer.self_attention.attention
        q, (k, _) = mha.queries(h), mha.keys_values(h)
        expected = (q @ k.transpose(-2, -1) / mha.d_k**0.5).softmax(-1)[0]
        np.testing.assert_allclose(attention.maps[0].weights, expected.numpy(), atol=1e-6)
        weights: list = []
        torch.testing.assert_close(model.encode(src, weights)[0], model.encode(src)[0])
    assert len(weights) == 1
