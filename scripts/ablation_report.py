"""Gather an ablation multirun into a table (Markdown and CSV) and a bar chart, with the
variance over seeds and the significance of each variant against the standard wiring.

    python scripts/ablation_report.py multirun/<date>/<time> [--test-set test_2016_flickr]

Without --test-set the report scores each run on the first of its config's data.test_sets.
Runs are grouped by variant (`model.attention.name`), one run per seed. Per variant: the mean
and standard deviation over seeds of test BLEU, chrF and the best validation BLEU, the updates,
minutes and precision of its runs; against `standard`, on the hypotheses of the lowest seed the
two share, the BLEU difference with its 95% confidence interval and sacreBLEU's paired
bootstrap p-value (scripts/significance.py). `cross_heads_4` is the same model as `standard`:
its hypotheses must equal standard's, which the report checks. `no_causal_mask` sees the
future, so it is reported apart and not tested.

Each run directory must hold run_summary.json (written by seq2seq.train when a run finishes,
after its test evaluation), config.yaml and the test hypotheses the summary names; a run
without them stops the report with its name.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402
from significance import SAMPLES, Comparison, paired_bootstrap  # noqa: E402

from seq2seq.data.corpus import read_lines  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402

BASELINE = "standard"
SAME_AS_BASELINE = ("cross_heads_4",)  # the harness check: the same model and seed as standard
APART = ("no_causal_mask",)  # sees later target tokens: a demonstration, not a variant
SIGNIFICANCE = 0.05
COLUMNS = [
    "variant",
    "wiring",
    "seeds",
    "updates",
    "train min",
    "precision",
    "val BLEU",
    "test BLEU",
    "chrF",
    f"Δ test BLEU vs {BASELINE} [95% CI]",
    "p",
]


@dataclass
class Run:
    directory: Path
    variant: str
    seed: int
    wiring: str
    parameters: int
    steps: int | None
    minutes: float
    precision: str
    val_bleu: float | None
    test_bleu: float
    chrf: float
    hypotheses: Path
    references: Path
    signature: str
    test_set: str


def wiring(model: dict) -> str:
    """e.g. 'enc s/s, dec t/t, cross t/s; scaled_dot; heads -/-/4; causal', then what differs
    from the standard block and the per-layer exceptions, e.g. '; dec feed_forward skip all'."""

    def streams(site: dict) -> str:
        return f"{site['query'][0]}/{site['key_value'][0]}"

    attention = model["attention"]
    sites = [attention[k] for k in ("encoder_self", "decoder_self", "cross")]
    scores = sorted({s["score"] for s in sites})
    heads = "/".join(str(s["heads"]) if s["heads"] else "-" for s in sites)
    mask = "NO causal mask" if attention["allow_future_leak"] else "causal"
    parts = [
        f"enc {streams(sites[0])}, dec {streams(sites[1])}, cross {streams(sites[2])}",
        "+".join(scores),
        f"heads {heads}",
        mask,
    ]
    for stack, sublayers in model.get("block", {}).items():
        for name, settings in sublayers.items():
            for key, standard in (("skip", "none"), ("residual", "all")):
                if str(settings[key]) != standard:
                    parts.append(f"{stack[:3]} {name} {key} {settings[key]}")
    for entry in attention.get("layers", []):
        changed = {
            site: {k: v for k, v in entry[site].items() if v is not None}
            for site in ("encoder_self", "decoder_self", "cross")
        }
        described = ", ".join(
            f"{site} {' '.join(f'{k}={v}' for k, v in values.items())}"
            for site, values in changed.items()
            if values
        )
        parts.append(f"layers {entry['layers']}: {described}")
    return "; ".join(parts)


def incomplete(run_dir: Path, what: str) -> SystemExit:
    return SystemExit(
        f"error: {run_dir} is incomplete: {what} (the run did not finish, or ran with "
        "evaluate_after=false). Rerun it, or move it out of the multirun directory."
    )


def read_run(run_dir: Path, test_set: str | None) -> Run:
    summary_path, config_path = run_dir / "run_summary.json", run_dir / "config.yaml"
    for path in (summary_path, config_path):
        if not path.is_file():
            raise incomplete(run_dir, f"{path.name} is missing")
    summary = json.loads(summary_path.read_text())
    config = yaml.safe_load(config_path.read_text())
    test_set = test_set or config["data"]["test_sets"][0]
    test = summary.get("test", {}).get(test_set)
    if test is None:
        raise SystemExit(
            f"error: {summary_path} has no scores for test set '{test_set}'; it has "
            f"{sorted(summary.get('test', {}))}. Pick one with --test-set."
        )
    hypotheses = Path(test["hypotheses"])
    if not hypotheses.is_file():
        raise incomplete(run_dir, f"its test hypotheses {hypotheses} are missing")
    return Run(
        directory=run_dir,
        variant=summary["variant"],
        seed=summary.get("seed", config.get("seed")),
        wiring=wiring(config["model"]),
        parameters=summary["parameters"],
        steps=summary.get("steps"),
        minutes=summary["train_seconds"] / 60,
        precision=summary.get("precision", "-"),
        val_bleu=summary["best_val_bleu"],
        test_bleu=test["bleu"],
        chrf=test["chrf"],
        hypotheses=hypotheses,
        references=Path(test["references"]),
        signature=test["bleu_signature"],
        test_set=test_set,
    )


def spread(values: list[float], spec: str = ".2f") -> str:
    """'mean ± sd' over seeds; the mean alone for one seed."""
    if len(values) == 1:
        return format(values[0], spec)
    return f"{statistics.mean(values):{spec}} ± {statistics.stdev(values):{spec}}"


def span(values: list) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def group(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by variant, each variant's by seed; a seed twice in one variant is an error."""
    variants: dict[str, list[Run]] = {}
    for run in runs:
        variants.setdefault(run.variant, []).append(run)
    for variant, members in variants.items():
        members.sort(key=lambda run: run.seed)
        seeds = [run.seed for run in members]
        if len(set(seeds)) != len(seeds):
            directories = ", ".join(run.directory.name for run in members)
            raise SystemExit(
                f"error: variant {variant} has seed(s) {seeds} more than once ({directories}): "
                "report one sweep at a time"
            )
    return variants


def compare(variant: list[Run], baseline: list[Run], references: list[str]) -> Comparison | None:
    """The variant against the baseline on the hypotheses of the lowest seed both have (None
    when they share no seed)."""
    common = {run.seed for run in variant} & {run.seed for run in baseline}
    if not common:
        return None
    seed = min(common)
    ours = next(run for run in variant if run.seed == seed)
    theirs = next(run for run in baseline if run.seed == seed)
    return paired_bootstrap(read_lines(theirs.hypotheses), read_lines(ours.hypotheses), references)


def row(
    variant: str, runs: list[Run], tested: bool, comparison: Comparison | None
) -> dict[str, str]:
    vals = [run.val_bleu for run in runs if run.val_bleu is not None]
    cells = {
        "variant": variant,
        "wiring": runs[0].wiring,
        "seeds": ",".join(str(run.seed) for run in runs),
        "updates": span([run.steps for run in runs]),
        "train min": span([round(run.minutes, 1) for run in runs]),
        "precision": span([run.precision for run in runs]),
        "val BLEU": spread(vals) if vals else "-",
        "test BLEU": spread([run.test_bleu for run in runs]),
        "chrF": spread([run.chrf for run in runs]),
        COLUMNS[-2]: "",
        "p": "",
    }
    if tested and comparison is None:
        cells[COLUMNS[-2]] = f"no seed in common with {BASELINE}"
    if comparison is not None:
        low, high = comparison.difference_ci
        mark = " *" if comparison.p_value < SIGNIFICANCE else ""
        cells[COLUMNS[-2]] = f"{comparison.difference:+.2f} [{low:+.2f}, {high:+.2f}]{mark}"
        cells["p"] = f"{comparison.p_value:.3f}"
    return cells


def references_of(runs: list[Run], override: Path | None) -> list[str]:
    paths = {override} if override else {run.references for run in runs}
    if len(paths) > 1:
        raise SystemExit(f"error: the runs name different references {sorted(paths)}")
    [path] = paths
    if not path.is_file():
        raise SystemExit(
            f"error: references {path} not found (a path relative to where training ran); "
            "give it with --references"
        )
    return read_lines(path)


def harness_checks(variants: dict[str, list[Run]]) -> list[str]:
    """Variants that are standard's model: their hypotheses must be standard's, seed by seed."""
    lines = []
    baseline = {run.seed: run for run in variants.get(BASELINE, [])}
    for name in SAME_AS_BASELINE:
        for run in variants.get(name, []):
            if run.seed not in baseline:
                continue
            same = read_lines(run.hypotheses) == read_lines(baseline[run.seed].hypotheses)
            verdict = "equal, as they must be" if same else "DIFFERENT: the harness is broken"
            lines.append(
                f"Harness check, seed {run.seed}: {name}'s hypotheses and {BASELINE}'s "
                f"are {verdict}."
            )
    return lines


def notes(runs: list[Run], variants: dict[str, list[Run]], compared: bool) -> list[str]:
    seeds = max(len(members) for members in variants.values())
    text = [
        f"Test set: {runs[0].test_set}; BLEU signature: {runs[0].signature}; val BLEU: best "
        "greedy validation BLEU during training; values are mean ± standard deviation over "
        "the seeds listed."
    ]
    if seeds == 1:
        text.append("One seed per variant: no variance is available (no ± shown).")
    if compared:
        text.append(
            f"Δ and p: against {BASELINE} on the hypotheses of the lowest seed both ran, "
            f"sacreBLEU's paired bootstrap resampling ({SAMPLES} resamples); the CI is the "
            "2.5-97.5 percentile range of the difference over the same resamples "
            f"(scripts/significance.py). * marks p < {SIGNIFICANCE}; a difference without * "
            "is not significant."
        )
    else:
        text.append(f"No {BASELINE} run: no significance tests.")
    return text


def write_report(
    table: list[dict[str, str]],
    apart: list[dict[str, str]],
    text: list[str],
    means: dict[str, tuple[float, float]],
    output: Path,
    test_set: str,
) -> None:
    def markdown(rows: list[dict[str, str]]) -> str:
        header = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
        return header + "".join("| " + " | ".join(r[c] for c in COLUMNS) + " |\n" for r in rows)

    body = markdown(table)
    if apart:
        body += "\nReported apart (sees later target tokens; not tested):\n\n" + markdown(apart)
    with atomic_path(output / "ablation.md") as tmp:
        tmp.write_text(body + "\n" + "\n".join(text) + "\n")
    with atomic_path(output / "ablation.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table + apart)
    fig, axis = plt.subplots(figsize=(9, 4.5))
    names = [cells["variant"] for cells in table + apart]  # the table's order
    errors = [means[name][1] for name in names]
    axis.bar(names, [means[name][0] for name in names], yerr=errors, capsize=4)
    axis.set_ylabel(f"BLEU on {test_set} (mean ± sd over seeds)")
    axis.set_title("Attention ablations")
    axis.tick_params(axis="x", rotation=35)
    fig.tight_layout()
    with atomic_path(output / "ablation.png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("multirun", type=Path, help="a Hydra multirun directory")
    parser.add_argument("--test-set", help="default: the first of each run's data.test_sets")
    parser.add_argument("--references", type=Path, help="default: the path the runs recorded")
    parser.add_argument("--output", type=Path, help="where to write (default: the multirun dir)")
    args = parser.parse_args()
    directories = sorted(p.parent for p in args.multirun.glob("*/.hydra"))
    if not directories:
        sys.exit(f"error: no run directories (*/.hydra) under {args.multirun}")
    runs = [read_run(directory, args.test_set) for directory in directories]
    test_sets = {run.test_set for run in runs}
    if len(test_sets) > 1:
        sys.exit(
            f"error: the runs were tested on different sets {sorted(test_sets)}; "
            "pick one with --test-set"
        )
    variants = group(runs)
    baseline = variants.get(BASELINE)
    references = references_of(runs, args.references) if baseline else []
    table, apart = [], []
    for name, members in variants.items():
        tested = baseline is not None and name not in (BASELINE, *APART)
        comparison = compare(members, baseline, references) if tested else None
        (apart if name in APART else table).append(row(name, members, tested, comparison))
    means = {
        name: (
            statistics.mean(run.test_bleu for run in members),
            statistics.stdev(run.test_bleu for run in members) if len(members) > 1 else 0.0,
        )
        for name, members in variants.items()
    }
    # best first; among equals the baseline, then by name
    table.sort(
        key=lambda cells: (
            -means[cells["variant"]][0],
            cells["variant"] != BASELINE,
            cells["variant"],
        )
    )
    text = [*notes(runs, variants, baseline is not None), *harness_checks(variants)]
    output = args.output or args.multirun
    output.mkdir(parents=True, exist_ok=True)
    write_report(table, apart, text, means, output, runs[0].test_set)
    print((output / "ablation.md").read_text())


if __name__ == "__main__":
    main()
