"""The `logger=` group: every option composes and builds; metrics.csv is written whatever it is."""

from __future__ import annotations

import csv
import importlib.util
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from helpers import compose_config, run, toy_overrides
from omegaconf import OmegaConf
from pytorch_lightning.loggers import TensorBoardLogger

from seq2seq.config import validate_config
from seq2seq.errors import ConfigError
from seq2seq.training.run import build_logger, train, trainer_arguments
from seq2seq.upgrade import upgrade_config

EXTRAS = {"wandb": "WandbLogger", "mlflow": "MLFlowLogger"}  # option (= package): class


def test_tensorboard_is_the_default_and_writes_into_the_run_dir(tmp_path: Path) -> None:
    logger = build_logger(compose_config(), tmp_path)
    assert isinstance(logger, TensorBoardLogger)
    assert Path(logger.log_dir) == tmp_path / "tensorboard"


def test_logger_none_builds_nothing(tmp_path: Path) -> None:
    config = compose_config(["logger=none"])
    assert config.logger is None
    assert build_logger(config, tmp_path) is None


@pytest.mark.parametrize("option", sorted(EXTRAS))
def test_optional_loggers_build_when_installed_or_name_the_extra(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = compose_config([f"logger={option}"])
    assert config.logger["_target_"] == f"pytorch_lightning.loggers.{EXTRAS[option]}"
    if option == "wandb":
        assert config.logger["offline"] is True  # no network unless asked for
    if importlib.util.find_spec(option) is not None:
        monkeypatch.chdir(tmp_path)
        assert type(build_logger(config, tmp_path)).__name__ == EXTRAS[option]
    monkeypatch.setitem(sys.modules, option, None)  # as if the package were not installed
    with pytest.raises(
        ConfigError, match=rf'needs the {option} package.*pip install -e "\.\[{option}\]"'
    ):
        build_logger(config, tmp_path)


def test_a_missing_extra_stops_train_before_any_work(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    config = compose_config([*toy_overrides(toy_files, tmp_path / "cache"), "logger=mlflow"])
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[mlflow\]"'):
        train(config, tmp_path / "run")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_trainer_logger_is_refused_pointing_at_the_group() -> None:
    with pytest.raises(
        ConfigError, match="'trainer.logger': set by seq2seq.train; choose one with logger="
    ):
        trainer_arguments(compose_config(["+trainer.logger=false"]))


@pytest.mark.slow
def test_a_run_with_logger_none_keeps_metrics_csv_and_the_learning_curve(
    toy_files: Path, tmp_path: Path
) -> None:
    result = run(
        "train",
        tmp_path,
        *toy_overrides(toy_files, tmp_path / "cache"),
        "model=transformer_tiny",
        "logger=none",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=4",
        "trainer.log_every_n_steps=1",
        "average_last=0",
        "evaluate_after=false",
        "hydra.run.dir=run",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert any(row.get("train/loss") for row in rows) and any(row.get("val/bleu") for row in rows)
    # one training rate per epoch, in metrics.csv and in the log
    epoch_rates = [float(row["train/epoch_tok_s"]) for row in rows if row.get("train/epoch_tok_s")]
    assert len(epoch_rates) == 2 and all(rate > 0 for rate in epoch_rates)
    log_lines = (run_dir / "train.log").read_text().splitlines()
    assert [line.split(" - ")[-1].split(":")[0] for line in log_lines if "tokens/s in" in line] == [
        "epoch 0",
        "epoch 1",
    ]
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (run_dir / "tensorboard").exists()


def test_a_config_saved_before_the_logger_group_still_validates() -> None:
    """The config that checkpoints of earlier versions carry: no `logger` key."""
    saved = asdict(compose_config(["logger=none"]))
    del saved["logger"]
    upgraded = validate_config(OmegaConf.create(upgrade_config(saved)))
    assert upgraded.logger == compose_config(["logger=tensorboard"]).logger  # as they ran
    assert asdict(upgraded) == {**saved, "logger": upgraded.logger}
