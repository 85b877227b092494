"""Attention wiring as configuration: the rules of docs/attention.md, for every wiring.

Every site (encoder self-attention included) is an AttentionSite; the ablation presets and
report are in test_ablation.py, the heatmaps in test_visualize.py.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import replace

import pytest
import torch
from helpers import (
    SPECIAL_IDS,
    assert_causal_and_cached,
    compose_config,
    random_batch,
    wired_model,
)

from seq2seq.data.tokenizer import PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.model.config import AttentionSiteConfig, Score, Stream
from seq2seq.model.sites import AttentionSite
from seq2seq.model.transformer import Transformer

VOCAB = 40
STREAM_PAIRS = list(itertools.product(["target", "source"], repeat=2))
WIRINGS = list(itertools.product(STREAM_PAIRS, STREAM_PAIRS))  # (decoder_self, cross)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(VOCAB)


@pytest.mark.parametrize(("decoder_self", "cross"), WIRINGS)
@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_every_wiring_is_causal_and_its_kv_cache_equals_the_full_pass(decoder_self, cross, score):
    assert_causal_and_cached(wired_model(decoder_self, cross, score), *batch(), VOCAB)


@pytest.mark.parametrize(("decoder_self", "cross"), WIRINGS)
def test_every_wiring_decodes_on_after_sentences_leave_the_batch(decoder_self, cross) -> None:
    """Search drops done sentences from the decoder state (`reorder` with fewer rows): every
    cache, source query and summary follows, and the rest decode exactly as the full pass."""
    m = wired_model(decoder_self, cross, "scaled_dot")
    src, tgt = batch()
    full = m(src, tgt).log_softmax(-1)
    state = m.start_decoding(src)
    for t in range(3):
        m.decode_step(state, tgt[:, t])
    keep = torch.tensor([1, 2])  # sentence 0 is done; sentence 1 has source padding
    state.reorder(keep)
    later = torch.stack([m.decode_step(state, tgt[keep, t]) for t in range(3, tgt.shape[1])], 1)
    torch.testing.assert_close(later, full[keep, 3:], atol=1e-5, rtol=1e-5)


def test_swapped_cross_attention_equals_a_hand_computation() -> None:
    torch.manual_seed(2)
    swapped = AttentionSiteConfig(Stream.source, Stream.target, Score.scaled_dot, None)
    site = AttentionSite(swapped, Stream.target, 16, 2, 0.0, causal=True).eval()
    memory, target = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[1, ..., 3:] = False  # sentence 1 has 3 source tokens
    attention = site.attention
    expected = torch.zeros(2, 4, 16)
    for b in range(2):
        n = int(keep[b].sum())
        for t in range(4):
            per_head = []
            for h in range(2):
                cols = slice(8 * h, 8 * h + 8)
                q = attention.query_projection(memory[b, :n])[:, cols]  # (n, d_k): source
                k, v = attention.key_value_projection(target[b, : t + 1]).split(16, dim=-1)
                k, v = k[:, cols], v[:, cols]  # the target prefix <= t gives keys/values
                weights = (q @ k.T / math.sqrt(8)).softmax(-1)  # (n, t+1)
                per_head.append((weights @ v).mean(0))  # averaged over source positions
            expected[b, t] = attention.output_projection(torch.cat(per_head))
    out, _ = site(target, memory, keep)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_no_source_wiring_ignores_the_source_entirely() -> None:
    m = wired_model(cross=("target", "target"))
    src, tgt = batch()
    other = torch.randint(4, VOCAB, (3, 5))
    torch.testing.assert_close(m(other, tgt), m(src, tgt))


def test_source_summary_is_one_vector_for_every_target_position() -> None:
    m = wired_model(cross=("source", "source"))
    src, tgt = batch()
    memory, mask = m.encode(src)
    target_states = torch.randn(3, 7, 32)
    site = m.decoder_layers[0].cross_attention
    out, _ = site(target_states, memory, mask)
    assert out.shape == (3, 1, 32)  # added at every position of the target stream
    other_target, _ = site(torch.randn(3, 7, 32), memory, mask)
    torch.testing.assert_close(other_target, out)  # no target in it
    padded = torch.cat([src, torch.full((3, 2), PAD_ID)], 1)  # padding is excluded
    torch.testing.assert_close(m(padded, tgt), m(src, tgt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("decoder_self", "cross"), WIRINGS[::3])
def test_weights_can_be_returned_for_any_site_without_changing_outputs(decoder_self, cross):
    m = wired_model(decoder_self, cross)
    src, tgt = batch()
    memory, mask = m.encode(src)
    plain, no_weights = m.decode(tgt, memory, mask)
    with_weights, weights_per_layer = m.decode(tgt, memory, mask, need_weights=True)
    assert no_weights is None
    torch.testing.assert_close(with_weights, plain, atol=1e-5, rtol=1e-5)
    assert len(weights_per_layer) == len(m.decoder_layers)
    for layer_weights in weights_per_layer:
        assert set(layer_weights) == {"decoder_self", "cross"}
        for weights in layer_weights.values():
            assert weights is not None and torch.allclose(weights.sum(-1), torch.tensor(1.0))


def test_the_encoder_never_sees_the_target() -> None:
    with pytest.raises(ConfigError, match="the encoder never sees the target"):
        compose_config(["model.attention.encoder_self.key_value=target"])
    bad = replace(
        wired_model().config.attention,
        encoder_self=AttentionSiteConfig(Stream.target, Stream.source, Score.scaled_dot, None),
    )
    config = replace(wired_model().config, attention=bad)
    with pytest.raises(ConfigError, match="there is none at inference"):
        Transformer(config, VOCAB, VOCAB, True, **SPECIAL_IDS)


def test_future_leak_needs_the_flag_warns_and_leaks(caplog) -> None:
    src, tgt = batch()
    with caplog.at_level(logging.WARNING):
        leaky = wired_model(allow_future_leak=True)
    assert "allow_future_leak=true" in caplog.text
    changed = tgt.clone()
    changed[:, -1] = (changed[:, -1] + 1) % (VOCAB - 4) + 4
    assert not torch.allclose(leaky(src, changed)[:, 0], leaky(src, tgt)[:, 0])


def test_per_site_heads_and_scores() -> None:
    for heads in (1, 4, 8):
        assert (
            wired_model(cross_heads=heads).decoder_layers[0].cross_attention.attention.heads
            == heads
        )
    with pytest.raises(ConfigError, match="'model.attention.cross.heads'"):
        compose_config(["model.attention.cross.heads=3"])
    with pytest.raises(ConfigError, match="'model.attention.cross.query'"):
        compose_config(["model.attention.cross.query=sauce"])
    with pytest.raises(ConfigError, match="'model.attention.cross.score'"):
        compose_config(["model.attention.cross.score=cosine"])
    config = compose_config(["model.attention.encoder_self.heads=1"])
    encoder = Transformer(config.model, VOCAB, VOCAB, True, **SPECIAL_IDS).encoder_layers[0]
    assert encoder.self_attention.attention.heads == 1


def test_dot_score_is_unscaled() -> None:
    torch.manual_seed(3)
    scaled = wired_model(score="scaled_dot").decoder_layers[0].cross_attention.attention
    dot = wired_model(score="dot").decoder_layers[0].cross_attention.attention
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    reference = (q @ k.transpose(-2, -1)).softmax(-1) @ v
    for need_weights in (False, True):
        torch.testing.assert_close(dot.attend(q, k, v, None, need_weights)[0], reference)
    scaled_out = scaled.attend(q * math.sqrt(8), k, v, None)[0]
    torch.testing.assert_close(scaled_out, reference, atol=1e-5, rtol=1e-5)


def test_encoder_self_attention_goes_through_its_site_config() -> None:
    """encoder_self.score reaches the encoder, and only the encoder: dot scores there equal
    scaled-dot scores with queries scaled by 1/sqrt(d_k), and the decoder sites are unchanged."""
    src, tgt = batch()
    scaled, dot = wired_model(), wired_model(encoder_score="dot")  # the same weights (seed 0)
    assert isinstance(dot.encoder_layers[0].self_attention, AttentionSite)
    memory, mask = scaled.encode(src)
    dot_memory, dot_mask = dot.encode(src)
    assert not torch.allclose(dot_memory, memory, atol=1e-3)
    # the decoders are the same: given the same encoder output they agree
    torch.testing.assert_close(
        dot.decode(tgt, memory, mask)[0], scaled.decode(tgt, memory, mask)[0]
    )
    d_k = dot.encoder_layers[0].self_attention.attention.d_k
    with torch.no_grad():
        projection = dot.encoder_layers[0].self_attention.attention.query_projection
        projection.weight /= math.sqrt(d_k)
        projection.bias /= math.sqrt(d_k)
    torch.testing.assert_close(dot.encode(src)[0], memory, atol=1e-5, rtol=1e-5)
