"""A LightningModule that learns nothing and records what the trainer feeds it: for tests of
the batches, epochs and validations the data module and Lightning produce together."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch

from seq2seq.training.run import trainer_arguments


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

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and dataloader_idx == 0:
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


def fit_recording(module: pl.LightningDataModule, root: Path, epochs: int) -> RecordBatches:
    """Fit RecordBatches for `epochs` epochs on `module`, with the loader reloads that train
    sets for its config; checks that every epoch validated and served the batches Lightning
    counted for it (none cut short or run past)."""
    model = RecordBatches()
    reload = trainer_arguments(module.config).get("reload_dataloaders_every_n_epochs", 0)
    trainer = bare_trainer(
        root, max_epochs=epochs, num_sanity_val_steps=0, reload_dataloaders_every_n_epochs=reload
    )
    trainer.fit(model, datamodule=module)
    assert model.validated == list(range(epochs))
    assert {epoch: len(batches) for epoch, batches in model.seen.items()} == model.expected
    return model
