"""`trainer.precision=auto`: its choice on each kind of hardware (capability checks mocked, so
the tests do not depend on the machine), explicit values, the log line and run_summary."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from helpers import compose_config, toy_overrides

from seq2seq.training.precision import auto_precision, resolve_precision
from seq2seq.training.run import train


def hardware(
    monkeypatch: pytest.MonkeyPatch,
    *,
    cuda: bool = False,
    cuda_bf16: bool = False,
    amx: bool = False,
    avx512_bf16: bool = False,
) -> None:
    """Pretend torch's capability checks report this machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: cuda_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ({"cuda": True, "cuda_bf16": True}, "bf16-mixed"),
        ({"cuda": True, "cuda_bf16": False, "amx": True}, "32-true"),  # the GPU decides
        ({"amx": True, "avx512_bf16": True}, "bf16-mixed"),
        ({"avx512_bf16": True}, "bf16-mixed"),
        ({}, "32-true"),  # AVX2 only
    ],
    ids=["gpu-bf16", "gpu-no-bf16", "cpu-amx", "cpu-avx512-bf16", "cpu-avx2"],
)
def test_auto_picks_bf16_only_where_the_hardware_has_bf16_units(
    monkeypatch: pytest.MonkeyPatch, machine: dict, expected: str
) -> None:
    hardware(monkeypatch, **machine)
    assert auto_precision("auto").precision == expected


def test_a_cpu_accelerator_ignores_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    hardware(monkeypatch, cuda=True, cuda_bf16=True)
    assert auto_precision("cpu").precision == "32-true"


def test_auto_is_the_default_and_an_explicit_value_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    hardware(monkeypatch, amx=True)
    assert compose_config().trainer["precision"] == "auto"
    assert resolve_precision(compose_config().trainer).precision == "bf16-mixed"
    explicit = compose_config(["trainer.precision=32-true"]).trainer
    assert resolve_precision(explicit).precision == "32-true"
    assert compose_config(["trainer=gpu"]).trainer["precision"] == "bf16-mixed"


def tiny_run(toy_files: Path, tmp_path: Path, precision: str) -> dict:
    overrides = [
        *toy_overrides(toy_files, tmp_path / "cache"),
        "model=transformer_tiny",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.num_sanity_val_steps=0",
        "average_last=0",
        "evaluate_after=false",
        f"trainer.precision={precision}",  # after toy_overrides' 32-true pin: wins
    ]
    return train(compose_config(overrides), tmp_path / "run")


@pytest.mark.slow
def test_train_logs_the_choice_and_its_reason_and_records_the_precision(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    hardware(monkeypatch)  # a CPU without bf16 units
    with caplog.at_level(logging.INFO, logger="seq2seq.train"):
        summary = tiny_run(toy_files, tmp_path, "auto")
    assert "trainer.precision=32-true: auto: a CPU without bf16 units" in caplog.text
    assert summary["precision"] == "32-true"


@pytest.mark.slow
def test_bf16_mixed_trains_on_a_cpu(toy_files: Path, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="seq2seq.train"):
        summary = tiny_run(toy_files, tmp_path, "bf16-mixed")
    assert "trainer.precision=bf16-mixed: set explicitly" in caplog.text
    assert summary["precision"] == "bf16-mixed"
    assert summary["steps"] == 3 and math.isfinite(summary["train_loss"])
