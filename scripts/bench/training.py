"""Training throughput: target tokens/s of forward + backward + clipping + AdamW step, with
the optimizer of `seq2seq.train` for every system, in each precision the device supports."""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.measure import Measured, interleaved
from bench.models import System
from seq2seq.config import RootConfig
from seq2seq.data.batching import Batch
from seq2seq.training.optim import adamw, clip_gradients, skip_update_if
from seq2seq.training.precision import BF16, auto_precision

Precisions = dict[str, torch.dtype | None]  # name -> autocast dtype (None: off)


def precisions(device: torch.device) -> Precisions:
    """fp32 and bf16 autocast on a CPU; bf16-mixed, what `trainer=gpu` trains in, on a GPU."""
    if device.type == "cuda":
        return {"bf16-mixed": torch.bfloat16}
    return {"fp32": None, "bf16 autocast": torch.bfloat16}


def timed_batches(
    batches: list[Batch], precisions: Precisions, device: torch.device, cpu_bf16_batches: int
) -> dict[str, list[Batch]]:
    """The batches of a pass per precision: fewer for bf16 on a CPU without bf16 units, where
    it runs 33x slower than fp32 (AMD EPYC; bf16 units: none, AVX2 only; docs/performance.md);
    `auto` would train in fp32 there."""
    slow_bf16 = device.type == "cpu" and auto_precision("cpu").precision != BF16
    return {
        precision: batches[:cpu_bf16_batches] if dtype is not None and slow_bf16 else batches
        for precision, dtype in precisions.items()
    }


def train_step(system: System, config: RootConfig) -> Callable[[Batch], None]:
    """A step as `seq2seq.train` takes it: AdamW (fused when `optim.fused`), clipping by the
    global norm, and a NaN/inf update skipped on the device."""
    optimizer = adamw(system.model, config.optim)
    clip = config.trainer.get("gradient_clip_val")
    parameters = list(system.model.parameters())

    def step(batch: Batch) -> None:
        system.loss(batch).backward()
        skip_update_if(optimizer, ~clip_gradients(parameters, clip).isfinite())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def training_pass(
    step: Callable[[Batch], None], batches: list[Batch], autocast: torch.dtype | None
) -> Callable[[], float]:
    """One repetition: a step on every batch; its work is the target tokens trained on."""
    device = batches[0].src.device

    def run() -> float:
        enabled = autocast is not None
        with torch.autocast(device.type, dtype=autocast, enabled=enabled):
            for batch in batches:
                step(batch)
        return float(sum(b.tgt_tokens for b in batches))

    return run


def time_training(
    systems: dict[str, System],
    timed: dict[str, list[Batch]],
    precisions: Precisions,
    config: RootConfig,
    reps: int,
    device: torch.device,
) -> dict[str, Measured]:
    """Every system in every precision, interleaved; keys are '<system> <precision>'."""
    for system in systems.values():
        system.model.train()
    passes = {
        f"{name} {precision}": training_pass(train_step(system, config), timed[precision], dtype)
        for precision, dtype in precisions.items()
        for name, system in systems.items()
    }
    return interleaved(passes, reps, device)
