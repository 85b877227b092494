"""Gather an ablation multirun into a table (Markdown and CSV) and a bar chart.

    python scripts/ablation_report.py multirun/<date>/<time> [--test-set test_2016_flickr]

Without --test-set the report scores each run on the first of its config's data.test_sets.

Each run directory must hold run_summary.json (written by seq2seq.train when a run finishes,
after its test evaluation) and config.yaml; a run without them stops the report with its name.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from seq2seq.io import atomic_path  # noqa: E402

COLUMNS = [
    "variant",
    "wiring",
    "parameters",
    "val BLEU",
    "test BLEU",
    "chrF",
    "train loss",
    "train min",
]


def wiring(attention: dict) -> str:
    """e.g. 'enc s/s, dec t/t, cross t/s; scaled_dot; heads -/-/4; causal'."""

    def streams(site: dict) -> str:
        return f"{site['query'][0]}/{site['key_value'][0]}"

    sites = [attention[k] for k in ("encoder_self", "decoder_self", "cross")]
    scores = sorted({s["score"] for s in sites})
    heads = "/".join(str(s["heads"]) if s["heads"] else "-" for s in sites)
    mask = "NO causal mask" if attention["allow_future_leak"] else "causal"
    return (
        f"enc {streams(sites[0])}, dec {streams(sites[1])}, cross {streams(sites[2])}; "
        f"{'+'.join(scores)}; heads {heads}; {mask}"
    )


def number(value: float | None, spec: str) -> str:
    """A run without validation or logged loss shows '-' in its cell."""
    return "-" if value is None else format(value, spec)


def read_run(run_dir: Path, test_set: str | None) -> dict:
    summary_path, config_path = run_dir / "run_summary.json", run_dir / "config.yaml"
    for path in (summary_path, config_path):
        if not path.is_file():
            raise SystemExit(
                f"error: {run_dir} is incomplete: {path.name} is missing (the run did not "
                "finish, or ran with evaluate_after=false). Rerun it, or move it out of the "
                "multirun directory."
            )
    summary = json.loads(summary_path.read_text())
    config = yaml.safe_load(config_path.read_text())
    test_set = test_set or config["data"]["test_sets"][0]
    test = summary.get("test", {}).get(test_set)
    if test is None:
        raise SystemExit(
            f"error: {summary_path} has no scores for test set '{test_set}'; it has "
            f"{sorted(summary.get('test', {}))}. Pick one with --test-set."
        )
    return {
        "variant": summary["variant"],
        "wiring": wiring(config["model"]["attention"]),
        "parameters": f"{summary['parameters'] / 1e6:.2f}M",
        "val BLEU": number(summary["best_val_bleu"], ".2f"),
        "test BLEU": f"{test['bleu']:.2f}",
        "chrF": f"{test['chrf']:.2f}",
        "train loss": number(summary["train_loss"], ".3f"),
        "train min": f"{summary['train_seconds'] / 60:.1f}",
        "signature": test["bleu_signature"],
        "test set": test_set,
    }


def write_report(rows: list[dict], output: Path) -> None:
    test_set = rows[0]["test set"]
    header = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    body = "".join("| " + " | ".join(row[c] for c in COLUMNS) + " |\n" for row in rows)
    signature = rows[0]["signature"]
    with atomic_path(output / "ablation.md") as tmp:
        tmp.write_text(
            f"{header}{body}\nTest set: {test_set}; BLEU signature: {signature}; val BLEU: "
            "best greedy validation BLEU during training.\n"
        )
    with atomic_path(output / "ablation.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*COLUMNS, "signature", "test set"])
        writer.writeheader()
        writer.writerows(rows)
    fig, axis = plt.subplots(figsize=(9, 4.5))
    names = [row["variant"] for row in rows]
    axis.bar(names, [float(row["test BLEU"]) for row in rows], color="tab:blue")
    axis.set_ylabel(f"BLEU on {test_set}")
    axis.set_title("Attention ablations (same data, seed and budget)")
    axis.tick_params(axis="x", rotation=35)
    fig.tight_layout()
    with atomic_path(output / "ablation.png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("multirun", type=Path, help="a Hydra multirun directory")
    parser.add_argument("--test-set", help="default: the first of each run's data.test_sets")
    parser.add_argument("--output", type=Path, help="where to write (default: the multirun dir)")
    args = parser.parse_args()
    runs = sorted(p.parent for p in args.multirun.glob("*/.hydra"))
    if not runs:
        sys.exit(f"error: no run directories (*/.hydra) under {args.multirun}")
    rows = [read_run(run, args.test_set) for run in runs]
    test_sets = {row["test set"] for row in rows}
    if len(test_sets) > 1:
        sys.exit(
            f"error: the runs were tested on different sets {sorted(test_sets)}; "
            "pick one with --test-set"
        )
    rows.sort(key=lambda row: -float(row["test BLEU"]))
    output = args.output or args.multirun
    output.mkdir(parents=True, exist_ok=True)
    write_report(rows, output)
    print((output / "ablation.md").read_text())


if __name__ == "__main__":
    main()
