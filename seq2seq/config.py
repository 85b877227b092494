"""Typed schema of the Hydra config tree in conf/.

Hydra composes the YAML files; `validate_config` then merges the result into this schema so that
an unknown key, a value of the wrong type or a value that cannot work fails at start-up with a
message naming the key, rather than deep inside a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from seq2seq.errors import ConfigError


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config key '{key}': {message}")


@dataclass
class PathsConfig:
    data_dir: str = "data"
    cache_dir: str = "cache"


@dataclass
class SplitFiles:
    src: str = MISSING
    tgt: str = MISSING


@dataclass
class DownloadConfig:
    url: str = MISSING  # pattern with {file}
    sha256: dict[str, str] = field(default_factory=dict)


@dataclass
class FilterConfig:
    """Limits for training pairs, in subword tokens; evaluation sets are never filtered."""

    max_len: int = 128
    max_ratio: float = 3.0
    ratio_min_len: int = 4  # pairs shorter than this on both sides skip the ratio test

    def check(self) -> None:
        _require(self.max_len >= 1, "data.filter.max_len", f"must be >= 1, got {self.max_len}")
        _require(
            self.max_ratio >= 1.0, "data.filter.max_ratio", f"must be >= 1, got {self.max_ratio}"
        )


@dataclass
class DataConfig:
    name: str = MISSING
    src_lang: str = MISSING
    tgt_lang: str = MISSING
    languages: list[str] | None = None  # allowed languages; None: any label
    dir: str = MISSING
    splits: dict[str, SplitFiles] = field(default_factory=dict)
    train_split: str = "train"
    val_split: str = "val"
    test_sets: list[str] = field(default_factory=list)
    download: DownloadConfig | None = None
    verify_checksums: bool = True
    filter: FilterConfig = field(default_factory=FilterConfig)
    max_tokens: int = 4096
    num_workers: int = 0

    def check(self) -> None:
        if self.languages is not None:
            for key, lang in (("data.src_lang", self.src_lang), ("data.tgt_lang", self.tgt_lang)):
                _require(
                    lang in self.languages,
                    key,
                    f"unknown language '{lang}' for {self.name}; choose one of "
                    f"{', '.join(self.languages)} (e.g. data.src_lang=en data.tgt_lang=de)",
                )
        _require(
            self.src_lang != self.tgt_lang,
            "data.tgt_lang",
            f"source and target are both '{self.src_lang}'; pick two different languages",
        )
        for key, split in [
            ("data.train_split", self.train_split),
            ("data.val_split", self.val_split),
        ]:
            _require(
                split in self.splits,
                key,
                f"'{split}' is not one of data.splits ({', '.join(self.splits) or 'none'})",
            )
        for name in self.test_sets:
            _require(
                name in self.splits,
                "data.test_sets",
                f"'{name}' is not one of data.splits ({', '.join(self.splits) or 'none'})",
            )
        self.filter.check()
        _require(self.max_tokens >= 1, "data.max_tokens", f"must be >= 1, got {self.max_tokens}")
        _require(
            self.max_tokens >= self.filter.max_len + 1,
            "data.max_tokens",
            f"{self.max_tokens} cannot hold one training pair of data.filter.max_len="
            f"{self.filter.max_len} tokens plus BOS/EOS; raise data.max_tokens or lower the limit",
        )
        _require(self.num_workers >= 0, "data.num_workers", "must be >= 0")


@dataclass
class TokenizerConfig:
    model_type: str = "bpe"
    vocab_size: int = 8000
    joint: bool = True
    character_coverage: float = 1.0
    byte_fallback: bool = True
    seed: int = 1

    def check(self) -> None:
        _require(
            self.model_type in ("bpe", "unigram"),
            "tokenizer.model_type",
            f"'{self.model_type}' is not supported; use bpe or unigram",
        )
        _require(
            self.vocab_size >= 300 if self.byte_fallback else self.vocab_size >= 8,
            "tokenizer.vocab_size",
            f"{self.vocab_size} is too small"
            + (" for byte_fallback (256 byte pieces + specials)" if self.byte_fallback else ""),
        )
        _require(
            0.9 <= self.character_coverage <= 1.0,
            "tokenizer.character_coverage",
            f"must be in [0.9, 1.0], got {self.character_coverage}",
        )


STREAMS = ("source", "target")
SCORES = ("scaled_dot", "dot", "additive")


@dataclass
class AttentionSiteConfig:
    """Where one attention site takes its queries and keys/values from, and how it scores."""

    query: str = "target"
    key_value: str = "source"
    score: str = "scaled_dot"  # scaled_dot: QK^T/sqrt(d_k); dot: QK^T; additive: v.tanh(q+k)
    heads: int | None = None  # None: model.heads

    def check(self, site: str, d_model: int) -> None:
        key = f"model.attention.{site}"
        for field_name in ("query", "key_value"):
            value = getattr(self, field_name)
            _require(
                value in STREAMS,
                f"{key}.{field_name}",
                f"'{value}' is not a stream; use source or target",
            )
        _require(self.score in SCORES, f"{key}.score", f"'{self.score}': use {', '.join(SCORES)}")
        if self.heads is not None:
            _require(self.heads >= 1, f"{key}.heads", f"must be >= 1, got {self.heads}")
            _require(
                d_model % self.heads == 0,
                f"{key}.heads",
                f"model.d_model={d_model} is not divisible by {self.heads} heads",
            )


def _site(query: str, key_value: str) -> Any:
    return field(default_factory=lambda: AttentionSiteConfig(query, key_value))


@dataclass
class AttentionConfig:
    """The three attention sites (docs/attention.md): standard wiring by default."""

    name: str = "standard"  # the variant's name in ablation reports
    encoder_self: AttentionSiteConfig = _site("source", "source")
    decoder_self: AttentionSiteConfig = _site("target", "target")
    cross: AttentionSiteConfig = _site("target", "source")
    allow_future_leak: bool = False  # True: no causal mask in the decoder (leak demonstration)

    def check(self, d_model: int) -> None:
        for site in ("encoder_self", "decoder_self", "cross"):
            getattr(self, site).check(site, d_model)
        encoder = self.encoder_self
        _require(
            encoder.query == "source" and encoder.key_value == "source",
            "model.attention.encoder_self",
            "the encoder never sees the target (there is none at inference, where the encoder "
            "runs before any target token exists); use query=source key_value=source",
        )


@dataclass
class ModelConfig:
    name: str = MISSING
    d_model: int = 256
    heads: int = 4
    encoder_layers: int = 3
    decoder_layers: int = 3
    ffn_dim: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    positions: str = "sinusoidal"
    norm: str = "pre"
    tie_embeddings: bool = True
    max_len: int = 256
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def check(self) -> None:
        self.attention.check(self.d_model)
        _require(self.heads >= 1, "model.heads", f"must be >= 1, got {self.heads}")
        _require(
            self.d_model % self.heads == 0,
            "model.heads",
            f"model.d_model={self.d_model} is not divisible by model.heads={self.heads}",
        )
        for key in ("encoder_layers", "decoder_layers", "ffn_dim", "max_len"):
            value = getattr(self, key)
            _require(value >= 1, f"model.{key}", f"must be >= 1, got {value}")
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, key)
            _require(0.0 <= value < 1.0, f"model.{key}", f"must be in [0, 1), got {value}")
        _require(
            self.positions in ("sinusoidal", "learned"),
            "model.positions",
            f"'{self.positions}' is not supported; use sinusoidal or learned",
        )
        _require(self.norm in ("pre", "post"), "model.norm", f"'{self.norm}': use pre or post")


@dataclass
class OptimConfig:
    lr: float = 5e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    fused: bool = True
    warmup_steps: int = 1000
    label_smoothing: float = 0.1

    def check(self) -> None:
        _require(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _require(
            0.0 <= self.label_smoothing < 1.0,
            "optim.label_smoothing",
            f"must be in [0, 1), got {self.label_smoothing}",
        )


@dataclass
class DecodingConfig:
    beam_size: int = 5
    length_penalty: float = 1.0
    max_len_a: float = 1.5  # output tokens before EOS <= max_len_a * source tokens + max_len_b
    max_len_b: int = 10
    batch_size: int = 64  # sentences per decoding batch
    long_inputs: str = "truncate"  # longer than the model's positions: truncate (warn) | error

    def check(self) -> None:
        _require(self.beam_size >= 1, "decoding.beam_size", f"must be >= 1, got {self.beam_size}")
        _require(
            self.long_inputs in ("truncate", "error"),
            "decoding.long_inputs",
            f"'{self.long_inputs}': use truncate or error",
        )
        _require(self.batch_size >= 1, "decoding.batch_size", "must be >= 1")
        _require(
            self.max_len_a >= 0 and self.max_len_b >= 1,
            "decoding.max_len_a",
            "max_len_a must be >= 0 and max_len_b >= 1",
        )


@dataclass
class RootConfig:
    """What `train` and `evaluate` read (conf/train.yaml, conf/evaluate.yaml)."""

    seed: int = 1234
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: dict[str, Any] = field(default_factory=dict)  # keyword arguments of lightning Trainer
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    ckpt_path: str | None = None  # train: resume from it; evaluate: the model to score
    average_last: int = 5  # average the last k epoch checkpoints after training (0: off)
    early_stopping_patience: int = 10  # epochs without a better validation BLEU
    evaluate_after: bool = True  # score the test sets with the final model after training
    compile: bool = False  # torch.compile the encoder and decoder layers for training
    checkpoint_every_n_steps: int = 0  # also refresh last.ckpt every n optimizer steps (0: off)
    on_nonfinite: str = "skip"  # a step whose loss or gradients are NaN/inf: skip | stop

    def check(self) -> None:
        for group in (self.data, self.tokenizer, self.model, self.optim, self.decoding):
            group.check()
        _require(self.average_last >= 0, "average_last", f"must be >= 0, got {self.average_last}")
        _require(self.early_stopping_patience >= 1, "early_stopping_patience", "must be >= 1")
        _require(
            self.checkpoint_every_n_steps >= 0,
            "checkpoint_every_n_steps",
            f"must be >= 0, got {self.checkpoint_every_n_steps}",
        )
        _require(
            self.on_nonfinite in ("skip", "stop"),
            "on_nonfinite",
            f"'{self.on_nonfinite}': use skip or stop",
        )
        _require(
            self.data.filter.max_len < self.model.max_len,
            "data.filter.max_len",
            f"training pairs of up to {self.data.filter.max_len} tokens plus BOS/EOS do not fit "
            f"the model's model.max_len={self.model.max_len} positions; lower the filter or "
            "raise model.max_len",
        )


@dataclass
class TranslateConfig:
    """What `translate` reads (conf/translate.yaml): a checkpoint and how to decode."""

    ckpt_path: str = MISSING
    input: str | None = None  # a text file; default: standard input
    output: str | None = None  # written when complete (temp file, then rename); default: stdout
    decoding: DecodingConfig = field(default_factory=DecodingConfig)

    def check(self) -> None:
        self.decoding.check()


@dataclass
class VisualizeConfig:
    """What `visualize` reads (conf/visualize.yaml)."""

    ckpt_path: str = MISSING
    text: str = MISSING
    site: str = "cross"  # cross | decoder_self
    per_head: bool = False  # one panel per head instead of the mean over heads
    output: str | None = None  # default: <checkpoint>.<site>.png beside the checkpoint
    decoding: DecodingConfig = field(default_factory=DecodingConfig)

    def check(self) -> None:
        self.decoding.check()
        _require(
            self.site in ("cross", "decoder_self"),
            "site",
            f"'{self.site}': use cross or decoder_self",
        )


def validate_config(cfg: DictConfig, schema: type = RootConfig) -> Any:
    """Check a composed config against `schema` and return it as typed objects."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        message = str(getattr(e, "msg", e)).splitlines()[0]
        hint = ""
        if "issing mandatory value" in message:
            hint = f"; set it on the command line, e.g. {key}=..."
        elif "not in" in message:
            hint = "; check its spelling against the files in conf/"
        raise ConfigError(f"config key '{key}': {message}{hint}") from None
    config.check()
    return config
