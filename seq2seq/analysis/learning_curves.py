"""Learning curves of training runs, from the metrics.csv that training writes (Lightning's
CSVLogger): one run's loss and BLEU by step (the learning_curve.png of every run), and the
validation BLEU of several runs at equal updates (`python -m seq2seq.report runs=...`).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from seq2seq.errors import DataError  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402


def metrics_files(run_dir: Path) -> list[Path]:
    """metrics.csv of a run and, oldest first, those set aside when it was resumed in place."""
    earlier = sorted(run_dir.glob("metrics.*.csv"), key=lambda p: int(p.stem.split(".")[1]))
    return [*earlier, run_dir / "metrics.csv"]


def read_metrics(files: list[Path]) -> list[dict[str, str]]:
    """Rows of consecutive metrics files; a later file (a resumed run) replaces the rows of
    earlier ones from its first step on."""
    rows: list[dict[str, str]] = []
    for path in files:
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            new = list(csv.DictReader(f))
        if new:
            first = min(int(row["step"]) for row in new)
            rows = [row for row in rows if int(row["step"]) < first]
        rows += new
    return rows


def curve_series(rows: list[dict[str, str]]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) points of the training loss, the validation loss (a multilingual run's:
    one per direction, val/loss/<src>-<tgt>) and validation BLEU."""
    keys = ["train/loss", "val/loss", "val/bleu"]
    keys += sorted({key for row in rows for key in row if key.startswith("val/loss/")})
    return {
        key: [(int(row["step"]), float(row[key])) for row in rows if row.get(key) not in (None, "")]
        for key in keys
    }


def plot_learning_curve(metrics_csvs: list[Path], output: Path) -> None:
    """Train and validation loss by step, validation BLEU on a second axis."""
    series = curve_series(read_metrics(metrics_csvs))
    fig, loss_axis = plt.subplots(figsize=(8, 4.5))
    for key, points in series.items():
        if key != "val/bleu" and points:
            steps, values = zip(*points, strict=True)
            style = "-" if key == "train/loss" else "o-"
            loss_axis.plot(steps, values, style, label=key, alpha=0.8)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("label-smoothed cross-entropy per token")
    bleu_axis = loss_axis.twinx()
    if series["val/bleu"]:
        steps, values = zip(*series["val/bleu"], strict=True)
        bleu_axis.plot(steps, values, "s-", color="tab:green", label="val/bleu (greedy)")
        bleu_axis.set_ylim(0, max(5.0, math.ceil(max(values) / 5) * 5))
    bleu_axis.set_ylabel("validation BLEU")
    handles = loss_axis.get_legend_handles_labels()
    more = bleu_axis.get_legend_handles_labels()
    loss_axis.legend(handles[0] + more[0], handles[1] + more[1], loc="center right")
    fig.tight_layout()
    with atomic_path(output) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def validation_bleu(run_dir: Path) -> dict[int, float]:
    """val/bleu by step; a run without any is an error naming its directory."""
    rows = read_metrics(metrics_files(run_dir))
    points = {int(r["step"]): float(r["val/bleu"]) for r in rows if r.get("val/bleu")}
    if not points:
        raise DataError(
            f"{run_dir}/metrics.csv has no val/bleu: not a training run directory; name the "
            "directories that seq2seq.train wrote (outputs/<date>/<time>)"
        )
    return points


def _curve_cell(points: dict[int, float], step: int) -> str:
    """The run's BLEU at `step` and its best up to it: `-` where it did not validate there,
    and nothing but `-` before its first validation or after its last."""
    if not min(points) <= step <= max(points):
        return "-"
    best = max(value for s, value in points.items() if s <= step)
    here = f"{points[step]:.2f}" if step in points else "-"
    return f"{here} ({best:.2f})"


def curve_table(curves: dict[str, dict[int, float]]) -> str:
    """One row per update where any run validated: runs whose epochs end at different updates
    (another vocabulary, batch size or corpus) still compare by their best so far."""
    labels = list(curves)
    steps = sorted(set.union(*(set(c) for c in curves.values())))
    header = ["step", *(f"{label} val BLEU (best so far)" for label in labels)]
    lines = ["| " + " | ".join(header) + " |", "|" + " ---: |" * len(header)]
    for step in steps:
        cells = [_curve_cell(curves[label], step) for label in labels]
        lines.append("| " + " | ".join([str(step), *cells]) + " |")
    return "\n".join(lines)


def plot_curves(curves: dict[str, dict[int, float]], output: Path) -> None:
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
