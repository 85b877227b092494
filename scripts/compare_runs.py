"""Validation BLEU of several training runs against updates: one plot, one table.

    python scripts/compare_runs.py LABEL=RUN_DIR LABEL=RUN_DIR ... [--output curves.png]

Each run's metrics.csv (with those of earlier resumed segments) gives `val/bleu` (greedy) at
each validation. The table lists, at every step where all runs validated, each run's BLEU and
its best so far: what "within 0.5 BLEU at equal updates" is read from (docs/performance.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from seq2seq.callbacks import metrics_files, read_metrics  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402


def validation_bleu(run_dir: Path) -> dict[int, float]:
    """val/bleu by step; a run without any is an error naming its directory."""
    rows = read_metrics(metrics_files(run_dir))
    points = {int(r["step"]): float(r["val/bleu"]) for r in rows if r.get("val/bleu")}
    if not points:
        raise SystemExit(f"error: {run_dir}/metrics.csv has no val/bleu: not a training run dir")
    return points


def parse_run(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"{text!r}: write LABEL=RUN_DIR, e.g. bf16=outputs/...")
    return label, Path(path)


def table(curves: dict[str, dict[int, float]]) -> str:
    labels = list(curves)
    common = sorted(set.intersection(*(set(c) for c in curves.values())))
    header = ["step", *(f"{label} val BLEU (best so far)" for label in labels)]
    lines = ["| " + " | ".join(header) + " |", "|" + " ---: |" * len(header)]
    for step in common:
        cells = []
        for label in labels:
            best = max(v for s, v in curves[label].items() if s <= step)
            cells.append(f"{curves[label][step]:.2f} ({best:.2f})")
        lines.append("| " + " | ".join([str(step), *cells]) + " |")
    return "\n".join(lines)


def plot(curves: dict[str, dict[int, float]], output: Path) -> None:
    fig, axis = plt.subplots(figsize=(8, 4.5))
    for label, points in curves.items():
        steps = sorted(points)
        axis.plot(steps, [points[s] for s in steps], "o-", label=label, alpha=0.8)
    axis.set_xlabel("update")
    axis.set_ylabel("validation BLEU (greedy)")
    axis.legend(loc="lower right")
    axis.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(output) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=parse_run, help="LABEL=RUN_DIR")
    parser.add_argument("--output", type=Path, help="write the plot (PNG) here")
    args = parser.parse_args(argv)
    curves = {label: validation_bleu(path) for label, path in args.runs}
    print(table(curves))
    if args.output:
        plot(curves, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
