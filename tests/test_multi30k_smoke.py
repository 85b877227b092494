"""The one real-data run in CI: the tiny preset on Multi30k through train, then evaluate."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FP32

pytestmark = pytest.mark.slow


def test_tiny_model_learns_multi30k_through_train_and_evaluate(shared_data: Path, tmp_path):
    common = [
        f"paths.data_dir={shared_data}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "experiment=smoke",
        FP32,
    ]
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "seq2seq.train",
            *common,
            "trainer.max_epochs=2",
            "trainer.limit_train_batches=150",
            "optim.lr=2e-3",
            "optim.warmup_steps=100",
            "average_last=2",
            "prefer_checkpoint=last",
            "evaluate_after=false",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    with open(tmp_path / "run" / "metrics.csv") as f:
        validation = [row for row in csv.DictReader(f) if row["val/bleu"]]
    losses = [float(row["val/loss"]) for row in validation]
    assert len(losses) == 2 and losses[1] < losses[0]
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    choice = summary["final_checkpoint_choice"]
    assert set(choice["val_bleu"]) == {"best", "last", "averaged"}  # each decoded with beam 5
    assert set(choice["p_values"]) == {"best", "averaged"}  # each against the preferred last
    assert Path(summary["final_checkpoint"]).name == f"{choice['chosen']}.ckpt"

    ckpt = tmp_path / "run" / "checkpoints" / "averaged.ckpt"
    evaluate = subprocess.run(
        [sys.executable, "-m", "seq2seq.evaluate", f"ckpt_path={ckpt}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    scores = json.loads(
        (ckpt.parent / "averaged.test_2016_flickr.beam5-lp1.scores.json").read_text()
    )
    test = scores["test_sets"]["test_2016_flickr"]
    assert test["sentences"] == 1000
    assert test["bleu"] > 1.0  # 300 updates of a 0.4M-parameter model: learning, not quality
    hypotheses = (ckpt.parent / "averaged.test_2016_flickr.beam5-lp1.hyp").read_text()
    assert hypotheses.count("\n") == 1000
