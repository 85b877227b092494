"""Schema of the `model` config group (conf/model/): keys, types and checks. No defaults, but
for the "keep the site's setting" (None) of per-layer wiring entries.

The choices are Enums: OmegaConf rejects any other value itself, naming the key and the allowed
values (`config key 'model.attention.cross.query': Invalid value 'sauce', expected one of
[source, target]`). Members are named as they are written in YAML, and `config_to_dict` stores
them as those plain strings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

from seq2seq.errors import require

LAYER_SETS = (
    "all, none, first:k, last:k (k layers or a percentage, e.g. last:25%), or a list of layer "
    "indices such as [0, -1]"
)


def layer_set(value: Any, count: int, key: str) -> frozenset[int]:
    """The 0-based indices of the layers that `value` names out of `count` (LAYER_SETS); true
    and false stand for all and none. Negative indices count from the end; a percentage is
    rounded up, so last:25% of 3 layers is the last one."""
    if isinstance(value, bool) or value in ("all", "none"):
        return frozenset(range(count)) if value in (True, "all") else frozenset()
    if isinstance(value, str):
        match = re.fullmatch(r"(first|last):(\d+)(%?)", value)
        require(match is not None, key, f"'{value}' is not a layer set; use {LAYER_SETS}")
        side, number, percent = match.groups()
        k = math.ceil(int(number) * count / 100) if percent else int(number)
        require(
            k <= count, key, f"{value} asks for {k} layers of {count}; use at most {side}:{count}"
        )
        return frozenset(range(k) if side == "first" else range(count - k, count))
    require(isinstance(value, Sequence), key, f"{value!r} is not a layer set; use {LAYER_SETS}")
    for index in value:
        require(
            isinstance(index, int) and -count <= index < count,
            key,
            f"layer {index!r} is out of range for {count} layers (0 to {count - 1}, or -1 to "
            f"-{count} from the end)",
        )
    return frozenset(index % count for index in value)


class Choice(str, Enum):
    """A value from a fixed set; prints as written in YAML ("target", not "Stream.target")."""

    def __str__(self) -> str:
        return self.value


class Stream(Choice):
    """Where an attention site takes its queries or keys/values from (docs/attention.md)."""

    source = "source"  # the encoder's states; in the decoder, the encoder output (memory)
    target = "target"  # the decoder's states


class Score(Choice):
    scaled_dot = "scaled_dot"  # softmax(QK^T / sqrt(d_k)) (Vaswani et al. 2017)
    dot = "dot"  # softmax(QK^T)
    additive = "additive"  # softmax(v^T tanh(q + k)) (Bahdanau et al. 2015)


class Norm(Choice):
    pre = "pre"  # layer norm before each sublayer (Xiong et al. 2020)
    post = "post"  # after each residual sum, as in the paper


class Positions(Choice):
    sinusoidal = "sinusoidal"
    learned = "learned"


@dataclass
class AttentionSiteConfig:
    """Where one attention site takes its queries and keys/values from, and how it scores."""

    query: Stream
    key_value: Stream
    score: Score
    heads: int | None  # None: model.heads

    def check(self, site: str, d_model: int) -> None:
        if self.heads is not None:
            key = f"model.attention.{site}.heads"
            require(self.heads >= 1, key, f"must be >= 1, got {self.heads}")
            require(
                d_model % self.heads == 0,
                key,
                f"model.d_model={d_model} is not divisible by {self.heads} heads",
            )


@dataclass
class SiteOverrideConfig:
    """A site's settings in some layers only; None keeps the site's own."""

    query: Stream | None = None
    key_value: Stream | None = None
    score: Score | None = None
    heads: int | None = None


@dataclass
class LayerWiringConfig:
    """Attention settings for a subset of the layers, e.g. the cross-attention of the last
    decoder layer: {layers: last:1, cross: {query: source, key_value: target}}."""

    layers: Any  # a layer set (LAYER_SETS), of the encoder for encoder_self, else the decoder
    encoder_self: SiteOverrideConfig = field(default_factory=SiteOverrideConfig)
    decoder_self: SiteOverrideConfig = field(default_factory=SiteOverrideConfig)
    cross: SiteOverrideConfig = field(default_factory=SiteOverrideConfig)


SITES = ("encoder_self", "decoder_self", "cross")


@dataclass
class AttentionConfig:
    """The three attention sites (docs/attention.md): standard wiring by default, with
    per-layer exceptions in `layers` (later entries win)."""

    name: str  # the variant's name in ablation reports
    encoder_self: AttentionSiteConfig
    decoder_self: AttentionSiteConfig
    cross: AttentionSiteConfig
    allow_future_leak: bool  # True: no causal mask in the decoder (leak demonstration)
    layers: list[LayerWiringConfig]

    def exceptions(self, site: str, layer: int, count: int) -> list[tuple[int, SiteOverrideConfig]]:
        """(index in `layers`, its settings for `site`) of the entries that name `layer` (of
        `count` in its stack) and change something there, in order."""
        return [
            (number, getattr(entry, site))
            for number, entry in enumerate(self.layers)
            if getattr(entry, site) != SiteOverrideConfig()
            and layer in layer_set(entry.layers, count, f"model.attention.layers[{number}].layers")
        ]

    def site(self, site: str, layer: int, count: int) -> AttentionSiteConfig:
        """Site `site` of layer `layer` (of `count` in its stack), exceptions applied."""
        config = getattr(self, site)
        for _, override in self.exceptions(site, layer, count):
            changes = {f.name: getattr(override, f.name) for f in fields(override)}
            config = replace(config, **{k: v for k, v in changes.items() if v is not None})
        return config

    def check(self, d_model: int, encoder_layers: int, decoder_layers: int) -> None:
        for site in SITES:
            count = encoder_layers if site == "encoder_self" else decoder_layers
            for layer in range(count):
                exceptions = self.exceptions(site, layer, count)
                where = f"layers[{exceptions[-1][0]}].{site}" if exceptions else site
                config = self.site(site, layer, count)
                config.check(where, d_model)
                require(
                    site != "encoder_self"
                    or (config.query == Stream.source and config.key_value == Stream.source),
                    f"model.attention.{where}",
                    "the encoder never sees the target (there is none at inference, where the "
                    "encoder runs before any target token exists); use query=source "
                    "key_value=source",
                )


@dataclass
class SublayerConfig:
    """Where a sublayer (an attention site or the feed-forward) is skipped, and where it keeps
    its residual connection."""

    skip: Any  # layer set (LAYER_SETS) where it is skipped: its input passes on unchanged
    residual: Any  # layer set where its output is added to its input: x + f(x), else f(x)


@dataclass
class EncoderBlockConfig:
    self_attention: SublayerConfig
    feed_forward: SublayerConfig


@dataclass
class DecoderBlockConfig:
    self_attention: SublayerConfig
    cross_attention: SublayerConfig
    feed_forward: SublayerConfig


@dataclass
class BlockConfig:
    """The sublayers of each layer's block (docs/attention.md): everything on by default."""

    encoder: EncoderBlockConfig
    decoder: DecoderBlockConfig


@dataclass(frozen=True)
class Sublayer:
    """One sublayer of one layer, resolved: does it run, does it keep its residual."""

    runs: bool
    residual: bool


@dataclass
class ModelConfig:
    name: str
    d_model: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    ffn_dim: int
    dropout: float
    attention_dropout: float
    activation_dropout: float
    token_replacement: float  # in training, the chance that an input token becomes a random one
    positions: Positions
    norm: Norm
    tie_embeddings: bool
    max_len: int
    attention: AttentionConfig
    block: BlockConfig

    def sublayer(self, stack: str, name: str, layer: int) -> Sublayer:
        """`name` (self_attention, cross_attention, feed_forward) of layer `layer` of `stack`
        (encoder, decoder)."""
        config = getattr(getattr(self.block, stack), name)
        count = getattr(self, f"{stack}_layers")
        key = f"model.block.{stack}.{name}"
        return Sublayer(
            layer not in layer_set(config.skip, count, f"{key}.skip"),
            layer in layer_set(config.residual, count, f"{key}.residual"),
        )

    def resolved(self) -> dict[str, Any]:
        """What the model computes, layer by layer: each attention site as it runs there (heads
        filled in, per-layer exceptions applied), each sublayer's switches, and the other
        settings, names left out. Two configs with equal `resolved()` build the same model."""
        counts = {"encoder": self.encoder_layers, "decoder": self.decoder_layers}
        sites = {}
        for site in SITES:
            count = counts["encoder" if site == "encoder_self" else "decoder"]
            layers = (self.attention.site(site, layer, count) for layer in range(count))
            sites[site] = [replace(c, heads=c.heads or self.heads) for c in layers]
        block = {
            stack: {
                f.name: [self.sublayer(stack, f.name, layer) for layer in range(count)]
                for f in fields(getattr(self.block, stack))
            }
            for stack, count in counts.items()
        }
        settings = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("name", "attention", "block")
        }
        leak = self.attention.allow_future_leak
        return {**settings, "allow_future_leak": leak, "sites": sites, "block": block}

    def check(self) -> None:
        for key in ("encoder_layers", "decoder_layers", "ffn_dim", "max_len"):
            value = getattr(self, key)
            require(value >= 1, f"model.{key}", f"must be >= 1, got {value}")
        self.attention.check(self.d_model, self.encoder_layers, self.decoder_layers)
        for stack in ("encoder", "decoder"):
            names = [f.name for f in fields(getattr(self.block, stack))]
            for layer in range(getattr(self, f"{stack}_layers")):
                sublayers = [self.sublayer(stack, name, layer) for name in names]  # all checked
                require(
                    any(sublayer.runs for sublayer in sublayers),
                    f"model.block.{stack}",
                    f"layer {layer} skips all of {', '.join(names)}: it would do nothing; keep "
                    f"one of them there or use fewer layers (model.{stack}_layers)",
                )
        require(self.heads >= 1, "model.heads", f"must be >= 1, got {self.heads}")
        require(
            self.d_model % self.heads == 0,
            "model.heads",
            f"model.d_model={self.d_model} is not divisible by model.heads={self.heads}",
        )
        for key in ("dropout", "attention_dropout", "activation_dropout", "token_replacement"):
            value = getattr(self, key)
            require(0.0 <= value < 1.0, f"model.{key}", f"must be in [0, 1), got {value}")
