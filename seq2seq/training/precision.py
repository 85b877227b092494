"""`trainer.precision=auto`: bf16 where the hardware has bf16 units, fp32 elsewhere.

Decided from torch's capability checks, never from a CPU's model name:
- a CUDA GPU with bf16 (`torch.cuda.is_bf16_supported()`): bf16-mixed;
- a CPU with AMX tiles: bf16-mixed (bf16 matmuls measured 9x fp32 on a Xeon with AMX);
- a CPU with avx512_bf16 and no AMX: bf16-mixed, because it measured faster there: our
  training step 2.5x fp32, a real `seq2seq.train` run 1.9-2.0x (docs/performance.md,
  "Precision: bf16 or fp32");
- anything else: 32-true (bf16 measured 33x slower than fp32 on an AVX2-only CPU).
An explicit value (`trainer.precision=32-true`, `bf16-mixed`, ...) is passed on unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AUTO = "auto"
BF16 = "bf16-mixed"
FP32 = "32-true"


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision Lightning trains in, and why: one line of the run's log."""

    precision: str
    reason: str

    def __str__(self) -> str:
        return f"trainer.precision={self.precision}: {self.reason}"


def trains_on_gpu(accelerator: str) -> bool:
    """Whether Lightning's `accelerator` puts this run on a CUDA GPU."""
    if accelerator in ("gpu", "cuda"):
        return True
    return accelerator == "auto" and torch.cuda.is_available()


def auto_precision(accelerator: str) -> PrecisionChoice:
    """What `auto` means on this machine for this accelerator."""
    if trains_on_gpu(accelerator):
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice(BF16, "auto: a CUDA GPU with bf16")
        return PrecisionChoice(FP32, "auto: a CUDA GPU without bf16")
    if torch.cpu._is_amx_tile_supported():
        return PrecisionChoice(BF16, "auto: a CPU with AMX (bf16 matrix units)")
    if torch.cpu._is_avx512_bf16_supported():
        return PrecisionChoice(
            BF16, "auto: a CPU with avx512_bf16 (no AMX), where our bf16 step measured faster"
        )
    return PrecisionChoice(FP32, "auto: a CPU without bf16 units, where bf16 is slower")


def resolve_precision(trainer: dict) -> PrecisionChoice:
    """The precision for Lightning's Trainer from the `trainer` config group."""
    precision = str(trainer["precision"])
    if precision != AUTO:
        return PrecisionChoice(precision, "set explicitly")
    return auto_precision(str(trainer["accelerator"]))
