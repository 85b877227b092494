"""scripts/compare_runs.py: validation BLEU of runs at equal updates, as a table and a plot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"
HEADER = "epoch,step,train/loss,val/bleu\n"


def run_dir(tmp_path: Path, name: str, rows: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "metrics.csv").write_text(HEADER + rows)
    return directory


def compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_table_at_common_steps_with_best_so_far(tmp_path: Path) -> None:
    fast = run_dir(tmp_path, "fast", "0,10,5.0,\n0,10,,3.5\n1,20,,2.25\n2,30,,4.0\n")
    slow = run_dir(tmp_path, "slow", "0,10,,3.0\n1,20,,3.75\n")
    result = compare(f"bf16={fast}", f"fp32={slow}", f"--output={tmp_path / 'c.png'}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2:] == [
        "| 10 | 3.50 (3.50) | 3.00 (3.00) |",
        "| 20 | 2.25 (3.50) | 3.75 (3.75) |",
    ]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_arguments_name_the_fix(tmp_path: Path) -> None:
    result = compare(str(tmp_path))
    assert result.returncode == 2 and "write LABEL=RUN_DIR" in result.stderr
    empty = run_dir(tmp_path, "empty", "0,10,5.0,\n")
    result = compare(f"a={empty}")
    assert result.returncode == 1 and f"{empty}/metrics.csv has no val/bleu" in result.stderr
