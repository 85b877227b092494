"""Timing harness shared by the phases: interleaved repetitions, each with its peak memory.

The machine is shared and noisy, so systems take turns (ours, Marian, ours, ...) and every
repetition of one system has a repetition of the others under the same conditions beside it.
"""

from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer stops when the work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_memory(device: torch.device, record: list[int]) -> Iterator[None]:
    """Append the phase's peak: max allocated on a GPU, else resident set size (sampled)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield
        record.append(torch.cuda.max_memory_allocated(device))
        return
    peak, done = [resident_bytes()], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        record.append(max(peak[0], resident_bytes()))


@dataclass
class Measured:
    """One system's repetitions; `vars()` of it is its entry in the JSON."""

    seconds: list[float]
    work: float  # tokens or sentences per repetition
    memory: list[int]

    def rates(self) -> list[float]:
        return [self.work / s for s in self.seconds]

    def median(self) -> float:
        return statistics.median(self.rates())


@dataclass
class Isolated:
    """A phase whose system slows the others while it exists: CTranslate2's Translator keeps
    its own OpenMP threads, and ours decoded 25% slower beside a live one (AMD EPYC; bf16
    units: avx512_bf16; docs/performance.md). `build` makes the phase's run before each of its
    repetitions, outside the timing; the run is deleted after it."""

    build: Callable[[], Callable[[], float]]


Phase = Callable[[], float] | Isolated


def built(phase: Phase) -> Callable[[], float]:
    return phase.build() if isinstance(phase, Isolated) else phase


def release(phase: Phase) -> None:
    """After an Isolated phase's run is deleted: collect it now, not during the next phase."""
    if isinstance(phase, Isolated):
        gc.collect()


def interleaved(phases: dict[str, Phase], reps: int, device: torch.device) -> dict[str, Measured]:
    """Run each phase once to warm up, then `reps` rounds of all phases in turn. A phase
    returns its work (tokens or sentences), which the rates divide by the seconds."""
    results = {}
    for name, phase in phases.items():
        run = built(phase)
        results[name] = Measured([], run(), [])
        del run
        release(phase)
    for _ in range(reps):
        for name, phase in phases.items():
            run = built(phase)
            synchronize(device)
            with peak_memory(device, results[name].memory):
                start = time.perf_counter()
                run()
                synchronize(device)
                results[name].seconds.append(time.perf_counter() - start)
            del run
            release(phase)
    return results
