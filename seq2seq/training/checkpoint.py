"""Writing checkpoints: atomically during training, and the average of the last ones after it
(Vaswani et al. 2017). Reading them is decoding's (seq2seq.decoding.checkpoint)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.plugins import TorchCheckpointIO

from seq2seq.decoding.checkpoint import read_checkpoint
from seq2seq.errors import CheckpointError
from seq2seq.io import atomic_path


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


def copy_checkpoint(source: Path, destination: Path) -> Path:
    """A copy of `source` under `destination`, which holds the previous file until the copy is
    whole (the run's final.ckpt: a resumed run keeps the earlier one until its own choice)."""
    with atomic_path(destination) as tmp:
        shutil.copyfile(source, tmp)
    return destination
