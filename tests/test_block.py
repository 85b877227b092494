"""The rest of the block as configuration (model.block, model.attention.layers): layer sets,
each switch against a hand computation, causality and the KV cache for every preset and mix,
and the checks that name the setting."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import (
    SPECIAL_IDS,
    assert_causal_and_cached,
    compose_config,
    configured_model,
    random_batch,
)

from seq2seq.errors import ConfigError
from seq2seq.model.config import layer_set
from seq2seq.model.transformer import Transformer

VOCAB = 40
PRESETS = [
    "no_residual",
    "no_ffn",
    "attention_only",
    "skip_deep_attention",
    "skip_shallow_attention",
    "swapped_cross_last_layer",
]
MIXES = [
    ["block.decoder.self_attention.skip=[0]"],
    ["block.decoder.cross_attention.skip=first:1", "block.decoder.feed_forward.residual=none"],
    ["block.decoder.cross_attention.residual=last:1", "block.encoder.feed_forward.skip=all"],
    ["attention.layers=[{layers: [0], decoder_self: {query: source}}]"],
    ["attention.layers=[{layers: last:1, cross: {score: additive, heads: 1}}]", "norm=post"],
]


@pytest.mark.parametrize(
    ("value", "count", "layers"),
    [
        ("all", 3, {0, 1, 2}),
        ("none", 3, set()),
        (True, 2, {0, 1}),
        (False, 2, set()),
        ("first:2", 3, {0, 1}),
        ("last:1", 3, {2}),
        ("last:25%", 3, {2}),  # rounded up
        ("last:25%", 6, {4, 5}),
        ("first:50%", 4, {0, 1}),
        ([0, -1], 4, {0, 3}),
        ([], 4, set()),
    ],
)
def test_layer_sets(value, count: int, layers: set[int]) -> None:
    assert layer_set(value, count, "k") == layers


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([3], "layer 3 is out of range for 3 layers (0 to 2, or -1 to -3 from the end)"),
        ([-4], "layer -4 is out of range"),
        ("last:4", "last:4 asks for 4 layers of 3; use at most last:3"),
        ("first:200%", "first:200% asks for 6 layers of 3; use at most first:3"),
        ("deep", "'deep' is not a layer set; use all, none, first:k, last:k"),
        ("last:1.5", "is not a layer set"),
        (["0"], "layer '0' is out of range"),
    ],
)
def test_bad_layer_sets_name_the_key(value, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        layer_set(value, 3, "model.block.decoder.feed_forward.skip")
    assert str(info.value).startswith("config key 'model.block.decoder.feed_forward.skip': ")
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (
            ["model.block.decoder.feed_forward.skip=[5]"],
            "model.block.decoder.feed_forward.skip",
            "layer 5 is out of range for 3",
        ),
        (
            [
                "model.block.encoder.self_attention.skip=[1]",
                "model.block.encoder.feed_forward.skip=[1]",
            ],
            "model.block.encoder",
            "layer 1 skips all of self_attention, feed_forward: it would do nothing",
        ),
        (
            [
                "model.block.decoder.self_attention.skip=all",
                "model.block.decoder.cross_attention.skip=all",
                "model.block.decoder.feed_forward.skip=last:1",
            ],
            "model.block.decoder",
            "layer 2 skips all of self_attention, cross_attention, feed_forward",
        ),
        (
            ["model.attention.layers=[{layers: [0], encoder_self: {key_value: target}}]"],
            "model.attention.layers[0].encoder_self",
            "the encoder never sees the target",
        ),
        (
            ["model.attention.layers=[{layers: last:1, cross: {heads: 3}}]"],
            "model.attention.layers[0].cross.heads",
            "not divisible by 3 heads",
        ),
        (
            ["model.attention.layers=[{layers: [7], cross: {heads: 1}}]"],
            "model.attention.layers[0].layers",
            "layer 7 is out of range",
        ),
    ],
)
def test_bad_block_settings_name_the_key(overrides: list[str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)  # transformer_small: 3 + 3 layers, 4 heads of d_model 256
    assert str(info.value).startswith(f"config key '{key}': ")
    assert words in str(info.value)


def test_a_decoder_without_any_path_from_the_source_is_named(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="seq2seq.model.transformer"):
        configured_model()
    assert not caplog.records
    for overrides in (
        ["block.decoder.cross_attention.skip=all"],
        ["attention.cross.key_value=target"],  # the no_source preset
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="seq2seq.model.transformer"):
            model = configured_model(*overrides)
        assert not model.reads_source()
        assert "no running decoder attention takes its queries or keys/values from the source" in (
            caplog.text
        )


def layer_input(d_model: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    return torch.randn(2, 5, d_model), torch.ones(2, 1, 1, 5, dtype=torch.bool)


def test_no_residual_replaces_the_input_with_the_sublayer_output() -> None:
    (layer,) = configured_model(
        "block.encoder.self_attention.residual=none", "block.encoder.feed_forward.residual=none"
    ).encoder_layers
    x, mask = layer_input()
    attended = layer.self_attention(layer.attention_block.norm(x), None, mask)[0]
    expected = layer.feed_forward(layer.feed_forward_block.norm(attended))  # pre-LN, no x +
    torch.testing.assert_close(layer(x, mask)[0], expected)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_a_skipped_sublayer_is_the_identity_and_has_no_parameters(norm: str) -> None:
    standard = configured_model(f"norm={norm}")
    skipped = configured_model(f"norm={norm}", "block.encoder.feed_forward.skip=all")
    (layer,) = skipped.encoder_layers
    assert layer.feed_forward is None and layer.feed_forward_block is None
    x, mask = layer_input()
    h = layer.attention_block.sublayer_input(x)
    expected = layer.attention_block(x, layer.self_attention(h, None, mask)[0])
    torch.testing.assert_close(layer(x, mask)[0], expected)
    missing = set(standard.state_dict()) - set(skipped.state_dict())
    assert missing == {
        f"encoder_layers.0.{name}"
        for name in (
            "feed_forward.expand.weight",
            "feed_forward.expand.bias",
            "feed_forward.contract.weight",
            "feed_forward.contract.bias",
            "feed_forward_block.norm.weight",
            "feed_forward_block.norm.bias",
        )
    }


def test_skipping_the_attention_of_a_decoder_layer_leaves_its_feed_forward() -> None:
    model = configured_model(
        "block.decoder.self_attention.skip=[1]", "block.decoder.cross_attention.skip=[1]"
    )
    layer = model.decoder_layers[1]
    assert layer.self_attention is None and layer.cross_attention is None
    y, mask = layer_input()
    memory = torch.randn(2, 5, 32)
    expected = y + layer.feed_forward(layer.feed_forward_block.norm(y))
    output, weights = layer(y, memory, mask, need_weights=True)
    torch.testing.assert_close(output, expected)
    assert weights == {"decoder_self": None, "cross": None}


def test_wiring_for_some_layers_only() -> None:
    config = compose_config(["+ablation=swapped_cross_last_layer"]).model
    model = Transformer(config, VOCAB, VOCAB, True, **SPECIAL_IDS)
    streams = [
        (layer.cross_attention.query_stream.value, layer.cross_attention.key_value_stream.value)
        for layer in model.decoder_layers
    ]
    assert streams == [("target", "source"), ("target", "source"), ("source", "target")]
    assert [layer.self_attention.query_stream.value for layer in model.decoder_layers] == [
        "target"
    ] * 3


def block_model(preset_or_overrides: str | list[str]) -> Transformer:
    if isinstance(preset_or_overrides, list):
        return configured_model(*preset_or_overrides, encoder_layers=2, decoder_layers=3)
    torch.manual_seed(0)
    config = compose_config([f"+ablation={preset_or_overrides}", "model=transformer_tiny"]).model
    return Transformer(config, VOCAB, VOCAB, True, **SPECIAL_IDS).eval()


@pytest.mark.parametrize("setting", PRESETS + MIXES, ids=str)
def test_every_block_setting_is_causal_and_its_kv_cache_equals_the_full_pass(setting) -> None:
    assert_causal_and_cached(block_model(setting), *random_batch(VOCAB), VOCAB)


@pytest.mark.parametrize("setting", PRESETS + MIXES, ids=str)
def test_every_block_setting_decodes_on_after_sentences_leave_the_batch(setting) -> None:
    model = block_model(setting)
    src, tgt = random_batch(VOCAB)
    full = model(src, tgt).log_softmax(-1)
    state = model.start_decoding(src)
    for t in range(3):
        model.decode_step(state, tgt[:, t])
    keep = torch.tensor([1, 2])
    state.reorder(keep)
    later = torch.stack([model.decode_step(state, tgt[keep, t]) for t in range(3, tgt.shape[1])], 1)
    torch.testing.assert_close(later, full[keep, 3:], atol=1e-5, rtol=1e-5)
