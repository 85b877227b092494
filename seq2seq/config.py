"""Typed schema of what `train` reads (RootConfig, carried by every checkpoint) with the checks
across its config groups, and how a command's composed config is checked (`validate_config`).

Hydra composes the YAML files in seq2seq/conf/; `validate_config` merges the result into a
schema so that an unknown key, a value of the wrong type or a value that cannot work fails at
start-up with a message naming the key, rather than deep inside a run. Each group's schema lives
beside the code it configures (seq2seq/<package>/config.py), each command's beside the command.
"""

from __future__ import annotations

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

from seq2seq.data.config import DataConfig, PathsConfig, TokenizerConfig
from seq2seq.decoding.config import DecodingConfig
from seq2seq.errors import ConfigError, require
from seq2seq.model.config import ModelConfig
from seq2seq.training.config import OptimConfig, check_cuda_graphs

# The YAML files are the only home of default values: the schemas' dataclasses declare keys,
# types and checks, and have no defaults of their own. They ship inside the package (package
# data), so an editable and a regular install find them alike.
CONF_DIR = Path(__file__).resolve().parent / "conf"

# ${seq2seq.pid:} in conf/train.yaml: default run directories unique among live processes
OmegaConf.register_new_resolver("seq2seq.pid", os.getpid, replace=True)


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
    early_stopping_patience: int | None  # validations without a better BLEU (None: off)
    evaluate_after: bool  # score the test sets with the final model after training
    compile: bool  # torch.compile the encoder and decoder layers for training
    cuda_graphs: int  # training forward/backward as CUDA graphs, at most this many shapes (0: off)
    checkpoint_every_n_steps: int  # also refresh last.ckpt every n optimizer steps (0: off)
    on_nonfinite: str  # a step whose loss or gradients are NaN/inf: skip | stop
    logger: dict[str, Any] | None  # a Lightning logger (_target_ + arguments) besides metrics.csv
    threads: int | None  # torch threads and encoding processes of one run (None: the launcher's)
    derive_from_corpus: bool  # settings derived from the training split (seq2seq.training.recipe)
    derive_rule: int  # which rule derives them (seq2seq.training.corpus_rules.RULES)

    @property
    def has_budget(self) -> bool:
        """Whether training has a budget to spend (trainer.max_steps or max_time) for a
        schedule measured in it."""
        return (self.trainer.get("max_steps") or -1) > 0 or self.trainer.get("max_time") is not None

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
        require(
            self.early_stopping_patience is None or self.early_stopping_patience >= 1,
            "early_stopping_patience",
            f"must be >= 1, or null for no early stopping; got {self.early_stopping_patience}",
        )
        require(
            self.checkpoint_every_n_steps >= 0,
            "checkpoint_every_n_steps",
            f"must be >= 0, got {self.checkpoint_every_n_steps}",
        )
        require(self.cuda_graphs >= 0, "cuda_graphs", f"must be >= 0, got {self.cuda_graphs}")
        if self.cuda_graphs:
            check_cuda_graphs(self.cuda_graphs, self.trainer, self.compile)
        require(
            self.on_nonfinite in ("skip", "stop"),
            "on_nonfinite",
            f"'{self.on_nonfinite}': use skip or stop",
        )
        require(
            self.optim.decay != "linear" or self.has_budget,
            "optim.decay",
            "linear decays to 0 at the end of the training budget, and this run has none: set "
            "trainer.max_steps or trainer.max_time, or use optim.decay=inverse_sqrt",
        )
        require(
            self.optim.warmup_ratio == 0 or self.has_budget,
            "optim.warmup_ratio",
            f"{self.optim.warmup_ratio} is a share of the training budget, and this run has "
            "none: set trainer.max_steps or trainer.max_time, or optim.warmup_steps with "
            "optim.warmup_ratio=0",
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
        tag = int(self.data.multilingual)  # a multilingual source leads with a tag
        require(
            self.data.filter.max_len + tag < self.model.max_len,
            "data.filter.max_len",
            f"training pairs of up to {self.data.filter.max_len} tokens plus BOS/EOS"
            + (" and the tag" if tag else "")
            + f" do not fit the model's model.max_len={self.model.max_len} positions; lower the "
            "filter or raise model.max_len",
        )
        if self.data.multilingual:
            require(
                self.tokenizer.joint,
                "tokenizer.joint",
                "false in a multilingual run, which needs one vocabulary for all its languages "
                "(a language may be a source in one direction and a target in another); set "
                "tokenizer.joint=true",
            )


def _open_node() -> DictConfig:
    node = OmegaConf.create({})
    OmegaConf.set_struct(node, False)
    return node


# conf/evaluate.yaml's `data`: Hydra closes every node composed from YAML, so that a key not in
# the file needs `+` on the command line; this open node takes `data.dir=...` as it is. The keys
# are checked against DataConfig once merged over the checkpoint's data config.
ConfigStore.instance().store(name="open_node", node=_open_node())


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
