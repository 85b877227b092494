"""Configs saved by earlier versions (in checkpoints, export directories and runs' config.yaml)
in today's layout, so that they keep loading as keys are added: each key added since gets the
value that reproduces the run that saved it, which is not always today's default. Read a saved
config with `load_config`.
"""

from __future__ import annotations

import copy
from typing import Any

from omegaconf import OmegaConf

from seq2seq.config import RootConfig, validate_config

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
    "target_lang": None,
}


def upgrade_config(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved config in today's layout: keys added since it was written get the
    values that reproduce the run that wrote it, so that old checkpoints keep loading."""
    upgraded = {
        "logger": dict(TENSORBOARD),
        "threads": None,
        "cuda_graphs": 0,
        "prefer_checkpoint": "averaged",
        "derive_from_corpus": False,
        "derive_rule": 1,
        **saved,
    }
    upgraded["decoding"] = {**DECODING_BEFORE_SAMPLING, **saved.get("decoding", {})}
    upgraded["tokenizer"] = {"input_sentence_size": 0, "num_threads": 1, **saved["tokenizer"]}
    upgraded["data"] = {
        "encode_processes": 0,
        "min_train_pairs": 1,
        "on_malformed": "error",
        "bpe_dropout": 0.0,
        "pad_to_multiple": 1,
        "bidirectional_epochs": 0,
        "val_subset": 0,
        "directions": [],
        "corpora": {},
        "mix_temperature": 1.0,
        **saved["data"],
    }
    upgraded["optim"] = {
        "decay": "inverse_sqrt",
        "warmup_ratio": 0.0,
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
