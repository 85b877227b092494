"""Our training step in two checkouts, in turn: what a change to the step buys.

    python scripts/step_benchmark.py [--rounds 5] [--steps 40] [--json FILE] \
        NAME=CHECKOUT NAME=CHECKOUT [-- config overrides ...]
    python scripts/step_benchmark.py before=/tmp/base after=. -- \
        experiment=multi30k_cpu_1h_wu2021 paths.data_dir=../shared/data

Each round runs one fresh process per checkout (seq2seq imported from that checkout, the
harness from this one): the config as `seq2seq.train` composes it, the first training batches
of an epoch (scripts/bench), the model, loss and AdamW of `seq2seq.train` in the precision
`trainer.precision=auto` picks and under the memory allocator seq2seq-train starts under, 5
untimed steps, then `--steps` timed ones. Target tokens/s per round and checkout; the median of
each and of the per-round ratios to the first checkout.
Rounds alternate the checkouts because the machine may drift; still, run it alone.
`--extra NAME=OVERRIDE` (repeatable) adds a config override to one side only, so one checkout
under two names times what a setting costs the step, e.g.
`standard=. one_head=. --extra one_head=+ablation=cross_heads_1 -- experiment=...`.
`--weights CKPT` starts every process from a trained checkpoint of the same config (a step late
in a run rather than at initialisation). `--profile`: round 1 also runs the timed steps again
under torch.profiler and lists the operators with the most self CPU time (where the step
goes), the copies (casts and layout copies) by the operator that made them, and the matrix
products' share of the time and the GFLOP/s they ran at, beside the best GFLOP/s of one
2048 x 2048 x 2048 product in the step's dtype on the same threads (how near its bound the
step's arithmetic already runs, and how much of the step is something else).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench.arguments import parse_with_overrides

HERE = Path(__file__).resolve().parent
WARMUP = 5
MATRIX_PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
PEAK_SIZE = 2048


def top_operators(profile: torch.profiler.profile, count: int = 15) -> list[dict]:
    """The operators that took the most self CPU time, with their share of the total."""
    events = sorted(profile.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        {"operator": e.key, "share": e.self_cpu_time_total / total, "calls": e.count}
        for e in events[:count]
    ]


def matrix_products(profile: torch.profiler.profile) -> dict:
    """The matrix products' share of the self CPU time and their rate (the profiler's FLOP
    counts over their own time): needs `with_flops=True`."""
    events = profile.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    products = [e for e in events if e.key in MATRIX_PRODUCTS]
    microseconds = sum(e.self_cpu_time_total for e in products)
    flops = sum(e.flops for e in products)
    return {"share": microseconds / total, "gflop_s": flops / microseconds / 1e3, "flops": flops}


COPY = "aten::copy_"
COPY_WRAPPERS = {"aten::to", "aten::_to_copy", "aten::copy_", "aten::contiguous", "aten::clone"}


def copies_by_caller(profile: torch.profiler.profile, count: int = 12) -> list[dict]:
    """Where the step's copies (aten::copy_: casts and layout copies) come from: their self CPU
    time and calls grouped by the nearest enclosing operator that is not itself a copy or a
    cast (e.g. `aten::linear` for autocast's casts of its input, `ToCopyBackward0` for their
    backward), with the share of the whole step's self CPU time."""
    events = profile.events()
    total = sum(e.self_cpu_time_total for e in events)
    self_time: dict[str, float] = {}
    calls: dict[str, int] = {}
    for event in events:
        if event.name != COPY:
            continue
        caller = event.cpu_parent
        while caller is not None and caller.name in COPY_WRAPPERS:
            caller = caller.cpu_parent
        name = "(top level)" if caller is None else caller.name
        self_time[name] = self_time.get(name, 0.0) + event.self_cpu_time_total
        calls[name] = calls.get(name, 0) + 1
    ranked = sorted(self_time, key=self_time.get, reverse=True)[:count]
    return [{"caller": n, "share": self_time[n] / total, "calls": calls[n]} for n in ranked]


def measure(overrides: list[str], steps: int, profile: bool, weights: Path | None) -> dict:
    """One process's figure: target tokens/s over `steps` steps (seq2seq from sys.path)."""
    from bench.data import load_config, load_workload
    from bench.models import build_ours
    from bench.training import train_step

    from seq2seq.concurrency import thread_budget
    from seq2seq.training.precision import resolve_precision

    config = load_config(overrides)
    torch.set_num_threads(thread_budget(config.threads))
    torch.manual_seed(config.seed)
    device = torch.device("cpu")
    workload = load_workload(config, device, WARMUP + steps, 1)
    system = build_ours(config, workload.tokenizer, device)
    if weights is not None:  # a trained model, as late in a run: its activations differ
        from seq2seq.decoding.checkpoint import read_checkpoint

        system.model.load_state_dict(read_checkpoint(weights)["state_dict"])
    system.model.train()
    mixed = resolve_precision(config.trainer).precision == "bf16-mixed"
    train = train_step(system, config)  # the AdamW and clipping of seq2seq.train

    def step(batch) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            train(batch)

    for batch in workload.batches[:WARMUP]:
        step(batch)
    timed = workload.batches[WARMUP:]
    start = time.perf_counter()
    for batch in timed:
        step(batch)
    seconds = time.perf_counter() - start
    tokens = sum(batch.tgt_tokens for batch in timed)
    operators, products, peak, copies = [], None, None, []
    if profile:  # the same steps again, under torch.profiler (slower: not the timed figure)
        from bench.flops import matmul_peak

        with torch.profiler.profile(with_flops=True) as profiler:
            for batch in timed:
                step(batch)
        operators, products = top_operators(profiler), matrix_products(profiler)
        copies = copies_by_caller(profiler)
        dtype = torch.bfloat16 if mixed else torch.float32
        peak = matmul_peak(dtype, PEAK_SIZE, device)
    import seq2seq
    from seq2seq.allocator import allocator_in_use

    return {
        "tok_s": tokens / seconds,
        "operators": operators,
        "matrix_products": products,
        "copies_by_caller": copies,
        "matmul_peak_gflop_s": peak,
        "precision": "bf16-mixed" if mixed else "32-true",
        "allocator": allocator_in_use(),
        "code": str(Path(seq2seq.__file__).parent),
        "overrides": overrides,
    }


def child_environment(checkout: Path) -> dict[str, str]:
    """seq2seq from `checkout`, under the memory allocator that seq2seq-train starts itself
    under (tcmalloc where found, unless SEQ2SEQ_ALLOCATOR=system): the step the hour runs.
    Under glibc's malloc the fp32 step's matrix products ran at 41% of one large product's rate,
    under tcmalloc at 82% (docs/performance.md)."""
    from seq2seq.allocator import allocator_in_use, find_tcmalloc, restart_command

    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(checkout.resolve()), str(HERE)]),
    }
    restart = restart_command(environment, allocator_in_use(), find_tcmalloc(), [sys.executable])
    return environment if restart is None else restart[1]


def run_child(
    checkout: Path, overrides: list[str], steps: int, profile: bool, weights: Path | None
) -> dict:
    environment = child_environment(checkout)
    command = [sys.executable, __file__, "--child", "--steps", str(steps)]
    command += [*(["--profile"] if profile else [])]
    command += [*([f"--weights={weights.resolve()}"] if weights else []), "--", *overrides]
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{checkout}: the step failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", help="NAME=DIRECTORY, two of them")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile", action="store_true", help="also profile each checkout's steps in round 1"
    )
    parser.add_argument(
        "--weights", type=Path, help="start from this checkpoint's parameters (same config)"
    )
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME=OVERRIDE",
        help="a config override for that checkout only (repeatable)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args, overrides = parse_with_overrides(parser, argv)
    if args.child:
        print(json.dumps(measure(overrides, args.steps, args.profile, args.weights)))
        return
    named = dict(item.split("=", 1) for item in args.checkouts)
    if len(named) != 2:
        parser.error("give two checkouts, NAME=DIRECTORY NAME=DIRECTORY")
    extra: dict[str, list[str]] = {name: [] for name in named}
    for item in args.extra:
        name, _, override = item.partition("=")
        if name not in named or not override:
            parser.error(f"--extra {item}: give NAME=OVERRIDE with NAME one of {', '.join(named)}")
        extra[name].append(override)
    results: dict[str, list[dict]] = {name: [] for name in named}
    for round_ in range(args.rounds):
        for name, checkout in named.items():
            profile = args.profile and round_ == 0
            own = [*overrides, *extra[name]]
            result = run_child(Path(checkout), own, args.steps, profile, args.weights)
            results[name].append(result)
            print(f"round {round_ + 1} {name}: {results[name][-1]['tok_s']:,.0f} tok/s")
    first, second = named
    ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(results[first], results[second], strict=True)]
    summary = {
        name: statistics.median(r["tok_s"] for r in rounds) for name, rounds in results.items()
    }
    print(
        f"median target tok/s: {first} {summary[first]:,.0f}, {second} {summary[second]:,.0f}; "
        f"{second}/{first} per round: median {statistics.median(ratios):.3f} "
        f"({', '.join(f'{r:.3f}' for r in ratios)}); precision {results[first][0]['precision']}, "
        f"allocator {results[first][0]['allocator']}"
    )
    for name, rounds in results.items():
        for row in rounds[0]["operators"]:
            print(f"{name}: {row['share']:6.1%} {row['calls']:6d} calls  {row['operator']}")
        for row in rounds[0]["copies_by_caller"]:
            print(f"{name}: copies {row['share']:6.1%} {row['calls']:6d} calls  {row['caller']}")
        if products := rounds[0]["matrix_products"]:
            print(
                f"{name}: matrix products {products['share']:.1%} of the self CPU time at "
                f"{products['gflop_s']:,.1f} GFLOP/s; one {PEAK_SIZE}^3 product alone: "
                f"{rounds[0]['matmul_peak_gflop_s']:,.1f} GFLOP/s"
            )
    if args.json:
        from bench.report import environment, write_json

        write_json(
            args.json,
            {
                "environment": environment("step_benchmark.py", sys.argv[1:]),
                "checkouts": named,
                "rounds": results,
                "median_tok_s": summary,
                "ratios": ratios,
            },
        )


if __name__ == "__main__":
    main()
