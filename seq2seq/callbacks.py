"""Training callbacks: the learning-curve plot written into the run directory."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytorch_lightning as pl  # noqa: E402

from seq2seq.io import atomic_path  # noqa: E402


def plot_learning_curve(metrics_csv: Path, output: Path) -> None:
    """Train and validation loss by step, validation BLEU on a second axis."""
    series: dict[str, list[tuple[int, float]]] = {"train/loss": [], "val/loss": [], "val/bleu": []}
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            for key, points in series.items():
                if row.get(key) not in (None, ""):
                    points.append((int(row["step"]), float(row[key])))
    fig, loss_axis = plt.subplots(figsize=(8, 4.5))
    for key, style in (("train/loss", "-"), ("val/loss", "o-")):
        if series[key]:
            steps, values = zip(*series[key], strict=True)
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


class LearningCurve(pl.Callback):
    def __init__(self, metrics_csv: Path, output: Path) -> None:
        self.metrics_csv, self.output = metrics_csv, output

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and self.metrics_csv.exists():
            plot_learning_curve(self.metrics_csv, self.output)
