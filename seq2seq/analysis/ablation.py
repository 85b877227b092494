"""An ablation sweep as a table (Markdown and CSV) and a bar chart, with the variance over seeds
and the significance of each variant against a baseline: `python -m seq2seq.report sweep=...`.

Runs are grouped by variant (`model.attention.name`), one run per seed. Per variant: the mean
and standard deviation over seeds of test BLEU, chrF and the best validation BLEU, the updates,
minutes and precision of its runs; against the baseline, on the hypotheses of the lowest seed
the two share, the BLEU difference with its 95% confidence interval and sacreBLEU's paired
bootstrap p-value (seq2seq.analysis.significance).

What a run is for comes from its resolved config.yaml, never from its name: a variant whose
model computes what the baseline's does (`ModelConfig.resolved()`, e.g. cross_heads_4 where
model.heads is 4) is a harness check, and its hypotheses must equal the baseline's seed by
seed; a model trained with `model.attention.allow_future_leak` sees later target tokens, so it
is reported apart and not tested.

A finished run directory holds run_summary.json (written by seq2seq.train when a run finishes,
after its test evaluation), config.yaml and the test hypotheses the summary names; a finished
run without them stops the report with its name. Runs that failed (failed.txt), did not finish,
or never started (jobs of Hydra's multirun.yaml without a directory) are named under the table,
which holds the finished ones. Relative paths in a summary are read from the
directory the run was started in (Hydra's `.hydra/hydra.yaml` records it), or else from the run
directory.

A sweep of multilingual models is reported per direction when no test set is named: one report
for each test set of each direction (`<set>.<src>-<tgt>/ablation.md`), and an ablation.md that
lists them with each variant's mean test BLEU per direction.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from seq2seq.analysis.significance import SAMPLES, Comparison, paired_bootstrap  # noqa: E402
from seq2seq.concurrency import FAILED_FILE  # noqa: E402
from seq2seq.config import validate_config  # noqa: E402
from seq2seq.data.corpus import read_lines  # noqa: E402
from seq2seq.errors import DataError, Seq2SeqError  # noqa: E402
from seq2seq.io import atomic_path  # noqa: E402
from seq2seq.model.config import ModelConfig  # noqa: E402
from seq2seq.upgrade import upgrade_config  # noqa: E402

SIGNIFICANCE = 0.05


def columns(baseline: str) -> list[str]:
    return [
        "variant",
        "wiring",
        "seeds",
        "updates",
        "train min",
        "precision",
        "val BLEU",
        "test BLEU",
        "chrF",
        f"Δ test BLEU vs {baseline} [95% CI]",
        "p",
    ]


@dataclass
class Run:
    directory: Path
    variant: str
    seed: int
    wiring: str
    model: dict[str, Any]  # ModelConfig.resolved(): what the model computes
    leaks: bool  # trained without the causal mask
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


def incomplete(run_dir: Path, what: str) -> DataError:
    return DataError(
        f"{run_dir} is incomplete: {what} (the run did not finish, or ran with "
        "evaluate_after=false). Rerun it, or move it out of the sweep directory."
    )


def hydra_record(run_dir: Path) -> dict[str, Any]:
    """The `hydra` node Hydra saved for a run (.hydra/hydra.yaml), empty if none."""
    path = run_dir / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return {}
    return (yaml.safe_load(path.read_text()) or {}).get("hydra", {})


def started_in(run_dir: Path) -> Path:
    """The directory a run was started in, which relative paths of its summary start from."""
    runtime = hydra_record(run_dir).get("runtime", {})
    if runtime.get("cwd") and Path(runtime["cwd"]).is_dir():
        return Path(runtime["cwd"])
    return run_dir


def expected_jobs(sweep: Path) -> dict[int, str]:
    """The jobs of a sweep (number -> the overrides that tell it from the others) as Hydra's
    basic sweeper expands its multirun.yaml; empty when there is none or another sweeper ran
    it."""
    path = sweep / "multirun.yaml"
    if not path.is_file():
        return {}
    hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra", {})
    if not str(hydra.get("sweeper", {}).get("_target_", "")).endswith(".BasicSweeper"):
        return {}
    params = [f"{key}={value}" for key, value in (hydra["sweeper"].get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides([*params, *hydra["overrides"]["task"]])
    jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    varying = [[o for o in job if not all(o in other for other in jobs)] for job in jobs]
    return {number: " ".join(job) for number, job in enumerate(varying)}


def not_finished(sweep: Path, directories: list[Path], finished: list[Path]) -> list[str]:
    """The sweep's runs (`directories`) not `finished`: failed (with the error), unfinished;
    and the jobs that never started."""
    text = []
    for directory in directories:
        if directory in finished:
            continue
        failed = directory / FAILED_FILE
        if failed.is_file():
            text.append(f"{directory.name}: failed ({failed.read_text().strip()})")
        else:
            text.append(f"{directory.name}: did not finish (still running, or stopped)")
    started = {hydra_record(d).get("job", {}).get("num") for d in directories}
    for number, overrides in expected_jobs(sweep).items():
        if number not in started:
            text.append(f"job {number} ({overrides}): never started")
    return text


def read_run(run_dir: Path, test_set: str | None) -> Run:
    summary_path, config_path = run_dir / "run_summary.json", run_dir / "config.yaml"
    for path in (summary_path, config_path):
        if not path.is_file():
            raise incomplete(run_dir, f"{path.name} is missing")
    summary = json.loads(summary_path.read_text())
    saved = yaml.safe_load(config_path.read_text())
    try:  # the model only: what the run computed, whatever its data and trainer were
        model = validate_config(OmegaConf.create(upgrade_config(saved)["model"]), ModelConfig)
    except Seq2SeqError as e:
        raise DataError(f"{config_path}: {e}") from None
    test_set = test_set or saved["data"]["test_sets"][0]
    test = summary.get("test", {}).get(test_set)
    if test is None:
        raise DataError(
            f"{summary_path} has no scores for test set '{test_set}'; it has "
            f"{sorted(summary.get('test', {}))}. Pick one with test_set=..."
        )
    base = started_in(run_dir)
    hypotheses = (base / test["hypotheses"]).resolve()
    if not hypotheses.is_file():
        raise incomplete(run_dir, f"its test hypotheses {hypotheses} are missing")
    return Run(
        directory=run_dir,
        variant=summary["variant"],
        seed=summary.get("seed", saved.get("seed")),
        wiring=wiring(saved["model"]),
        model=model.resolved(),
        leaks=model.attention.allow_future_leak,
        parameters=summary["parameters"],
        steps=summary.get("steps"),
        minutes=summary["train_seconds"] / 60,
        precision=summary.get("precision", "-"),
        val_bleu=summary["best_val_bleu"],
        test_bleu=test["bleu"],
        chrf=test["chrf"],
        hypotheses=hypotheses,
        references=(base / test["references"]).resolve(),
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
            raise DataError(
                f"variant {variant} has seed(s) {seeds} more than once ({directories}): "
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
    variant: str, runs: list[Run], baseline: str, tested: bool, comparison: Comparison | None
) -> dict[str, str]:
    vals = [run.val_bleu for run in runs if run.val_bleu is not None]
    difference = columns(baseline)[-2]
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
        difference: "",
        "p": "",
    }
    if tested and comparison is None:
        cells[difference] = f"no seed in common with {baseline}"
    if comparison is not None:
        low, high = comparison.difference_ci
        mark = " *" if comparison.p_value < SIGNIFICANCE else ""
        cells[difference] = f"{comparison.difference:+.2f} [{low:+.2f}, {high:+.2f}]{mark}"
        cells["p"] = f"{comparison.p_value:.3f}"
    return cells


def references_of(runs: list[Run], override: Path | None) -> list[str]:
    paths = {override} if override else {run.references for run in runs}
    if len(paths) > 1:
        raise DataError(
            f"the runs name different references {sorted(map(str, paths))}; give one with "
            "references=..."
        )
    [path] = paths
    if not path.is_file():
        raise DataError(
            f"references {path} not found (a path relative to where training ran); give it "
            "with references=..."
        )
    return read_lines(path)


def harness_checks(variants: dict[str, list[Run]], baseline: str) -> list[str]:
    """Variants whose model computes what the baseline's does: their hypotheses must be the
    baseline's, seed by seed."""
    lines = []
    reference = {run.seed: run for run in variants.get(baseline, [])}
    if not reference:
        return lines
    model = next(iter(reference.values())).model
    for name, members in variants.items():
        if name == baseline:
            continue
        for run in members:
            if run.model != model or run.seed not in reference:
                continue
            same = read_lines(run.hypotheses) == read_lines(reference[run.seed].hypotheses)
            verdict = "equal, as they must be" if same else "DIFFERENT: the harness is broken"
            lines.append(
                f"Harness check, seed {run.seed}: {name}'s hypotheses and {baseline}'s "
                f"are {verdict}."
            )
    return lines


def notes(runs: list[Run], variants: dict[str, list[Run]], baseline: str) -> list[str]:
    seeds = max(len(members) for members in variants.values())
    text = [
        f"Test set: {runs[0].test_set}; BLEU signature: {runs[0].signature}; val BLEU: best "
        "greedy validation BLEU during training; values are mean ± standard deviation over "
        "the seeds listed."
    ]
    if seeds == 1:
        text.append("One seed per variant: no variance is available (no ± shown).")
    if baseline in variants:
        text.append(
            f"Δ and p: against {baseline} on the hypotheses of the lowest seed both ran, "
            f"sacreBLEU's paired bootstrap resampling ({SAMPLES} resamples); the CI is the "
            "2.5-97.5 percentile range of the difference over the same resamples "
            f"(seq2seq/analysis/significance.py). * marks p < {SIGNIFICANCE}; a difference "
            "without * is not significant."
        )
    else:
        text.append(
            f"No {baseline} run (baseline={baseline}; variants here: {', '.join(variants)}): "
            "no significance tests."
        )
    return text


def write_report(
    table: list[dict[str, str]],
    apart: list[dict[str, str]],
    text: list[str],
    means: dict[str, tuple[float, float]],
    baseline: str,
    output: Path,
    test_set: str,
) -> None:
    header = columns(baseline)

    def markdown(rows: list[dict[str, str]]) -> str:
        lines = "| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n"
        return lines + "".join("| " + " | ".join(r[c] for c in header) + " |\n" for r in rows)

    body = markdown(table)
    if apart:
        body += "\nReported apart (sees later target tokens; not tested):\n\n" + markdown(apart)
    with atomic_path(output / "ablation.md") as tmp:
        tmp.write_text(body + "\n" + "\n".join(text) + "\n")
    with atomic_path(output / "ablation.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
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


def direction_test_sets(run_dir: Path) -> list[str]:
    """The test sets a multilingual run scored, one per direction and set (`<set>.<src>-<tgt>`,
    as run_summary.json names them); none for a one-direction run. Read from config.yaml's
    data keys alone, as the model is: the rest of a run's config is not this report's."""
    data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]
    own = data.get("directions") or [f"{data['src_lang']}-{data['tgt_lang']}"]
    corpora = [(own, data["test_sets"])] + [
        (corpus["directions"], corpus["test_sets"])
        for corpus in (data.get("corpora") or {}).values()
    ]
    if sum(len(directions) for directions, _ in corpora) < 2:
        return []
    return [f"{name}.{d}" for directions, names in corpora for d in directions for name in names]


def report_per_direction(sweep: Path, baseline: str, test_sets: list[str], output: Path) -> Path:
    """A report per direction's test set (module docstring), and ablation.md listing them."""
    lines = ["| test set | report | test BLEU by variant |", "|---|---|---|"]
    for test_set in test_sets:
        report = ablation_report(sweep, baseline, test_set, None, output / test_set)
        with open(report.with_suffix(".csv"), newline="") as f:
            means = "; ".join(f"{r['variant']} {r['test BLEU']}" for r in csv.DictReader(f))
        link = f"[{test_set}/ablation.md]({test_set}/ablation.md)"
        lines.append(f"| {test_set} | {link} | {means} |")
    with atomic_path(output / "ablation.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    return output / "ablation.md"


def ablation_report(
    sweep: Path,
    baseline: str,
    test_set: str | None = None,
    references: Path | None = None,
    output: Path | None = None,
) -> Path:
    """Write ablation.md, .csv and .png for the runs of `sweep` (into `output`, default the
    sweep directory), or for multilingual runs a report per direction (module docstring);
    return the Markdown file."""
    directories = sorted(p.parent for p in sweep.glob("*/.hydra"))
    finished = [d for d in directories if (d / "run_summary.json").is_file()]
    per_direction = direction_test_sets(finished[0]) if finished and test_set is None else []
    if per_direction:
        if references is not None:
            raise DataError(
                "references=... is one file, and these multilingual runs have a test set per "
                f"direction ({', '.join(per_direction)}); name one with test_set=..."
            )
        return report_per_direction(sweep, baseline, per_direction, output or sweep)
    missing = not_finished(sweep, directories, finished)
    if not finished:
        listing = "".join(f"\n  {line}" for line in missing)
        raise DataError(
            f"no finished runs (*/run_summary.json) under {sweep}{listing or ''}\n"
            "Name the directory of a sweep (python -m seq2seq.train -m ... hydra.sweep.dir=<dir>), "
            "or rerun the sweep into it: finished runs are skipped"
        )
    runs = [read_run(directory, test_set) for directory in finished]
    test_sets = {run.test_set for run in runs}
    if len(test_sets) > 1:
        raise DataError(
            f"the runs were tested on different sets {sorted(test_sets)}; pick one with "
            "test_set=..."
        )
    variants = group(runs)
    reference_runs = variants.get(baseline)
    reference_lines = references_of(runs, references) if reference_runs else []
    leaking = {name for name, members in variants.items() if any(r.leaks for r in members)}
    table, apart = [], []
    for name, members in variants.items():
        tested = reference_runs is not None and name != baseline and name not in leaking
        comparison = compare(members, reference_runs, reference_lines) if tested else None
        cells = row(name, members, baseline, tested, comparison)
        (apart if name in leaking else table).append(cells)
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
            cells["variant"] != baseline,
            cells["variant"],
        )
    )
    text = [*notes(runs, variants, baseline), *harness_checks(variants, baseline)]
    if missing:
        text.append(
            f"Not in the table ({len(missing)}): " + "; ".join(missing) + ". Rerun the sweep "
            "with the same command into the same hydra.sweep.dir: finished runs are skipped."
        )
    output = output or sweep
    output.mkdir(parents=True, exist_ok=True)
    write_report(table, apart, text, means, baseline, output, runs[0].test_set)
    return output / "ablation.md"
