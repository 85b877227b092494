"""Checkpoints: written atomically, read for inference, averaged (Vaswani et al. 2017).

Checkpoints of earlier versions are read too: `upgrade_state_dict` renames their parameters.
"""

from __future__ import annotations

import copy
import os
import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from pytorch_lightning.plugins import TorchCheckpointIO

from seq2seq.config import RootConfig, validate_config
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import CheckpointError
from seq2seq.io import atomic_path
from seq2seq.model.transformer import Transformer


class AtomicCheckpointIO(TorchCheckpointIO):
    """Every checkpoint goes to a temp file beside its final name, is synced to disk, then
    renamed: a kill at any moment leaves the previous file or the new one, never a truncated
    one. (Lightning's default stages the file in the system temp directory and moves it, which
    is a copy when that directory is on another filesystem.)"""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("storage_options are not supported for local checkpoints")
        with atomic_path(Path(path)) as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())


# (pattern, replacement) for parameter names of earlier versions, applied in order
_RENAMES = [
    # the encoder's self-attention became an AttentionSite, like the decoder's sites
    (
        r"(encoder_layers\.\d+\.self_attention)\.(query|key_value|output|energy)\b",
        r"\1.attention.\2",
    ),
    # MultiHeadAttention's projections say that they are projections
    (r"(_attention\.attention)\.(query|key_value|output)\.", r"\1.\2_projection."),
]


def upgrade_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameter names of earlier versions -> today's, in the same order (so that Adam's
    per-parameter state still matches on resume); today's names are kept as they are. Works
    with and without the LightningModule's "model." prefix."""
    upgraded = {}
    for name, value in state_dict.items():
        for pattern, replacement in _RENAMES:
            name = re.sub(pattern, replacement, name)
        upgraded[name] = value
    return upgraded


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A seq2seq checkpoint on the CPU, its parameters under today's names."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise CheckpointError(
            f"checkpoint {path} {what}: set ckpt_path to a .ckpt file, e.g. "
            "ckpt_path=outputs/<date>/<time>/checkpoints/best.ckpt"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        raise CheckpointError(
            f"cannot read checkpoint {path}: {str(e).splitlines()[0]}. The file is damaged or "
            "not a checkpoint; use another one (e.g. last.ckpt of the same run)."
        ) from None
    if not isinstance(checkpoint, dict) or "seq2seq" not in checkpoint:
        raise CheckpointError(f"{path} is not a seq2seq checkpoint (written by seq2seq.train)")
    checkpoint["state_dict"] = upgrade_state_dict(checkpoint["state_dict"])
    return checkpoint


@dataclass
class TrainedModel:
    model: Transformer
    tokenizer: Tokenizer
    config: RootConfig  # the training run's configuration


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


def upgrade_config(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved config in today's layout: keys added since it was written get the
    values that reproduce the run that wrote it, so that old checkpoints keep loading."""
    upgraded = {"logger": dict(TENSORBOARD), **saved}
    upgraded["decoding"] = {"nbest": 1, **saved.get("decoding", {})}
    upgraded["tokenizer"] = {"input_sentence_size": 0, "num_threads": 1, **saved["tokenizer"]}
    upgraded["data"] = {"encode_processes": 0, **saved["data"]}
    model = saved["model"]
    upgraded["model"] = {
        "block": copy.deepcopy(EVERY_SUBLAYER),
        **model,
        "attention": {"layers": [], **model["attention"]},
    }
    return upgraded


def load_trained(path: Path) -> TrainedModel:
    """The model, tokenizer and training config of a checkpoint, ready for inference."""
    checkpoint = read_checkpoint(path)
    extra = checkpoint["seq2seq"]
    config = validate_config(OmegaConf.create(upgrade_config(extra["config"])))
    tokenizer = Tokenizer(extra["src_model"], extra["tgt_model"])
    model = Transformer.for_vocabulary(config.model, tokenizer)
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    model.load_state_dict(state)
    return TrainedModel(model.eval(), tokenizer, config)


def average_checkpoints(paths: list[Path], output: Path) -> Path:
    """Write the parameter average of `paths` as an inference-only checkpoint."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        state = read_checkpoint(path)["state_dict"]
        for key, value in state.items():
            total[key] = total.get(key, 0) + value.double()
    last = read_checkpoint(paths[-1])
    averaged = {k: (v / len(paths)).to(last["state_dict"][k].dtype) for k, v in total.items()}
    keep = {k: last[k] for k in ("epoch", "global_step", "pytorch-lightning_version", "seq2seq")}
    keep["seq2seq"] = {**keep["seq2seq"], "averaged": [str(p) for p in paths]}
    with atomic_path(output) as tmp:
        torch.save({**keep, "state_dict": averaged}, tmp)
    return output
