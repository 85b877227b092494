"""Schema of the `model` config group (conf/model/): keys, types and checks, no defaults.

The choices are Enums: OmegaConf rejects any other value itself, naming the key and the allowed
values (`config key 'model.attention.cross.query': Invalid value 'sauce', expected one of
[source, target]`). Members are named as they are written in YAML, and `config_to_dict` stores
them as those plain strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from seq2seq.errors import require


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
class AttentionConfig:
    """The three attention sites (docs/attention.md): standard wiring by default."""

    name: str  # the variant's name in ablation reports
    encoder_self: AttentionSiteConfig
    decoder_self: AttentionSiteConfig
    cross: AttentionSiteConfig
    allow_future_leak: bool  # True: no causal mask in the decoder (leak demonstration)

    def check(self, d_model: int) -> None:
        for site in ("encoder_self", "decoder_self", "cross"):
            getattr(self, site).check(site, d_model)
        encoder = self.encoder_self
        require(
            encoder.query == Stream.source and encoder.key_value == Stream.source,
            "model.attention.encoder_self",
            "the encoder never sees the target (there is none at inference, where the encoder "
            "runs before any target token exists); use query=source key_value=source",
        )


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
    positions: Positions
    norm: Norm
    tie_embeddings: bool
    max_len: int
    attention: AttentionConfig

    def check(self) -> None:
        self.attention.check(self.d_model)
        require(self.heads >= 1, "model.heads", f"must be >= 1, got {self.heads}")
        require(
            self.d_model % self.heads == 0,
            "model.heads",
            f"model.d_model={self.d_model} is not divisible by model.heads={self.heads}",
        )
        for key in ("encoder_layers", "decoder_layers", "ffn_dim", "max_len"):
            value = getattr(self, key)
            require(value >= 1, f"model.{key}", f"must be >= 1, got {value}")
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, key)
            require(0.0 <= value < 1.0, f"model.{key}", f"must be in [0, 1), got {value}")
