"""Dropout whose masks cost a quarter of torch's on a CPU.

torch's CPU dropout draws one random number per element (`bernoulli_`): at the 4,096-token
batches of the d_model 128 model (experiment=multi30k_cpu_1h_wu2021) that was 20.8% of a bf16
training step (torch.profiler, docs/performance.md). Here one 64-bit draw gives four 16-bit
lanes, each kept when it is at least round(p * 2**16) above the lowest: the drop probability
is p to within 2**-17. The masks still come from torch's generator, so the per-step seeding of
training/module.py keeps resumed runs exact. A mask is applied through its bytes (uint8):
torch converts a bool mask to the activations' dtype one element at a time, and that took
most of applying it on a CPU (docs/performance.md). Elsewhere (CUDA) torch's fused kernel is
fast and is used as it is.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LANES = 4  # 16-bit lanes per 64-bit draw


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> Tensor:
    """Bool mask, True with probability 1 - p (to within 2**-17) per element."""
    count = shape.numel()
    words = torch.randint(
        -(2**63), 2**63 - 1, ((count + LANES - 1) // LANES,), dtype=torch.int64, device=device
    )
    lanes = words.view(torch.int16)[:count].view(shape)  # uniform over -2**15 .. 2**15 - 1
    threshold = round(p * 2**16) - 2**15
    if threshold >= 2**15:  # p within 2**-17 of 1: no lane reaches it (in 16 bits it would wrap)
        return torch.zeros(shape, dtype=torch.bool, device=device)
    return lanes >= threshold


class _PackedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float) -> Tensor:
        keep = keep_mask(x.shape, p, x.device).view(torch.uint8)  # 0 or 1, converted in bulk
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        # x * keep * scale: the op that is dropout's own backward
        return torch.ops.aten.native_dropout_backward(x, keep, ctx.scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (keep,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, keep, ctx.scale), None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout(x, p, training), with packed masks on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0:
        return F.dropout(x, p, training)
    return _PackedDropout.apply(x, p)


class Dropout(nn.Module):
    """nn.Dropout with `dropout`'s masks; no parameters, so state dicts are unchanged."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
