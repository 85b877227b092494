"""Prepare's time and memory on corpora of 0.3M to 2M pairs, and a data-parallel run's memory.

The corpora are Multi30k's training split repeated, each copy's lines made distinct by a word
numbering the copy (so no cache of repeated lines helps), with Multi30k's val and test sets.
Every measurement is a fresh process with a fresh cache, timed from start to exit; memory is
the peak resident set of its largest process (`ru_maxrss`, what `/usr/bin/time -v` reports) and
the peak proportional set size summed over its process tree (pool workers and data-parallel
processes included; shared pages are split between the processes that map them), sampled
every 0.1 s from /proc. Each process's own peak Pss is reported too (`peak_process_pss_mb`, the
largest of them: "Pss per data-parallel process"), with its anonymous and file-backed parts at
that peak and its peak resident set, in `processes`.

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


def rollup_kb(pid: int) -> dict[str, int]:
    """The kB fields of /proc/<pid>/smaps_rollup (Rss, Pss, Pss_Anon, Pss_File, ...)."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", text, re.M)}


def tree_rollups(root: int) -> dict[int, dict[str, int]]:
    """smaps_rollup of `root` and its descendants, by pid (processes already gone left out)."""
    rollups, stack = {}, [root]
    while stack:
        pid = stack.pop()
        try:
            rollups[pid] = rollup_kb(pid)
            for task in Path(f"/proc/{pid}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, KeyError):
            continue
    return rollups


def tree_pss_kb(root: int) -> int:
    """Summed Pss of `root` and its descendants, from /proc (0 for processes already gone)."""
    return sum(r.get("Pss", 0) for r in tree_rollups(root).values())


def command_name(pid: int) -> str:
    """A short name for the process: its command line, arguments that are overrides left out."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    return " ".join(Path(a).name if a.startswith("/") else a for a in argv if "=" not in a)[:80]


def measure(command: list[str], source: Path, log: Path) -> dict:
    """Run `command` in `source` to completion; its wall time, exit code and memory peaks (the
    tree's summed Pss, and each process's own Pss and Rss), and the memory timeline (wall clock,
    summed Pss in kB) for `tokenizer_phase`."""
    start = time.perf_counter()
    timeline: list[tuple[float, int]] = []
    peaks: dict[int, dict] = {}  # pid -> its rollup at its peak Pss, and its peak Rss
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=source, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                rollups = tree_rollups(process.pid)
                timeline.append((time.time(), sum(r.get("Pss", 0) for r in rollups.values())))
                for pid, rollup in rollups.items():
                    if pid not in peaks:
                        peaks[pid] = {"command": command_name(pid), "at_peak": {}, "rss": 0}
                    peak = peaks[pid]
                    if rollup.get("Pss", 0) > peak["at_peak"].get("Pss", -1):
                        peak["at_peak"] = rollup
                    peak["rss"] = max(peak["rss"], rollup.get("Rss", 0))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        done.set()
        sampler.join()

    def mb(kb: int) -> int:
        return round(kb / 1024)

    processes = sorted(
        (
            {
                "pid": pid,
                "command": peak["command"],
                "peak_pss_mb": mb(peak["at_peak"].get("Pss", 0)),
                "pss_anon_mb_at_peak": mb(peak["at_peak"].get("Pss_Anon", 0)),
                "pss_file_mb_at_peak": mb(peak["at_peak"].get("Pss_File", 0)),
                "rss_mb_at_peak": mb(peak["at_peak"].get("Rss", 0)),
                "peak_rss_mb": mb(peak["rss"]),
            }
            for pid, peak in peaks.items()
        ),
        key=lambda p: -p["peak_pss_mb"],
    )
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "exit_code": os.waitstatus_to_exitcode(status),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "peak_tree_pss_mb": round(max((kb for _, kb in timeline), default=0) / 1024),
        "peak_process_pss_mb": max((p["peak_pss_mb"] for p in processes), default=0),
        "processes": processes,
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
