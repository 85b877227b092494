"""The Transformer as a LightningModule: loss, optimizer, schedule, validation BLEU."""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Timer
from torch import Tensor

from seq2seq.config import RootConfig, config_to_dict
from seq2seq.data.batching import Batch
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.checkpoint import upgrade_state_dict
from seq2seq.decoding.search import greedy_search, max_output_len
from seq2seq.errors import CheckpointError, TrainingError, require
from seq2seq.metrics import bleu
from seq2seq.model.transformer import Transformer
from seq2seq.training.cuda_graphs import GraphedLoss
from seq2seq.training.optim import (
    WarmupEnd,
    adamw,
    clip_gradients,
    learning_rate_factor,
    skip_update_if,
)

log = logging.getLogger(__name__)


def seed_generators(seed: int, device: torch.device) -> None:
    """Seed the generators a training step on `device` draws from: the CPU's, and the
    accelerator's (CUDA: every device's, as torch.manual_seed does). The same streams as
    torch.manual_seed(seed) without its cost per update: for each backend that is not started
    (XPU, MTIA; CUDA on a CPU) it queues the seeding with the caller's formatted stack, and
    inside Lightning's loop that stack is deep (docs/performance.md)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    elif device.type != "cpu":
        torch.get_device_module(device).manual_seed(seed)


class TranslationModule(pl.LightningModule):
    def __init__(self, config: RootConfig, tokenizer: Tokenizer) -> None:
        super().__init__()
        self.config, self.tokenizer = config, tokenizer
        self.model = Transformer.for_vocabulary(config.model, tokenizer)
        self._hypotheses: dict[int, dict[int, str]] = {}  # validation set -> pair -> output
        self._last_step_end: float | None = None
        self._epoch_tokens, self._epoch_seconds = 0, 0.0  # timed steps of this epoch
        self._nonfinite: list[tuple[int, Tensor]] = []  # (step, NaN/inf?) not yet read
        self._skipped: list[int] = []  # updates skipped for NaN/inf (on_nonfinite=skip)
        self.validation_seconds = 0.0  # inside the training clock: the cost of validating
        self._validation_start = 0.0
        self._graphed: GraphedLoss | None = None  # the training loss through CUDA graphs
        self._warmup_end = WarmupEnd()  # where a warmup of optim.warmup_ratio ended
        # what every checkpoint stores of the config, converted once: the conversion through
        # OmegaConf took longer than the rest of a checkpoint's contents (docs/performance.md)
        self._config_dict = config_to_dict(config)

    @property
    def r_drop(self) -> float | None:
        """R-Drop's alpha for training steps (optim.r_drop), None when off."""
        return self.config.optim.r_drop or None

    def loss(self, batch: Batch) -> tuple[Tensor, int]:
        """Label-smoothed cross-entropy per target token (with R-Drop's penalty in training
        when optim.r_drop is set); padding ignored."""
        loss = self.model.loss(
            batch.src,
            batch.tgt_in,
            batch.tgt_out,
            self.config.optim.label_smoothing,
            r_drop=self.r_drop if self.training else None,  # validation: one pass
        )
        tokens = batch.tgt_tokens
        return loss / tokens, tokens

    def on_fit_start(self) -> None:
        if self.config.cuda_graphs:
            require(
                self.device.type == "cuda",
                "cuda_graphs",
                f"{self.config.cuda_graphs}, and this run trains on {self.device.type}; CUDA "
                "graphs need a CUDA GPU (trainer=gpu), so set cuda_graphs=0 here",
            )
            self._graphed = GraphedLoss(
                self.model, self.config.optim.label_smoothing, self.r_drop, self.config.cuda_graphs
            )

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        self.seed_step(batch_idx)

    def seed_step(self, batch_idx: int) -> None:
        """Dropout masks drawn from (seed, epoch, batch, rank), as fairseq seeds per update: a
        resumed run draws the masks the uninterrupted run would have drawn."""
        entropy = [self.config.seed, self.current_epoch, batch_idx, self.global_rank]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
        seed_generators(seed, self.device)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        if self._graphed is not None:
            tokens = batch.tgt_tokens
            loss = self._graphed(batch, lambda: self.seed_step(batch_idx)) / tokens
        else:
            loss, tokens = self.loss(batch)
        now = time.perf_counter()
        if self._last_step_end is not None:  # wall time per step, data loading included
            seconds = now - self._last_step_end
            self._epoch_tokens += tokens
            self._epoch_seconds += seconds
        if self.logging_step():
            # on the host: Lightning reads every logged value at every later step's end (the
            # progress bar), and a value on a GPU would make each of those reads wait for it
            self.log("train/loss", loss.detach().cpu(), prog_bar=True, batch_size=tokens)
            if self._last_step_end is not None:
                self.log("train/tok_s", torch.tensor(tokens / seconds), prog_bar=True)
        self._last_step_end = now
        return loss

    def logging_step(self) -> bool:
        """Whether Lightning writes the loggers after this step (its own rule: every
        trainer.log_every_n_steps updates), or the step ends the epoch (the summary's training
        loss). Logging only then reads the loss on the host once per such step, not per step."""
        epoch_loop = self.trainer.fit_loop.epoch_loop
        return self.trainer._logger_connector.should_update_logs or (
            epoch_loop.batch_progress.is_last_batch
        )

    def on_train_epoch_start(self) -> None:
        self._last_step_end = None  # the validation pause is not training time
        self._epoch_tokens, self._epoch_seconds = 0, 0.0

    def validation_names(self) -> list[str]:
        """Each validation set's name in the logs: a multilingual run's directions ("en-de"),
        or "" for the one set of a one-direction run."""
        data = self.trainer.datamodule
        if not data.multilingual:
            return [""]
        return [data.prepared.direction[key].name for key in data.validation_keys()]

    def validation_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss, tokens = self.loss(batch)
        name = self.validation_names()[dataloader_idx]
        self.log(
            f"val/loss/{name}" if name else "val/loss",
            loss,
            prog_bar=not name,
            batch_size=tokens,
            sync_dist=True,
            add_dataloader_idx=False,
        )
        decoding = self.config.decoding
        max_len = max_output_len(
            batch.src,
            decoding.max_len_a,
            decoding.max_len_b,
            self.config.model.max_len,
            self.model.pad_id,
        )
        outputs = greedy_search(self.model, batch.src, max_len)
        texts = self.tokenizer.decode_tgt([best.tokens for (best,) in outputs])
        outputs_of_set = self._hypotheses.setdefault(dataloader_idx, {})
        for index, text in zip(batch.index.tolist(), texts, strict=True):
            outputs_of_set[index] = text

    def on_validation_epoch_start(self) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_epoch_end(self) -> None:
        hypotheses, self._hypotheses = self._hypotheses, {}
        if self.trainer.sanity_checking:
            return
        decoded = {number: len(outputs) for number, outputs in hypotheses.items()}
        if self.trainer.world_size > 1:  # each process decoded its share of the batches
            shares: list[dict[int, dict[int, str]] | None] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(shares, hypotheses)
            hypotheses = {}
            for share in shares:
                for number, outputs in (share or {}).items():
                    hypotheses.setdefault(number, {}).update(outputs)
        data, scores = self.trainer.datamodule, []
        names = self.validation_names()
        for number, (key, name) in enumerate(zip(data.validation_keys(), names, strict=True)):
            outputs, references = hypotheses.get(number, {}), data.references(key)
            order = sorted(outputs)
            score = bleu([outputs[i] for i in order], [references[i] for i in order])
            log.info(
                "validation BLEU (greedy) %s%.4f on %d of %d sentences (%d decoded by this "
                "process)",
                f"{name} " if name else "",
                score,
                len(order),
                len(references),
                decoded.get(number, 0),
            )
            if name:  # every process scored the whole set alike: "max" keeps it exact
                self.log(f"val/bleu/{name}", score, sync_dist=True, reduce_fx="max")
            scores.append(score)
        score = sum(scores) / len(scores)  # a multilingual run's checkpoints: the mean
        if len(scores) > 1:
            log.info("validation BLEU (greedy), mean of %d directions: %.4f", len(scores), score)
        self.log("val/bleu", score, prog_bar=True, sync_dist=True, reduce_fx="max")
        seconds = time.perf_counter() - self._validation_start
        self.validation_seconds += seconds
        log.info("validation took %.1f s (%.0f s in all)", seconds, self.validation_seconds)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip by the global norm, and skip an update whose loss or gradients hold NaN/inf (no
        parameter or Adam moment changes), or stop, as `on_nonfinite` says. The norm decides,
        and a fused AdamW skips on the device, so no step waits for the host (the GPU's rate);
        gradients are already all-reduced here, so every process decides alike. The norm before
        clipping is logged as train/grad_norm at the loggers' steps, beside the loss."""
        parameters = list(self.parameters())  # those without gradients: left out by the clippers
        if str(self.trainer.precision).startswith("16"):
            # float16's gradient scaler has unscaled the gradients; it skips NaN/inf steps and
            # lowers its scale itself
            if self.logging_step():
                self.log_gradient_norm(clip_gradients(parameters, None))
            super().configure_gradient_clipping(
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
            return
        by_value = gradient_clip_algorithm == "value"
        norm = clip_gradients(parameters, None if by_value else gradient_clip_val)
        if self.logging_step():
            self.log_gradient_norm(norm)
        if by_value and gradient_clip_val:
            torch.nn.utils.clip_grad_value_(parameters, gradient_clip_val)
        nonfinite = ~norm.isfinite()
        step = self.global_step + 1
        if self.config.on_nonfinite == "stop":
            if nonfinite:  # a host read: stopping is the host's decision
                raise TrainingError(
                    f"step {step}: the loss or gradients are NaN or inf; lower optim.lr, raise "
                    "optim.warmup_steps or use trainer.precision=32-true, or set "
                    "on_nonfinite=skip to skip such steps"
                )
        elif not skip_update_if(optimizer, nonfinite) and nonfinite:
            optimizer.zero_grad(set_to_none=True)  # AdamW leaves parameters without gradients
        self._nonfinite.append((step, nonfinite))

    def log_gradient_norm(self, norm: Tensor) -> None:
        """On the host, as the loss: read where the loggers write, not at every step."""
        self.log("train/grad_norm", norm.detach().cpu())

    def skipped_steps(self) -> list[int]:
        """The updates skipped for NaN/inf so far (on_nonfinite=skip), read from the device
        once per epoch rather than once per step; each is logged as it is read."""
        if self._nonfinite:
            pending, self._nonfinite = self._nonfinite, []
            flags = torch.stack([flag for _, flag in pending]).tolist()
            for (step, _), skipped in zip(pending, flags, strict=True):
                if skipped:
                    log.warning("step %d: NaN/inf loss or gradients, update skipped", step)
                    self._skipped.append(step)
        return self._skipped

    def on_train_epoch_end(self) -> None:
        self.skipped_steps()  # the epoch's skipped updates, logged
        if self._epoch_seconds > 0:  # the epoch's rate: steady where one step's is not
            rate = self._epoch_tokens / self._epoch_seconds
            self.log("train/epoch_tok_s", rate)
            log.info("epoch %d: %s target tokens/s in training", self.current_epoch, f"{rate:,.0f}")

    def configure_optimizers(self) -> dict[str, Any]:
        optim = self.config.optim
        scaled = str(self.trainer.precision).startswith("16")
        optimizer = adamw(self, optim, scaled_gradients=scaled)
        factor = learning_rate_factor(optim, self.spent_budget, self._warmup_end)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def spent_budget(self, step: int) -> float:
        """The fraction of the training budget spent before update `step`: of trainer.max_steps,
        or of trainer.max_time as Lightning's Timer counts it (restored on resume), whichever
        is nearer its end. Time is the budget that holds on any machine."""
        spent = 0.0
        if self.trainer.max_steps > 0:
            spent = (step - 1) / self.trainer.max_steps
        for timer in self.trainer.callbacks:
            if isinstance(timer, Timer) and timer.time_remaining() is not None:
                elapsed = timer.time_elapsed()
                spent = max(spent, elapsed / (elapsed + timer.time_remaining()))
        return spent

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        names, parameters = zip(*self.named_parameters(), strict=True)
        finite = torch.stack([torch.isfinite(p).all() for p in parameters]).tolist()  # one read
        for name, ok in zip(names, finite, strict=True):
            if not ok:
                raise TrainingError(
                    f"step {self.global_step}: parameter {name} holds NaN or inf; no checkpoint "
                    "written. Resume from the last good one with ckpt_path=...last.ckpt and a "
                    "lower optim.lr"
                )
        # everything needed to translate with this checkpoint alone
        checkpoint["seq2seq"] = {
            "config": copy.deepcopy(self._config_dict),
            "src_model": self.tokenizer.src_model,
            "tgt_model": self.tokenizer.tgt_model,
            "warmup_end": self._warmup_end.step,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Resuming (Lightning loads the state dict after this): earlier versions' names, and
        where a warmup of optim.warmup_ratio ended (None before it ends, in a run of
        optim.warmup_steps, and in checkpoints from before the ratio existed). A checkpoint of a
        run with a moving average holds the average as its state dict and the trained weights
        beside it, which only a run keeping the average resumes from."""
        checkpoint["state_dict"] = upgrade_state_dict(checkpoint["state_dict"])
        self._warmup_end.step = checkpoint["seq2seq"].get("warmup_end")
        if "current_model_state" in checkpoint and not self.config.optim.ema_decay:
            saved = checkpoint["seq2seq"]["config"]["optim"]["ema_decay"]
            raise CheckpointError(
                f"cannot resume from {self.trainer.ckpt_path}: it was trained with "
                f"optim.ema_decay={saved} (its weights are the moving average), and this run has "
                f"optim.ema_decay=0; resume with optim.ema_decay={saved}"
            )
