"""`python -m seq2seq.prepare` as a user runs it: summary on real data, clear errors, exit codes."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest
from helpers import run, toy_overrides


def run_prepare(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run("prepare", cwd, *overrides)


@pytest.mark.slow
def test_prepare_multi30k_cold_then_warm(shared_data: Path, tmp_path: Path) -> None:
    overrides = (f"paths.data_dir={shared_data}", f"paths.cache_dir={tmp_path / 'cache'}")
    cold = run_prepare(tmp_path, *overrides)
    assert cold.returncode == 0, cold.stderr
    assert "vocabulary 8000 joint (bpe)" in cold.stdout
    train_row = next(line for line in cold.stdout.splitlines() if "│ train " in line)
    cells = [c.strip() for c in train_row.strip("│ ").split("│")]
    assert cells[:6] == ["train", "29000", "28998", "0", "0", "2"]
    assert float(cells[-1].rstrip("%")) < 10.0
    assert "built: tokenizer, train, val, test_2016_flickr" in cold.stdout
    assert "train: 28998 pairs kept of 29000" in cold.stderr + cold.stdout

    warm = run_prepare(tmp_path, *overrides)
    assert warm.returncode == 0, warm.stderr
    assert "built: nothing (all from cache)" in warm.stdout
    assert train_row in warm.stdout

    both = run_prepare(tmp_path, *overrides, "data.bidirectional_epochs=2")
    assert train_row in both.stdout  # the table: the epochs after them, the pairs as given
    batches = int(cells[-3])
    line = next(x for x in both.stdout.splitlines() if x.startswith("train, epochs 0-1 "))
    reversed_too = int(line.split("reversed, ")[1].split(" batches")[0])
    assert 1.8 * batches < reversed_too < 2.1 * batches


def test_unknown_key_fails_with_its_name(tmp_path: Path) -> None:
    result = run_prepare(tmp_path, "+data.max_token=10")
    assert result.returncode == 1
    assert "error: config key 'data.max_token'" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_data_fails_naming_file_and_line(toy_files: Path, tmp_path: Path) -> None:
    (toy_files / "val.tgt").write_bytes(gzip.decompress(gzip.compress(b"ok\n\xff\xfe\n")))
    result = run_prepare(tmp_path, *toy_overrides(toy_files, tmp_path / "cache"))
    assert result.returncode == 1
    assert f"error: {toy_files / 'val.tgt'}, line 2: not valid UTF-8" in result.stderr
    assert "Traceback" not in result.stderr
