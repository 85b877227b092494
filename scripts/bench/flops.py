"""The two sides of the MFU: what the device can do (best square matmul) and what our
training step asks of it (FLOPs counted by torch)."""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.measure import synchronize
from bench.models import System
from seq2seq.data.batching import Batch


def matmul_peak(dtype: torch.dtype, n: int, device: torch.device, tries: int = 5) -> float:
    """Best GFLOP/s of an n x n x n matmul: what this device can do at all."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(tries):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def training_flops(system: System, batches: list[Batch]) -> int:
    """FLOPs of forward + backward over `batches` (matmuls and attention; the optimizer step
    is not counted)."""
    counter = FlopCounterMode(display=False)
    with counter:
        for batch in batches:
            system.loss(batch).backward()
    system.model.zero_grad(set_to_none=True)
    return counter.get_total_flops()
