"""`python -m seq2seq.report`: the ablation table of a sweep kept as a fixture, the roles of runs
read from their configs, and validation BLEU of runs compared (`runs=`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import REFERENCES, fake_run, report, table_rows

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HEADER = "epoch,step,train/loss,val/bleu\n"


def test_sweep_fixture_gives_the_table_of_the_script_it_replaces(tmp_path: Path) -> None:
    """tests/fixtures/ablation_sweep: eight runs whose summaries name their hypotheses and
    references by relative paths; the expected files are the report of the script the command
    replaced. Run from an unrelated directory, the command writes its three files into
    `output` and nothing else anywhere."""
    sweep = tmp_path / "sweep"
    shutil.copytree(FIXTURES / "ablation_sweep", sweep)
    before = sorted(p.relative_to(sweep) for p in sweep.rglob("*"))
    elsewhere, output = tmp_path / "elsewhere", tmp_path / "report"
    elsewhere.mkdir()
    result = report(f"sweep={sweep}", f"output={output}", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    expected = FIXTURES / "ablation_report"
    assert (output / "ablation.csv").read_text() == (expected / "ablation.csv").read_text()
    ours, theirs = (
        (d / "ablation.md").read_text().split("\n\nTest set:") for d in (output, expected)
    )
    assert ours[0] == theirs[0]  # the tables, the one reported apart included
    harness = [line for line in ours[1].splitlines() if line.startswith("Harness check")]
    assert harness == [line for line in theirs[1].splitlines() if line.startswith("Harness check")]
    assert len(harness) == 2 and all("equal, as they must be" in line for line in harness)
    assert sorted(p.name for p in output.iterdir()) == [
        "ablation.csv",
        "ablation.md",
        "ablation.png",
    ]
    assert list(elsewhere.iterdir()) == []  # no outputs/ run directory, no log file
    assert sorted(p.relative_to(sweep) for p in sweep.rglob("*")) == before


def test_roles_come_from_configs_not_names(tmp_path: Path) -> None:
    """A preset a user adds under any name is a harness check when its model computes the
    baseline's, and reported apart when it sees the future; baseline= picks the reference."""
    fake_run(tmp_path / "0_standard", "standard", 30.0)
    fake_run(tmp_path / "1_copy", "standard", 30.0, overrides=("model.attention.name=my_copy",))
    leak = ("model.attention.name=peeking", "model.attention.allow_future_leak=true")
    fake_run(tmp_path / "2_leak", "standard", 90.0, 1, REFERENCES, overrides=leak)
    fake_run(tmp_path / "3_heads", "cross_heads_8", 29.0)
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "ablation.md").read_text()
    assert "Harness check, seed 1: my_copy's hypotheses and standard's are equal" in text
    assert "cross_heads_8's hypotheses" not in text  # 8 heads is another model
    table, apart = text.split("Reported apart (sees later target tokens; not tested):")
    assert "| peeking |" in apart and "| peeking |" not in table
    assert table_rows(tmp_path / "ablation.md")["peeking"][9:] == ["", ""]

    result = report(f"sweep={tmp_path}", "baseline=cross_heads_8")
    assert result.returncode == 0, result.stderr
    rows = table_rows(tmp_path / "ablation.md")
    assert "Δ test BLEU vs cross_heads_8 [95% CI]" in (tmp_path / "ablation.md").read_text()
    assert rows["standard"][10] == "1.000" and rows["cross_heads_8"][9:] == ["", ""]
    assert "Harness check" not in (tmp_path / "ablation.md").read_text()

    result = report(f"sweep={tmp_path}", "baseline=standrd")
    assert result.returncode == 0, result.stderr
    assert (
        "No standrd run (baseline=standrd; variants here: standard, my_copy"
        in (tmp_path / "ablation.md").read_text()
    )


def run_dir(tmp_path: Path, name: str, rows: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "metrics.csv").write_text(HEADER + rows)
    return directory


def test_runs_table_at_every_validated_step_with_best_so_far(tmp_path: Path) -> None:
    fast = run_dir(tmp_path, "fast", "0,10,5.0,\n0,10,,3.5\n1,20,,2.25\n2,30,,4.0\n")
    slow = run_dir(tmp_path, "slow", "0,10,,3.0\n1,20,,3.75\n")
    result = report(f"runs={{bf16:{fast},fp32:{slow}}}", f"output={tmp_path / 'c'}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "| step | bf16 val BLEU (best so far) | fp32 val BLEU (best so far) |"
    )
    assert result.stdout.splitlines()[2:] == [
        "| 10 | 3.50 (3.50) | 3.00 (3.00) |",
        "| 20 | 2.25 (3.50) | 3.75 (3.75) |",
        "| 30 | 4.00 (4.00) | - |",
    ]
    assert (tmp_path / "c" / "validation_bleu.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "c" / "validation_bleu.md").read_text() == result.stdout
    listed = report(f"runs=[{fast},{slow}]")
    assert listed.returncode == 0 and f"| step | {fast} val BLEU (best so far) |" in listed.stdout


def test_runs_whose_epochs_end_at_different_updates_still_compare(tmp_path: Path) -> None:
    """Another vocabulary changes the updates per epoch: no update is shared, yet every
    validation gets a row, with each run's best up to it."""
    eight = run_dir(tmp_path, "eight", "0,130,,20.5\n1,260,,28.5\n")
    ten = run_dir(tmp_path, "ten", "0,127,,21.75\n1,254,,19.0\n2,381,,30.0\n")
    result = report(f"runs={{v8k:{eight},v10k:{ten}}}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2:] == [
        "| 127 | - | 21.75 (21.75) |",
        "| 130 | 20.50 (20.50) | - (21.75) |",
        "| 254 | - (20.50) | 19.00 (21.75) |",
        "| 260 | 28.50 (28.50) | - (21.75) |",
        "| 381 | - | 30.00 (30.00) |",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ((), "give either sweep=<multirun dir> (an ablation report) or runs="),
        (("sweep=a", "runs=[b]"), "not both or neither"),
        (("runs=[]",), "config key 'runs': []: name run directories"),
    ],
)
def test_bad_report_arguments_name_the_fix(overrides, message, tmp_path: Path) -> None:
    result = report(*overrides, cwd=tmp_path)
    assert result.returncode == 1 and message in result.stderr


def test_runs_without_validation_bleu_and_empty_sweeps_are_named(tmp_path: Path) -> None:
    empty = run_dir(tmp_path, "empty", "0,10,5.0,\n")
    result = report(f"runs=[{empty}]")
    assert result.returncode == 1 and f"{empty}/metrics.csv has no val/bleu" in result.stderr
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 1 and f"no finished runs (*/run_summary.json) under {tmp_path}" in (
        result.stderr
    )
