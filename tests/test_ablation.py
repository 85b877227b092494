"""The ablation suite: every preset composes and builds, the report tabulates runs (and refuses
incomplete ones), and the multirun works end to end (docs/attention.md, "Ablation suite")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, SPECIAL_IDS, compose_config, config_of, few_pairs_overrides, random_batch

from seq2seq.config import config_to_dict
from seq2seq.model.config import ModelConfig
from seq2seq.model.transformer import Transformer

VOCAB = 40


@pytest.mark.parametrize(
    "variant", sorted(p.stem for p in (ROOT / "conf" / "ablation").glob("*.yaml"))
)
def test_every_ablation_preset_composes_and_builds(variant: str) -> None:
    config = compose_config([f"+ablation={variant}", "model=transformer_tiny"])
    assert config.model.attention.name == variant
    m = Transformer(config.model, VOCAB, VOCAB, True, **SPECIAL_IDS).eval()
    src, tgt = random_batch(VOCAB)
    assert m(src, tgt).shape == (3, 7, VOCAB)


def fake_run(directory: Path, variant: str, bleu: float, cross: dict) -> None:
    (directory / ".hydra").mkdir(parents=True)
    standard = config_of("model/transformer_tiny", ModelConfig).attention
    attention = {**config_to_dict(standard), "name": variant}
    attention["cross"].update(cross)
    config = {"model": {"attention": attention}, "data": {"test_sets": ["test_2016_flickr"]}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    test = {"bleu": bleu, "chrf": bleu + 20, "bleu_signature": "nrefs:1|case:mixed|tok:13a"}
    summary = {
        "variant": variant,
        "parameters": 1_500_000,
        "train_seconds": 900.0,
        "train_loss": 2.5,
        "best_val_bleu": bleu - 1,
        "test": {"test_2016_flickr": test},
    }
    (directory / "run_summary.json").write_text(json.dumps(summary))


def test_ablation_report_tabulates_runs_and_refuses_incomplete_ones(tmp_path: Path) -> None:
    fake_run(tmp_path / "0_standard", "standard", 30.5, {"query": "target", "key_value": "source"})
    fake_run(
        tmp_path / "1_swapped", "swapped_cross", 12.25, {"query": "source", "key_value": "target"}
    )
    script = [sys.executable, str(ROOT / "scripts" / "ablation_report.py"), str(tmp_path)]
    result = subprocess.run(script, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "ablation.md").read_text().splitlines()
    assert table[2].startswith("| standard | enc s/s, dec t/t, cross t/s; scaled_dot")
    assert "| 1.50M | 29.50 | 30.50 | 50.50 | 2.500 | 15.0 |" in table[2]
    assert table[3].startswith("| swapped_cross | enc s/s, dec t/t, cross s/t")
    assert (tmp_path / "ablation.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "ablation.csv").read_text().splitlines()) == 3

    result = subprocess.run([*script, "--test-set", "test_2017"], capture_output=True, text=True)
    assert result.returncode != 0
    assert "has no scores for test set 'test_2017'; it has ['test_2016_flickr']" in result.stderr

    (tmp_path / "2_broken" / ".hydra").mkdir(parents=True)
    result = subprocess.run(script, capture_output=True, text=True)
    assert result.returncode != 0
    assert "2_broken is incomplete: run_summary.json is missing" in result.stderr


def test_ablation_multirun_end_to_end(shared_data: Path, tmp_path: Path) -> None:
    """The suite's command on 40 Multi30k pairs: one run dir per variant, then the report."""

    from seq2seq.data.corpus import read_lines

    for side, lang in (("src", "en"), ("tgt", "de")):
        lines = read_lines(shared_data / "multi30k" / f"train.{lang}.gz")[:40]
        (tmp_path / f"pairs.{side}").write_text("".join(line + "\n" for line in lines))
    sweep = tmp_path / "sweep"
    train = [sys.executable, "-m", "seq2seq.train", "-m", "+ablation=standard,swapped_cross"]
    overrides = few_pairs_overrides(tmp_path, tmp_path / "cache")
    budget = ["trainer.max_epochs=2", "average_last=2", f"hydra.sweep.dir={sweep}"]
    result = subprocess.run(
        [*train, *overrides, *budget], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert runs == ["0_standard", "1_swapped_cross"]
    report = [sys.executable, str(ROOT / "scripts" / "ablation_report.py"), str(sweep)]
    result = subprocess.run(report, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    table = (sweep / "ablation.md").read_text()
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert sorted(row.split(" | ")[0] for row in rows) == ["| standard", "| swapped_cross"]
    assert "Test set: test;" in table
