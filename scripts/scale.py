"""Prepare's time and memory on corpora of 0.3M to 2M pairs, and a data-parallel run's memory.

The corpora are Multi30k's training split repeated, each copy's lines made distinct by a word
numbering the copy (so no cache of repeated lines helps), with Multi30k's val and test sets.
Every measurement is a fresh process with a fresh cache, timed from start to exit; memory is
the peak resident set of its largest process (`ru_maxrss`, what `/usr/bin/time -v` reports) and
the peak proportional set size summed over its process tree (pool workers and data-parallel
processes included; shared pages are split between the processes that map them), sampled
every 0.1 s from /proc.

    python scripts/scale.py --work /tmp/scale --json docs/bench/scale.json
    python scripts/scale.py --source /tmp/old-checkout ...  # the same for another version
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def build_corpus(pairs: int, multi30k: Path, directory: Path) -> Path:
    """`pairs` training pairs: Multi30k's en-de training split repeated, copy c ending in "c<c>"."""
    if (directory / "train.tgt").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    sides = {}
    for side, lang in (("src", "en"), ("tgt", "de")):
        sides[side] = gzip.decompress((multi30k / f"train.{lang}.gz").read_bytes()).splitlines()
    for side, lines in sides.items():
        tmp = directory / f".train.{side}.part"
        with open(tmp, "wb") as f:
            written, copy = 0, 0
            while written < pairs:
                block = lines[: pairs - written]
                suffix = f" c{copy}\n".encode()
                f.write(b"".join(line + suffix for line in block))
                written, copy = written + len(block), copy + 1
        tmp.rename(directory / f"train.{side}")
    for split in ("val", "test_2016_flickr"):
        for side, lang in (("src", "en"), ("tgt", "de")):
            text = gzip.decompress((multi30k / f"{split}.{lang}.gz").read_bytes())
            (directory / f"{split}.{side}").write_bytes(text)
    return directory


def data_overrides(corpus: Path, cache: Path) -> list[str]:
    files = [
        f"data.splits.{split}.{side}={name}.{side}"
        for split, name in (("train", "train"), ("val", "val"), ("test", "test_2016_flickr"))
        for side in ("src", "tgt")
    ]
    return ["data=parallel_files", f"data.dir={corpus}", f"paths.cache_dir={cache}", *files]


def tree_pss_kb(root: int) -> int:
    """Summed Pss of `root` and its descendants, from /proc (0 for processes already gone)."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            total += int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1))
            for task in Path(f"/proc/{pid}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, AttributeError):
            continue
    return total


def measure(command: list[str], source: Path, log: Path) -> dict:
    """Run `command` in `source` to completion; its wall time, exit code and memory peaks, and
    the memory timeline (wall clock, summed Pss in kB) for `tokenizer_phase`."""
    start = time.perf_counter()
    timeline: list[tuple[float, int]] = []
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=source, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                timeline.append((time.time(), tree_pss_kb(process.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        done.set()
        sampler.join()
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "exit_code": os.waitstatus_to_exitcode(status),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "peak_tree_pss_mb": round(max((kb for _, kb in timeline), default=0) / 1024),
        "log": str(log),
        "timeline": timeline,
    }


def tokenizer_phase(row: dict) -> dict:
    """The tokenizer's training time, from the log line that ends it (which carries its time
    stamp), and the peak summed Pss sampled while it ran."""
    found = re.search(
        r"\[([\d-]+ [\d:,]+)\]\[.*\] - trained tokenizer \(.*\) in ([\d.]+)s",
        Path(row["log"]).read_text(),
    )
    if not found:
        return {"tokenizer_seconds": None, "tokenizer_peak_tree_pss_mb": None}
    end = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    seconds = float(found.group(2))
    during = [kb for t, kb in row["timeline"] if end - seconds <= t <= end]
    return {
        "tokenizer_seconds": seconds,
        "tokenizer_peak_tree_pss_mb": round(max(during, default=0) / 1024),
    }


def machine() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s+(.*)", lscpu)
    flags = re.search(r"Flags:\s+(.*)", lscpu)
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if flags and f in flags.group(1).split()]
    return (
        f"{model.group(1) if model else platform.processor()}; bf16 units: "
        f"{', '.join(bf16) or 'none'}; {os.cpu_count()} CPUs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="corpora, caches and logs")
    parser.add_argument("--sizes", default="300000,1000000,2000000", help="training pairs")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--multi30k", type=Path, default=MULTI30K)
    parser.add_argument("--ddp", action="store_true", help="also a 2-process run, largest size")
    parser.add_argument("--ddp-steps", type=int, default=30)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("overrides", nargs="*", help="more overrides for every command")
    args = parser.parse_args()

    source = args.source.resolve()
    label = subprocess.run(
        ["git", "-C", str(source), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    results = {"machine": machine(), "source": f"{source} ({label})", "prepare": []}
    sizes = [int(s) for s in args.sizes.split(",")]
    for pairs in sizes:
        corpus = build_corpus(pairs, args.multi30k, args.work / f"corpus-{pairs}")
        cache = args.work / f"cache-{label}-{pairs}"
        subprocess.run(["rm", "-rf", str(cache)], check=True)
        command = [
            sys.executable,
            "-m",
            "seq2seq.prepare",
            *data_overrides(corpus, cache),
            f"hydra.run.dir={args.work / f'prepare-{label}-{pairs}'}",
            *args.overrides,
        ]
        log = args.work / f"prepare-{label}-{pairs}.log"
        row = {"pairs": pairs, **measure(command, source, log)}
        row |= tokenizer_phase(row)
        del row["timeline"]
        row["seconds_per_million_pairs"] = round(row["seconds"] / pairs * 1e6, 1)
        results["prepare"].append(row)
        print(json.dumps(row), flush=True)
    if args.ddp:
        pairs = sizes[-1]
        corpus = args.work / f"corpus-{pairs}"
        cache = args.work / f"cache-{label}-{pairs}"  # prepared above: training reads it
        command = [
            sys.executable,
            "-m",
            "seq2seq.train",
            *data_overrides(corpus, cache),
            "model=transformer_small",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            f"trainer.max_steps={args.ddp_steps}",
            "trainer.num_sanity_val_steps=0",
            "evaluate_after=false",
            "average_last=0",
            "logger=none",
            f"hydra.run.dir={args.work / f'ddp-{label}'}",
            *args.overrides,
        ]
        row = {"pairs": pairs, **measure(command, source, args.work / f"ddp-{label}.log")}
        del row["timeline"]
        results["ddp_train"] = row
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
