"""Typed schema of the Hydra config tree in seq2seq/conf/, and the upgrade of configs saved by
earlier versions (`upgrade_config`).

Hydra composes the YAML files; `validate_config` then merges the result into this schema so that
an unknown key, a value of the wrong type or a value that cannot work fails at start-up with a
message naming the key, rather than deep inside a run. The `model` group's schema lives beside
the model, in seq2seq/model/config.py.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from seq2seq.errors import ConfigError, require
from seq2seq.model.config import SITES, ModelConfig

# The YAML files are the only home of default values: the dataclasses below declare keys, types
# and checks, and have no defaults of their own. They ship inside the package (package data),
# so an editable and a regular install find them alike.
CONF_DIR = Path(__file__).resolve().parent / "conf"

# ${seq2seq.pid:} in conf/train.yaml: default run directories unique among live processes
OmegaConf.register_new_resolver("seq2seq.pid", os.getpid, replace=True)


@dataclass
class PathsConfig:
    data_dir: str
    cache_dir: str


@dataclass
class SplitFiles:
    """Two files, line i of `src` translating line i of `tgt`, or one tab-separated bitext
    `tsv` (source<TAB>target per line). None: not this form (also for splits added with +)."""

    src: str | None = None
    tgt: str | None = None
    tsv: str | None = None

    def check(self, name: str) -> None:
        two_files = self.src is not None and self.tgt is not None
        require(
            two_files != (self.tsv is not None) and (self.src is None) == (self.tgt is None),
            f"data.splits.{name}",
            f"name either two files (data.splits.{name}.src=train.en "
            f"data.splits.{name}.tgt=train.de) or one tab-separated file "
            f"(data.splits.{name}.tsv=train.tsv), not both; got src={self.src} tgt={self.tgt} "
            f"tsv={self.tsv}",
        )


@dataclass
class DownloadConfig:
    url: str  # pattern with {file}
    sha256: dict[str, str]


@dataclass
class FilterConfig:
    """Limits for training pairs, in subword tokens; evaluation sets are never filtered."""

    max_len: int
    max_ratio: float
    ratio_min_len: int  # pairs shorter than this on both sides skip the ratio test

    def check(self) -> None:
        require(self.max_len >= 1, "data.filter.max_len", f"must be >= 1, got {self.max_len}")
        require(
            self.max_ratio >= 1.0, "data.filter.max_ratio", f"must be >= 1, got {self.max_ratio}"
        )


@dataclass
class DataConfig:
    name: str
    src_lang: str
    tgt_lang: str
    languages: list[str] | None  # allowed languages; None: any label
    dir: str
    splits: dict[str, SplitFiles]
    train_split: str
    val_split: str
    test_sets: list[str]
    download: DownloadConfig | None
    verify_checksums: bool
    filter: FilterConfig
    min_train_pairs: int  # fewer training pairs left by the filters stop prepare
    max_tokens: int
    num_workers: int
    encode_processes: int  # processes that encode a corpus; 0: one per CPU core
    bpe_dropout: float  # training split segmented anew each epoch, merges dropped at this rate
    pad_to_multiple: int  # training batches' lengths padded up to a multiple of this
    bidirectional_epochs: int  # first epochs that also train on the pairs reversed (0: off)

    def check(self) -> None:
        if self.languages is not None:
            for key, lang in (("data.src_lang", self.src_lang), ("data.tgt_lang", self.tgt_lang)):
                require(
                    lang in self.languages,
                    key,
                    f"unknown language '{lang}' for {self.name}; choose one of "
                    f"{', '.join(self.languages)} (e.g. data.src_lang=en data.tgt_lang=de)",
                )
        require(
            self.src_lang != self.tgt_lang,
            "data.tgt_lang",
            f"source and target are both '{self.src_lang}'; pick two different languages",
        )
        for key, split in [
            ("data.train_split", self.train_split),
            ("data.val_split", self.val_split),
        ]:
            require(
                split in self.splits,
                key,
                f"'{split}' is not one of data.splits ({', '.join(self.splits) or 'none'})",
            )
        for name in self.test_sets:
            require(
                name in self.splits,
                "data.test_sets",
                f"'{name}' is not one of data.splits ({', '.join(self.splits) or 'none'})",
            )
        for name, files in self.splits.items():
            files.check(name)
        self.filter.check()
        require(
            self.min_train_pairs >= 1,
            "data.min_train_pairs",
            f"must be >= 1, got {self.min_train_pairs}",
        )
        require(self.max_tokens >= 1, "data.max_tokens", f"must be >= 1, got {self.max_tokens}")
        require(
            self.pad_to_multiple >= 1,
            "data.pad_to_multiple",
            f"must be >= 1 (1: no padding beyond a batch's longest pair), got "
            f"{self.pad_to_multiple}",
        )
        longest = -(-(self.filter.max_len + 1) // self.pad_to_multiple) * self.pad_to_multiple
        require(
            self.max_tokens >= longest,
            "data.max_tokens",
            f"{self.max_tokens} cannot hold one training pair of data.filter.max_len="
            f"{self.filter.max_len} tokens plus BOS/EOS"
            + (f", padded to {longest}" if longest > self.filter.max_len + 1 else "")
            + "; raise data.max_tokens or lower the limit",
        )
        require(self.num_workers >= 0, "data.num_workers", "must be >= 0")
        require(self.encode_processes >= 0, "data.encode_processes", "must be >= 0")
        require(
            0 <= self.bpe_dropout < 1,
            "data.bpe_dropout",
            f"must be in [0, 1) (0: off; Provilkov et al. use 0.1), got {self.bpe_dropout}",
        )
        require(
            self.bidirectional_epochs >= 0,
            "data.bidirectional_epochs",
            f"must be >= 0 (0: off), got {self.bidirectional_epochs}",
        )


@dataclass
class TokenizerConfig:
    model_type: str
    vocab_size: int
    joint: bool
    character_coverage: float
    byte_fallback: bool
    seed: int
    input_sentence_size: int  # train on a seeded sample of this many sentences; 0: all
    num_threads: int

    def check(self) -> None:
        require(
            self.model_type in ("bpe", "unigram"),
            "tokenizer.model_type",
            f"'{self.model_type}' is not supported; use bpe or unigram",
        )
        require(
            self.vocab_size >= 300 if self.byte_fallback else self.vocab_size >= 8,
            "tokenizer.vocab_size",
            f"{self.vocab_size} is too small"
            + (" for byte_fallback (256 byte pieces + specials)" if self.byte_fallback else ""),
        )
        require(
            0.9 <= self.character_coverage <= 1.0,
            "tokenizer.character_coverage",
            f"must be in [0.9, 1.0], got {self.character_coverage}",
        )
        require(
            self.input_sentence_size >= 0,
            "tokenizer.input_sentence_size",
            f"must be >= 0 (0: every sentence), got {self.input_sentence_size}",
        )
        require(self.num_threads >= 1, "tokenizer.num_threads", "must be >= 1")


@dataclass
class OptimConfig:
    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    fused: bool
    warmup_steps: int
    decay: str  # after warmup: inverse_sqrt | linear (to 0 at the end of the training budget)
    label_smoothing: float
    r_drop: float  # R-Drop's alpha: two passes per batch, their symmetric KL (0: off)
    ema_decay: float  # exponential moving average of the weights, per update (0: off)

    def check(self) -> None:
        require(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        require(
            self.decay in ("inverse_sqrt", "linear"),
            "optim.decay",
            f"'{self.decay}': use inverse_sqrt or linear",
        )
        require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        require(
            0.0 <= self.label_smoothing < 1.0,
            "optim.label_smoothing",
            f"must be in [0, 1), got {self.label_smoothing}",
        )
        require(self.r_drop >= 0, "optim.r_drop", f"must be >= 0 (0: off), got {self.r_drop}")
        require(
            0.0 <= self.ema_decay < 1.0,
            "optim.ema_decay",
            f"must be in [0, 1) (0: off; e.g. 0.999), got {self.ema_decay}",
        )


@dataclass
class DecodingConfig:
    search: str  # beam (beam_size 1: greedy) | sample
    beam_size: int
    length_penalty: float
    nbest: int  # hypotheses per sentence, best first: the best of the beam, or samples drawn
    max_len_a: float  # output tokens before EOS <= max_len_a * source tokens + max_len_b
    max_len_b: int
    batch_size: int  # sentences per decoding batch
    long_inputs: str  # longer than the model's positions: truncate (warn) | error
    temperature: float  # search=sample: the distribution's temperature
    top_k: int  # search=sample: draw among the k most probable tokens only (0: all)
    top_p: float  # search=sample: among the most probable tokens reaching p (1.0: all)
    seed: int  # search=sample: a sentence's draws come from (seed, its input line number)

    def check(self) -> None:
        require(
            self.search in ("beam", "sample"),
            "decoding.search",
            f"'{self.search}': use beam or sample (decoding=beam, greedy or sample)",
        )
        require(self.beam_size >= 1, "decoding.beam_size", f"must be >= 1, got {self.beam_size}")
        require(
            1 <= self.nbest <= self.beam_size or (self.search == "sample" and self.nbest >= 1),
            "decoding.nbest",
            f"{self.nbest} hypotheses from a beam of {self.beam_size}: use 1 <= nbest <= "
            "beam_size (raise decoding.beam_size for more)",
        )
        require(
            self.temperature > 0, "decoding.temperature", f"must be > 0, got {self.temperature}"
        )
        require(self.top_k >= 0, "decoding.top_k", f"must be >= 0 (0: no limit), got {self.top_k}")
        require(
            0 < self.top_p <= 1,
            "decoding.top_p",
            f"must be in (0, 1] (1: no limit), got {self.top_p}",
        )
        require(
            self.long_inputs in ("truncate", "error"),
            "decoding.long_inputs",
            f"'{self.long_inputs}': use truncate or error",
        )
        require(self.batch_size >= 1, "decoding.batch_size", "must be >= 1")
        require(
            self.max_len_a >= 0 and self.max_len_b >= 1,
            "decoding.max_len_a",
            "max_len_a must be >= 0 and max_len_b >= 1",
        )


def several_processes(trainer: dict) -> bool:
    """Whether the trainer group may start more than one process (data parallelism), reading
    `devices` as Lightning does: a count, a list or a string of indices ("0,1"; "1," is device
    1 alone), or -1 for every device. `auto` counts as one device, as it is on a CPU."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, str) and "," in devices:
        devices = [index for index in devices.split(",") if index.strip()]
    if isinstance(devices, (list, tuple)):
        several_devices = len(devices) > 1
    else:
        text = str(devices).strip()
        several_devices = text == "-1" or (text.isdigit() and int(text) > 1)
    strategy = str(trainer.get("strategy", "auto"))
    parallel = any(name in strategy for name in ("ddp", "fsdp", "deepspeed"))
    return parallel or several_devices or int(trainer.get("num_nodes", 1)) > 1


@dataclass
class RootConfig:
    """What `train` reads (conf/train.yaml); every checkpoint carries it."""

    seed: int
    paths: PathsConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    model: ModelConfig
    optim: OptimConfig
    trainer: dict[str, Any]  # keyword arguments of lightning Trainer
    decoding: DecodingConfig
    ckpt_path: str | None  # resume from it
    average_last: int  # average the last k epoch checkpoints after training (0: off)
    prefer_checkpoint: str  # the final checkpoint unless another is higher: averaged | last
    early_stopping_patience: int  # epochs without a better validation BLEU
    evaluate_after: bool  # score the test sets with the final model after training
    compile: bool  # torch.compile the encoder and decoder layers for training
    cuda_graphs: int  # training forward/backward as CUDA graphs, at most this many shapes (0: off)
    checkpoint_every_n_steps: int  # also refresh last.ckpt every n optimizer steps (0: off)
    on_nonfinite: str  # a step whose loss or gradients are NaN/inf: skip | stop
    logger: dict[str, Any] | None  # a Lightning logger (_target_ + arguments) besides metrics.csv
    threads: int | None  # torch threads and encoding processes of one run (None: the launcher's)

    def check(self) -> None:
        for group in (self.data, self.tokenizer, self.model, self.optim, self.decoding):
            group.check()
        require(
            self.logger is None or "_target_" in self.logger,
            "logger",
            "names no _target_ (a Lightning logger class); pick an option of seq2seq/conf/logger/, "
            "e.g. logger=tensorboard or logger=none",
        )
        require(
            self.threads is None or self.threads >= 1,
            "threads",
            f"must be >= 1, or null for the launcher's share of the CPUs; got {self.threads}",
        )
        require(self.average_last >= 0, "average_last", f"must be >= 0, got {self.average_last}")
        require(
            self.prefer_checkpoint in ("averaged", "last"),
            "prefer_checkpoint",
            f"'{self.prefer_checkpoint}': use averaged (the average of the last average_last "
            "epochs) or last (the weights at the end: the moving average with optim.ema_decay)",
        )
        require(self.early_stopping_patience >= 1, "early_stopping_patience", "must be >= 1")
        require(
            self.checkpoint_every_n_steps >= 0,
            "checkpoint_every_n_steps",
            f"must be >= 0, got {self.checkpoint_every_n_steps}",
        )
        require(self.cuda_graphs >= 0, "cuda_graphs", f"must be >= 0, got {self.cuda_graphs}")
        if self.cuda_graphs:
            self.check_cuda_graphs()
        require(
            self.on_nonfinite in ("skip", "stop"),
            "on_nonfinite",
            f"'{self.on_nonfinite}': use skip or stop",
        )
        require(
            self.optim.decay != "linear"
            or (self.trainer.get("max_steps") or -1) > 0
            or self.trainer.get("max_time") is not None,
            "optim.decay",
            "linear decays to 0 at the end of the training budget, and this run has none: set "
            "trainer.max_steps or trainer.max_time, or use optim.decay=inverse_sqrt",
        )
        strategy = str(self.trainer.get("strategy", "auto"))
        require(
            self.optim.ema_decay == 0 or not any(s in strategy for s in ("fsdp", "deepspeed")),
            "optim.ema_decay",
            f"{self.optim.ema_decay} keeps a whole copy of the weights in every process, and "
            f"trainer.strategy={strategy} shards them; use DDP (trainer=ddp) or "
            "optim.ema_decay=0",
        )
        model = self.model
        require(
            self.optim.r_drop == 0
            or max(model.dropout, model.attention_dropout, model.activation_dropout) > 0
            or model.token_replacement > 0,
            "optim.r_drop",
            f"{self.optim.r_drop} compares two passes that differ by their dropout masks, and "
            "this model draws none (model.dropout, attention_dropout, activation_dropout and "
            "token_replacement are 0): its penalty would be 0 at twice the cost. Set "
            "model.dropout > 0, or optim.r_drop=0",
        )
        require(
            self.data.bpe_dropout == 0 or self.tokenizer.model_type == "bpe",
            "data.bpe_dropout",
            f"drops merges of a BPE model, and tokenizer.model_type is "
            f"{self.tokenizer.model_type}; use tokenizer.model_type=bpe or data.bpe_dropout=0",
        )
        require(
            self.data.bidirectional_epochs == 0 or self.tokenizer.joint,
            "data.bidirectional_epochs",
            f"{self.data.bidirectional_epochs} trains on target sentences as sources, which "
            "needs one vocabulary for both languages, and tokenizer.joint is false; set "
            "tokenizer.joint=true or data.bidirectional_epochs=0",
        )
        require(
            self.data.bidirectional_epochs == 0 or self.data.bpe_dropout == 0,
            "data.bidirectional_epochs",
            f"{self.data.bidirectional_epochs} with data.bpe_dropout={self.data.bpe_dropout}: "
            "the two are not offered together; set one of them to 0",
        )
        require(
            self.data.bpe_dropout == 0 or self.data.num_workers == 0,
            "data.bpe_dropout",
            "segments the training split in the training process each epoch, which loader "
            f"workers do not see (data.num_workers={self.data.num_workers}); set "
            "data.num_workers=0",
        )
        require(
            self.data.filter.max_len < self.model.max_len,
            "data.filter.max_len",
            f"training pairs of up to {self.data.filter.max_len} tokens plus BOS/EOS do not fit "
            f"the model's model.max_len={self.model.max_len} positions; lower the filter or "
            "raise model.max_len",
        )

    def check_cuda_graphs(self) -> None:
        """What a graph of the forward and backward cannot follow (seq2seq/training/
        cuda_graphs.py): gradients summed over several batches (a graph's gradients live in
        its own memory until the next replay), several processes' gradient hooks, and
        torch.compile's own graphs."""
        accumulate = self.trainer.get("accumulate_grad_batches", 1)
        require(
            accumulate == 1,
            "cuda_graphs",
            f"{self.cuda_graphs} with trainer.accumulate_grad_batches={accumulate}: graphs "
            "need one batch per update; raise data.max_tokens instead, or set cuda_graphs=0",
        )
        trainer = self.trainer
        require(
            not several_processes(trainer),
            "cuda_graphs",
            f"{self.cuda_graphs} with trainer.devices={trainer.get('devices', 1)}, "
            f"trainer.num_nodes={trainer.get('num_nodes', 1)}, trainer.strategy="
            f"{trainer.get('strategy', 'auto')}: graphs train one process on one GPU; set "
            "trainer.devices=1 or cuda_graphs=0",
        )
        require(
            not self.compile,
            "cuda_graphs",
            f"{self.cuda_graphs} with compile=true, which makes graphs of its own: set "
            "compile=false or cuda_graphs=0",
        )


@dataclass
class EvaluateConfig:
    """What `evaluate` reads (conf/evaluate.yaml): the model, data config and tokenizer come
    from the checkpoint; `data` holds keys merged over the checkpoint's data config."""

    ckpt_path: str
    checkpoints: list[str]  # more checkpoints, decoded with ckpt_path as one ensemble
    prefixes: str | None  # a file aligned with the (one) test set's sources: output prefixes
    constraints: str | None  # likewise: phrases each output must contain, tab-separated
    decoding: DecodingConfig
    data: dict[str, Any]  # e.g. {"test_sets": ["val"]} or {"dir": "/elsewhere/multi30k"}

    def check(self) -> None:
        self.decoding.check()


def _open_node() -> DictConfig:
    node = OmegaConf.create({})
    OmegaConf.set_struct(node, False)
    return node


# conf/evaluate.yaml's `data`: Hydra closes every node composed from YAML, so that a key not in
# the file needs `+` on the command line; this open node takes `data.dir=...` as it is. The keys
# are checked against DataConfig once merged over the checkpoint's data config.
ConfigStore.instance().store(name="open_node", node=_open_node())


@dataclass
class TranslateConfig:
    """What `translate` reads (conf/translate.yaml): a checkpoint and how to decode."""

    ckpt_path: str
    checkpoints: list[str]  # more checkpoints, decoded with ckpt_path as one ensemble
    input: str | None  # a text file; default: standard input
    output: str | None  # written when complete (temp file, then rename); default: stdout
    prefixes: str | None  # a text file aligned with the input: what each output starts with
    constraints: str | None  # a text file aligned with the input: phrases, tab-separated
    decoding: DecodingConfig

    def check(self) -> None:
        self.decoding.check()


@dataclass
class ServeLimits:
    body_bytes: int  # largest request body
    sentences: int  # most sentences in one request
    characters: int  # longest sentence, prefix or phrase
    timeout_s: float  # a request's time, waiting and decoding


@dataclass
class ServeConfig:
    """What `serve` reads (conf/serve.yaml): a model, where to listen, how to decode (each
    request may change the decoding), and the limits on a request."""

    ckpt_path: str
    checkpoints: list[str]  # more checkpoints, decoded with ckpt_path as one ensemble
    host: str
    port: int
    batch_wait_ms: float  # how long a batch waits for more requests
    limits: ServeLimits
    decoding: DecodingConfig

    def check(self) -> None:
        self.decoding.check()
        require(0 <= self.port <= 65535, "port", f"must be in 0-65535, got {self.port}")
        require(self.batch_wait_ms >= 0, "batch_wait_ms", f"must be >= 0, got {self.batch_wait_ms}")
        for key in ("body_bytes", "sentences", "characters", "timeout_s"):
            value = getattr(self.limits, key)
            require(value > 0, f"limits.{key}", f"must be > 0, got {value}")


@dataclass
class ExportSettings:
    dir: str
    quantization: str  # "none": float32; else one of CTranslate2's types, checked on export
    overwrite: bool


@dataclass
class ExportConfig:
    """What `export` reads (conf/export.yaml): a checkpoint and where to write its conversion."""

    ckpt_path: str
    export: ExportSettings

    def check(self) -> None:
        pass


@dataclass
class AnalyzeConfig(RootConfig):
    """What `analyze` reads (conf/analyze.yaml): train's config (the data, and the model and
    tokenizer of the models at initialisation) and what to probe."""

    checkpoints: list[str]  # trained models, after ckpt_path
    init: list[str]  # presets of conf/ablation/, probed at initialisation
    split: str
    sentences: int
    output: str  # <output>.md, .csv and .png

    @property
    def trained(self) -> list[str]:
        """`ckpt_path` (one checkpoint, as in evaluate and translate), then `checkpoints`."""
        return [self.ckpt_path, *self.checkpoints] if self.ckpt_path else list(self.checkpoints)

    def check(self) -> None:
        super().check()
        require(
            bool(self.trained or self.init),
            "checkpoints",
            "nothing to probe: give ckpt_path=<run>/checkpoints/best.ckpt, "
            "checkpoints=[<a>.ckpt,<b>.ckpt] and/or init=[standard,attention_only]",
        )
        require(
            self.split in self.data.splits,
            "split",
            f"'{self.split}' is not one of data.splits ({', '.join(self.data.splits)})",
        )
        require(self.sentences >= 1, "sentences", f"must be >= 1, got {self.sentences}")


@dataclass
class VisualizeConfig:
    """What `visualize` reads (conf/visualize.yaml)."""

    ckpt_path: str
    text: str
    site: str  # cross | decoder_self | encoder_self
    per_head: bool  # one panel per head instead of the mean over heads
    output: str | None  # default: <checkpoint>.<site>.png beside the checkpoint
    decoding: DecodingConfig

    def check(self) -> None:
        self.decoding.check()
        require(self.site in SITES, "site", f"'{self.site}': use {', '.join(SITES)}")


@dataclass
class ReportConfig:
    """What `report` reads (conf/report.yaml): an ablation sweep, or training runs to compare."""

    sweep: str | None
    runs: Any  # run directories: a list, or a mapping label -> directory
    baseline: str
    test_set: str | None
    references: str | None
    output: str | None

    def check(self) -> None:
        require(
            (self.sweep is None) != (self.runs is None),
            "sweep",
            "give either sweep=<multirun dir> (an ablation report) or runs=[<run dir>,...] "
            "(validation BLEU of runs compared), not both or neither",
        )
        require(
            self.runs is None or (isinstance(self.runs, (list, dict)) and len(self.runs) > 0),
            "runs",
            f"{self.runs!r}: name run directories, runs=[outputs/a,outputs/b] or "
            "runs={bf16:outputs/a,fp32:outputs/b}",
        )

    @property
    def labelled_runs(self) -> dict[str, Path]:
        """`runs` as label -> directory; a list's directories are their own labels."""
        if isinstance(self.runs, dict):
            return {str(label): Path(str(path)) for label, path in self.runs.items()}
        return {str(path): Path(str(path)) for path in self.runs}


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
            hint = "; check its spelling against the files in seq2seq/conf/"
        raise ConfigError(f"config key '{key}': {message}{hint}") from None
    config.check()
    return config


# TensorBoard beside metrics.csv: what train logged before the `logger` group existed
TENSORBOARD = {
    "_target_": "pytorch_lightning.loggers.TensorBoardLogger",
    "name": "tensorboard",
    "version": "",
}

# every sublayer of every layer, with its residual: the only block before model.block existed
EVERY_SUBLAYER = {
    stack: {name: {"skip": "none", "residual": "all"} for name in names}
    for stack, names in (
        ("encoder", ("self_attention", "feed_forward")),
        ("decoder", ("self_attention", "cross_attention", "feed_forward")),
    )
}


# decoding keys added since the first checkpoints, with the values of the search they ran
DECODING_BEFORE_SAMPLING = {
    "nbest": 1,
    "search": "beam",
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "seed": 0,
}


def upgrade_config(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved config in today's layout: keys added since it was written get the
    values that reproduce the run that wrote it, so that old checkpoints keep loading."""
    upgraded = {
        "logger": dict(TENSORBOARD),
        "threads": None,
        "cuda_graphs": 0,
        "prefer_checkpoint": "averaged",
        **saved,
    }
    upgraded["decoding"] = {**DECODING_BEFORE_SAMPLING, **saved.get("decoding", {})}
    upgraded["tokenizer"] = {"input_sentence_size": 0, "num_threads": 1, **saved["tokenizer"]}
    upgraded["data"] = {
        "encode_processes": 0,
        "min_train_pairs": 1,
        "bpe_dropout": 0.0,
        "pad_to_multiple": 1,
        "bidirectional_epochs": 0,
        **saved["data"],
    }
    upgraded["optim"] = {
        "decay": "inverse_sqrt",
        "r_drop": 0.0,
        "ema_decay": 0.0,
        **saved["optim"],
    }
    model = saved["model"]
    upgraded["model"] = {
        "block": copy.deepcopy(EVERY_SUBLAYER),
        "token_replacement": 0.0,
        **model,
        "attention": {"layers": [], **model["attention"]},
    }
    return upgraded


def load_config(saved: dict[str, Any]) -> RootConfig:
    """A training config saved by any version (a checkpoint's, an export's, a run's
    config.yaml), upgraded and checked."""
    return validate_config(OmegaConf.create(upgrade_config(saved)))


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config as plain Python values, Enums as their YAML strings: what checkpoints and
    config.yaml store, so that `torch.load(weights_only=True)` and `validate_config` read it."""
    return OmegaConf.to_container(OmegaConf.structured(config), enum_to_str=True)


def group_config(option: str, schema: type, overrides: Sequence[str] = ()) -> Any:
    """One option of a config group, e.g. `group_config("decoding/beam", DecodingConfig)`,
    composed from conf/ and checked: the defaults of the Python API come from the YAML files,
    as on the command line. `overrides` are relative to the group (`beam_size=2`)."""
    group = option.rsplit("/", 1)[0]
    prefix = group.replace("/", ".")
    context = (
        nullcontext()
        if GlobalHydra.instance().is_initialized()  # inside an entry point: its search path
        else initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
    )
    with context:
        cfg = compose(option, overrides=[f"{prefix}.{o}" for o in overrides])
    return validate_config(OmegaConf.select(cfg, prefix), schema)
