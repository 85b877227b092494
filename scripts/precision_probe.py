"""Which precision and attention kernel train fastest on this CPU: the figures behind
`trainer.precision=auto` and the per-dtype SDPA kernel choice (seq2seq/model/attention.py).

    python scripts/precision_probe.py [--batches N] [--reps N] [config overrides ...]
    python scripts/precision_probe.py paths.data_dir=../shared/data experiment=multi30k_cpu_1h

- Matmul GFLOP/s at the training shape (tokens x d_model @ d_model x ffn_dim) in fp32 and bf16.
- Our training step (scripts/bench's batches, model, optimizer and timed step) in fp32 and bf16
  autocast, each with SDPA's kernels as torch picks them ("torch": flash attention on a CPU)
  and with the math kernel ("math"), with and without dropout. The model's own kernel rule is
  off for these rows. Rows are interleaved; the table gives each row's median and best
  tok/s (the best is the least disturbed on a shared machine) and its ratio to
  "fp32 torch dropout", median and per round.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch
from bench.data import load_config, load_workload
from bench.measure import Measured, interleaved
from bench.models import build_ours
from bench.training import train_step, training_pass
from torch.nn.attention import SDPBackend, sdpa_kernel

from seq2seq.model import attention

MATMUL_ROWS = 3840  # tokens of a 4,096-token batch, padded: the training shape
NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0"]


@contextlib.contextmanager
def kernels(name: str) -> Iterator[None]:
    """torch: SDPA's own choice; math: the math kernel only (the model's rule off for both)."""
    forced = sdpa_kernel(SDPBackend.MATH) if name == "math" else contextlib.nullcontext()
    with forced, attention.preferred_kernels_off():
        yield


def matmul_gflops(dtype: torch.dtype, m: int, k: int, n: int, tries: int = 20) -> float:
    """Best GFLOP/s of (m x k) @ (k x n): the training step's largest matmul shape."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def probe_pass(run: Callable[[], float], kernel: str) -> Callable[[], float]:
    """A timed pass of bench.training under this kernel choice."""

    def timed() -> float:
        with kernels(kernel):
            return run()

    return timed


def training_rows(overrides: list[str], batches: int, reps: int) -> tuple[dict[str, Measured], int]:
    """Every precision x kernel x dropout row, interleaved; and the target tokens of a pass."""
    device = torch.device("cpu")
    rows: dict[str, Callable[[], float]] = {}
    tokens = 0
    for dropout, extra in (("dropout", []), ("no dropout", NO_DROPOUT)):
        config = load_config([*overrides, *extra])
        torch.manual_seed(config.seed)
        work = load_workload(config, device, batches, sentences=1)
        tokens = sum(b.tgt_tokens for b in work.batches)
        for precision, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
            for kernel in ("torch", "math"):
                system = build_ours(config, work.tokenizer, device)
                system.model.train()
                step = train_step(system, config)
                rows[f"{precision} {kernel} {dropout}"] = probe_pass(
                    training_pass(step, work.batches, dtype), kernel
                )
    return interleaved(rows, reps, device), tokens


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=7, help="real training batches per pass")
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for seq2seq.train")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    config = load_config(args.overrides)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"capability {torch.backends.cpu.get_cpu_capability()}, "
        f"avx512_bf16 {torch.cpu._is_avx512_bf16_supported()}, "
        f"amx {torch.cpu._is_amx_tile_supported()}, load {os.getloadavg()}"
    )
    m, k, n = MATMUL_ROWS, config.model.d_model, config.model.ffn_dim
    for dtype in (torch.float32, torch.bfloat16):
        print(f"matmul {m}x{k} @ {k}x{n} {dtype}: {matmul_gflops(dtype, m, k, n):.0f} GFLOP/s")
    measured, tokens = training_rows(args.overrides, args.batches, args.reps)
    base = measured["fp32 torch dropout"]
    print(
        f"\ntraining step, {args.batches} batches ({tokens} target tokens) per pass, "
        f"{args.reps} rounds"
    )
    print(f"{'row':<26}{'median':>8}{'best':>8}{'x fp32':>8}  x fp32 per round")
    for name, row in measured.items():
        ratios = [r / b for r, b in zip(row.rates(), base.rates(), strict=True)]
        per_round = " ".join(f"{r:.2f}" for r in ratios)
        best = max(row.rates())
        print(
            f"{name:<26}{row.median():>8.0f}{best:>8.0f}"
            f"{statistics.median(ratios):>8.2f}  {per_round}"
        )
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
