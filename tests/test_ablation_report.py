"""seq2seq.analysis.ablation called in this process on finished run directories (the command
`python -m seq2seq.report sweep=...` is tested in test_ablation.py and test_report.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import REFERENCES, fake_run

from seq2seq.analysis.ablation import ablation_report
from seq2seq.errors import DataError


def test_variants_are_ranked_by_test_bleu_and_compared_with_the_baseline(tmp_path: Path) -> None:
    for seed, bleu in ((1, 30.0), (2, 31.0)):
        fake_run(tmp_path / f"standard_{seed}", "standard", bleu, seed)
    fake_run(tmp_path / "swapped_1", "swapped_cross", 40.0, 1, REFERENCES)
    markdown = ablation_report(tmp_path, "standard", output=tmp_path / "out")
    assert markdown == tmp_path / "out" / "ablation.md"
    with open(tmp_path / "out" / "ablation.csv") as f:
        rows = list(csv.reader(f))
    assert [row[0] for row in rows[1:]] == ["swapped_cross", "standard"]  # by test BLEU
    assert "30.50" in markdown.read_text()  # the baseline's mean over its two seeds


def test_a_sweep_without_finished_runs_is_named(tmp_path: Path) -> None:
    (tmp_path / "0_standard" / ".hydra").mkdir(parents=True)
    with pytest.raises(DataError, match=f"no finished runs .* under {tmp_path}"):
        ablation_report(tmp_path, "standard")


def test_multilingual_runs_are_reported_per_direction(tmp_path: Path) -> None:
    runs = (("standard_1", "standard", 30.0, 20.0), ("swapped_1", "swapped_cross", 40.0, 10.0))
    for name, preset, de, fr in runs:
        directory = tmp_path / name
        fake_run(directory, preset, de, 1, REFERENCES, ("data.directions=[en-de,en-fr]",))
        summary = json.loads((directory / "run_summary.json").read_text())
        test = summary["test"].pop("test_2016_flickr")
        for direction, bleu in (("en-de", de), ("en-fr", fr)):
            summary["test"][f"test_2016_flickr.{direction}"] = {**test, "bleu": bleu}
        (directory / "run_summary.json").write_text(json.dumps(summary))
    index = ablation_report(tmp_path, "standard", output=tmp_path / "out")
    assert index == tmp_path / "out" / "ablation.md"
    for direction, first in (("en-de", "swapped_cross"), ("en-fr", "standard")):
        test_set = f"test_2016_flickr.{direction}"
        with open(tmp_path / "out" / test_set / "ablation.csv") as f:
            assert next(csv.DictReader(f))["variant"] == first  # by that direction's BLEU
        assert f"[{test_set}/ablation.md]({test_set}/ablation.md)" in index.read_text()
    with pytest.raises(DataError, match="a test set per direction .* name one with test_set"):
        ablation_report(tmp_path, "standard", references=tmp_path / "references.de")
    one = ablation_report(tmp_path, "standard", "test_2016_flickr.en-fr", output=tmp_path / "fr")
    assert one == tmp_path / "fr" / "ablation.md"
