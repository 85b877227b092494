"""Reading a checkpoint for inference (training writes them: seq2seq.training.checkpoint).

Checkpoints of earlier versions are read too: `upgrade_state_dict` renames their parameters and
`seq2seq.upgrade.upgrade_config` fills the config keys added since.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seq2seq.config import RootConfig
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.model_path import resolve_model
from seq2seq.errors import CheckpointError
from seq2seq.model.transformer import Transformer
from seq2seq.upgrade import load_config

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
    """A seq2seq checkpoint on the CPU, its parameters under today's names; a run directory
    stands for its final checkpoint (model_path.resolve_model)."""
    path = resolve_model(path)
    if path.is_dir():
        raise CheckpointError(
            f"{path} is a CTranslate2 export directory, and this needs the model itself: name "
            "the run directory it was exported from, or a checkpoint (.ckpt)"
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


def load_trained(path: Path) -> TrainedModel:
    """The model, tokenizer and training config of a checkpoint, ready for inference."""
    checkpoint = read_checkpoint(path)
    extra = checkpoint["seq2seq"]
    config = load_config(extra["config"])
    tokenizer = Tokenizer(extra["src_model"], extra["tgt_model"])
    model = Transformer.for_vocabulary(config.model, tokenizer)
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    model.load_state_dict(state)
    return TrainedModel(model.eval(), tokenizer, config)
