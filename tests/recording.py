"""A LightningModule that learns nothing and records what the trainer feeds it: for tests of
the batches, epochs and validations the data module and Lightning produce together."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch


class RecordBatches(pl.LightningModule):
    """Records the pairs of every training batch by epoch, the batch count Lightning expects
    at each epoch's start, and the epochs validated."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[list[int]]] = {}
        self.expected: dict[int, int] = {}
        self.validated: list[int] = []

    def on_train_epoch_start(self) -> None:
        self.expected[self.current_epoch] = self.trainer.num_training_batches

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).append(batch.index.tolist())
        return (self.weight * batch.src.float().mean()).sum()

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.validated.append(self.current_epoch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def bare_trainer(root: Path, **options) -> pl.Trainer:
    """A CPU trainer with only its loops: no logger, checkpoints, progress bar or summary."""
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        default_root_dir=root,
        **options,
    )
