"""`python -m seq2seq.report sweep=<multirun dir>` or `runs=[<run dir>,...]`: reports of finished
runs, written only where asked (no outputs/ run directory, no log file).

- `sweep=`: the ablation table of a sweep, with the variance over seeds and each variant's
  paired bootstrap test against `baseline=` (seq2seq.analysis.ablation): ablation.md, .csv and
  .png in the sweep directory, or in `output=`.
- `runs=`: validation BLEU of training runs at every update where any of them validated, with
  each run's best so far (seq2seq.analysis.learning_curves); `output=<dir>` also writes
  validation_bleu.md and .png there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq.analysis.ablation import ablation_report
from seq2seq.analysis.learning_curves import curve_table, plot_curves, validation_bleu
from seq2seq.cli import entrypoint
from seq2seq.errors import require
from seq2seq.io import atomic_path


@dataclass
class ReportConfig:
    """What `report` reads (conf/report.yaml): an ablation sweep, or training runs to compare."""

    sweep: str | None
    runs: Any  # run directories: a list, or a mapping label -> directory
    baseline: str
    test_set: str | None
    references: str | None
    output: str | None

    def check(self) -> None:
        require(
            (self.sweep is None) != (self.runs is None),
            "sweep",
            "give either sweep=<multirun dir> (an ablation report) or runs=[<run dir>,...] "
            "(validation BLEU of runs compared), not both or neither",
        )
        require(
            self.runs is None or (isinstance(self.runs, (list, dict)) and len(self.runs) > 0),
            "runs",
            f"{self.runs!r}: name run directories, runs=[outputs/a,outputs/b] or "
            "runs={bf16:outputs/a,fp32:outputs/b}",
        )

    @property
    def labelled_runs(self) -> dict[str, Path]:
        """`runs` as label -> directory; a list's directories are their own labels."""
        if isinstance(self.runs, dict):
            return {str(label): Path(str(path)) for label, path in self.runs.items()}
        return {str(path): Path(str(path)) for path in self.runs}


def compare_runs(runs: dict[str, Path], output: Path | None) -> str:
    """The validation BLEU table of `runs` (label -> run directory); with `output`, written
    there with its plot."""
    curves = {label: validation_bleu(path) for label, path in runs.items()}
    table = curve_table(curves)
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        with atomic_path(output / "validation_bleu.md") as tmp:
            tmp.write_text(table + "\n")
        plot_curves(curves, output / "validation_bleu.png")
    return table


@entrypoint(config_name="report", schema=ReportConfig)
def main(config: ReportConfig) -> None:
    output = Path(config.output) if config.output else None
    if config.runs is not None:
        print(compare_runs(config.labelled_runs, output))
        return
    references = Path(config.references) if config.references else None
    report = ablation_report(
        Path(config.sweep), config.baseline, config.test_set, references, output
    )
    print(report.read_text(), end="")
    print(f"written: {report}, .csv, .png")


if __name__ == "__main__":
    main()
