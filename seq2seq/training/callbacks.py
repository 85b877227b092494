"""Training callbacks: the learning-curve plot, the moving average of the weights, and stopping
cleanly on Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EMAWeightAveraging

from seq2seq.analysis.learning_curves import metrics_files, plot_learning_curve
from seq2seq.errors import Stopped

log = logging.getLogger(__name__)


class LearningCurve(pl.Callback):
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and (self.run_dir / "metrics.csv").exists():
            plot_learning_curve(metrics_files(self.run_dir), self.run_dir / "learning_curve.png")


class FlushMetricsWithCheckpoints(pl.Callback):
    """Write the loggers' buffered rows whenever a checkpoint is saved, so that after a crash
    the metrics reach at least as far as the checkpoint a resume starts from."""

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        for logger in trainer.loggers:
            logger.save()


class MovingAverage(EMAWeightAveraging):
    """Lightning's exponential moving average of the weights (`optim.ema_decay`), updated after
    every optimizer step, swapped in for validation, stored as the checkpoints' `state_dict`
    (the trained weights beside it, for resuming). Kept on the device the run trains on:
    Lightning's default is the module's device at `setup`, which is the CPU until the strategy
    moves the module to a GPU. Buffers are copied, not averaged: the model's one buffer is a
    constant (the sinusoid table)."""

    def __init__(self, decay: float) -> None:
        super().__init__(decay=decay, use_buffers=False)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._device = trainer.strategy.root_device
        super().setup(trainer, pl_module, stage)


class ValidateAtMaxSteps(pl.Callback):
    """A run stopped by `trainer.max_steps` ends as one stopped by `max_time` does: validated
    (in an epoch that validates, by trainer.check_val_every_n_epoch), checkpointed, then
    averaged and scored. Lightning ends an epoch at max_steps without validating (and
    EarlyStopping then finds no val/bleu); a stop requested through `should_stop`, as its
    Timer does for max_time, validates first where that epoch would have."""

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if 0 <= trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class GracefulStop(pl.Callback):
    """Ctrl-C or SIGTERM: finish the current step, write `checkpoint`, stop with a message that
    says how to resume. A second Ctrl-C interrupts at once."""

    def __init__(self, checkpoint: Path, resume_command: str) -> None:
        self.checkpoint, self.resume_command = checkpoint, resume_command
        self.received: str | None = None
        self.stop_message: str | None = None  # set once the checkpoint is written
        self._previous: dict[int, Any] = {}

    def _request(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        log.warning("%s received: stopping after this training step", self.received)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._request)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        # every process stops at the same step when any one of them was signalled
        if self.stop_message is not None or not trainer.strategy.reduce_boolean_decision(
            self.received is not None, all=False
        ):
            return
        trainer.save_checkpoint(self.checkpoint)  # where Lightning's mid-epoch checkpoints go
        self.stop_message = (
            f"stopped by {self.received or 'a signal to another process'} at step "
            f"{trainer.global_step} (epoch {trainer.current_epoch}); saved {self.checkpoint}. "
            f"Resume with:\n  {self.resume_command}"
        )

    def _stop(self, trainer: pl.Trainer) -> None:
        """Raise once the saved step's metrics are logged: Lightning logs them after
        on_train_batch_end, so the stop waits for the next hook."""
        if self.stop_message is None:
            return
        for logger in trainer.loggers:
            logger.save()
        self._restore()
        raise Stopped(self.stop_message)

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._stop(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
