"""Whole training epochs under each memory allocator: what tcmalloc buys a long run.

    python scripts/allocator_benchmark.py [--epochs 4] [--json FILE] [-- config overrides ...]
    python scripts/allocator_benchmark.py --epochs 4 -- \
        experiment=multi30k_cpu_1h_wu2021 paths.data_dir=../shared/data

One fresh process per allocator, in turn: the system's (SEQ2SEQ_ALLOCATOR=system), then
tcmalloc as seq2seq-train finds it (seq2seq.allocator), then jemalloc where installed. Each
trains `--epochs` whole epochs of the config's token-budget batches, in the order and shapes
seq2seq.train draws them, with its model, loss, AdamW and precision (no Lightning, no
validation), and reports per epoch the target tokens/s, the page faults and the peak resident
memory. The step benchmark (step_benchmark.py) repeats 35 batches; this one sees the slowdown
that only many batch shapes bring. Run it alone.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.arguments import parse_with_overrides

HERE = Path(__file__).resolve().parent


def measure(overrides: list[str], epochs: int) -> dict:
    """This process's epochs: tokens/s, minor page faults and peak resident memory of each."""
    import torch
    from bench.data import load_config
    from bench.models import build_ours
    from bench.training import train_step

    from seq2seq.allocator import allocator_in_use
    from seq2seq.concurrency import thread_budget
    from seq2seq.data.batching import TokenBudgetBatchSampler, collate
    from seq2seq.data.datamodule import prepare
    from seq2seq.training.precision import resolve_precision

    config = load_config(overrides)
    torch.set_num_threads(thread_budget(config.threads))
    torch.manual_seed(config.seed)
    prepared = prepare(config)
    train = prepared.splits[config.data.train_split]
    sampler = TokenBudgetBatchSampler(
        train.src_lens, train.tgt_lens, config.data.max_tokens, shuffle=True, seed=config.seed
    )
    system = build_ours(config, prepared.tokenizer, torch.device("cpu"))
    system.model.train()
    step = train_step(system, config)
    mixed = resolve_precision(config.trainer).precision == "bf16-mixed"
    rows = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        tokens, start = 0, time.perf_counter()
        for indices in sampler.batches():
            batch = collate([train[i] for i in indices])  # collated per step, as the loader does
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
                step(batch)
            tokens += batch.tgt_tokens
        seconds = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_SELF)
        rows.append(
            {
                "epoch": epoch,
                "seconds": round(seconds, 2),
                "tok_s": tokens / seconds,
                "minor_faults": usage.ru_minflt,
                "max_rss_mb": usage.ru_maxrss // 1024,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"allocator": allocator_in_use(), "mixed": mixed, "epochs": rows}


def allocators() -> dict[str, dict[str, str]]:
    """Name -> environment of the child: the system's, tcmalloc, and jemalloc where found."""
    from seq2seq.allocator import VARIABLE, find_tcmalloc

    chosen = {"system": {VARIABLE: "system"}}
    tcmalloc = find_tcmalloc()
    if tcmalloc is not None:
        chosen["tcmalloc"] = {VARIABLE: "system", "LD_PRELOAD": tcmalloc}
    jemalloc = ctypes.util.find_library("jemalloc")
    if jemalloc is not None:
        chosen["jemalloc"] = {VARIABLE: "system", "LD_PRELOAD": jemalloc}
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--only", nargs="*", help="allocators to run (default: all found)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args, overrides = parse_with_overrides(parser, argv)
    if args.child:
        print(json.dumps(measure(overrides, args.epochs)))
        return
    results = {}
    for name, variables in allocators().items():
        if args.only and name not in args.only:
            continue
        command = [sys.executable, __file__, "--child", "--epochs", str(args.epochs)]
        child = subprocess.run(
            [*command, "--", *overrides],
            env={**os.environ, "PYTHONPATH": str(HERE), **variables},
            stdout=subprocess.PIPE,
            text=True,
        )
        if child.returncode != 0:
            raise SystemExit(f"{name}: the child failed (its output is above)")
        results[name] = json.loads(child.stdout.strip().splitlines()[-1])
        rates = ", ".join(f"{row['tok_s']:,.0f}" for row in results[name]["epochs"])
        peak = results[name]["epochs"][-1]["max_rss_mb"]
        print(f"{name} ({results[name]['allocator']}): target tok/s per epoch {rates}; {peak} MB")
    if args.json:
        from bench.report import environment, write_json

        measured = environment("allocator_benchmark.py", argv)
        write_json(args.json, {"environment": measured, **results})


if __name__ == "__main__":
    main()
