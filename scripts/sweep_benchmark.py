"""The ablation suite serial (Hydra's basic launcher, each run on every core) against side by
side (hydra/launcher=joblib, one 1-thread run per core), back to back on a warm cache.

Reports each sweep's wall time from start to exit, every run's test BLEU, training time,
updates and validation BLEU from its run_summary.json, and the ratio of the wall times.

    python scripts/sweep_benchmark.py --work /tmp/sweepbench --json docs/bench/sweep.json
    python scripts/sweep_benchmark.py --variants standard,dot --seeds 1 ...  # a subset
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", info)
    family = re.search(r"cpu family\s*:\s*(\d+)", info)
    flags = set(re.search(r"flags\s*:\s*(.*)", info).group(1).split()) if info else set()
    bf16 = [flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags] or ["none"]
    return (
        f"{model.group(1).strip() if model else platform.processor()}, CPU family "
        f"{family.group(1) if family else '?'}; bf16 units: {', '.join(bf16)}; "
        f"{os.cpu_count()} cores"
    )


def sweep(command: list[str], log: Path) -> float:
    start = time.perf_counter()
    with open(log, "w") as out:
        result = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed (exit {result.returncode}); see {log}")
    return time.perf_counter() - start


def runs(directory: Path) -> dict[str, dict]:
    found = {}
    for summary_path in sorted(directory.glob("*/run_summary.json")):
        summary = json.loads(summary_path.read_text())
        (test,) = summary["test"].values()
        found[f"{summary['variant']}_seed{summary['seed']}"] = {
            "test_bleu": test["bleu"],
            "best_val_bleu": summary["best_val_bleu"],
            "steps": summary["steps"],
            "train_seconds": summary["train_seconds"],
        }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="sweep directories go here")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--experiment", default="ablation_cpu")
    parser.add_argument("--variants", help="comma-separated +ablation= presets (default: all)")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    common = [
        f"experiment={args.experiment}",
        f"paths.data_dir={args.data_dir}",
        f"paths.cache_dir={args.work / 'cache'}",
    ]
    subset = [f"+ablation={args.variants}"] if args.variants else []
    subset += [f"seed={args.seeds}"] if args.seeds else []
    prepare = [sys.executable, "-m", "seq2seq.prepare", *common]
    warm = sweep(prepare, args.work / "prepare.log")
    train = [sys.executable, "-m", "seq2seq.train", "-m", *common, *subset]
    results = {}
    for name, launcher in (("serial", []), ("joblib", ["hydra/launcher=joblib"])):
        directory = args.work / name
        command = [*train, *launcher, f"hydra.sweep.dir={directory}"]
        seconds = sweep(command, args.work / f"{name}.log")
        results[name] = {
            "command": " ".join(command[1:]),
            "wall_seconds": round(seconds, 1),
            "runs": runs(directory),
        }
        print(f"{name}: {seconds / 60:.1f} min, {len(results[name]['runs'])} runs", flush=True)
    ratio = results["joblib"]["wall_seconds"] / results["serial"]["wall_seconds"]
    print(f"joblib / serial wall time: {ratio:.3f}")
    report = {
        "date": datetime.now().isoformat(timespec="minutes"),
        "machine": machine(),
        "commit": subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "prepare_seconds": round(warm, 1),
        "ratio_joblib_to_serial": round(ratio, 3),
        **results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
