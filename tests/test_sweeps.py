"""Runs side by side (docs/sweeps.md): launcher choices and the missing-plugin message, threads
per run, caches built once by processes racing on a cold cache (one of them killed mid-way),
run directories held by one live process, a sweep whose failed run does not stop the others,
and a failed run's model freed before its worker's next run."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from commands import ForkedPython
from helpers import (
    CONF_DIR,
    compose_config,
    few_pairs_overrides,
    python,
    run,
    start_python,
)
from hydra import compose, initialize_config_dir
from torch import nn

from seq2seq.cli import LAUNCHER_EXTRAS
from seq2seq.concurrency import (
    RunDirectory,
    build_lock,
    release_run_memory,
    thread_budget,
    usable_cpus,
)
from seq2seq.config import config_to_dict
from seq2seq.errors import ConfigError, install_hint
from seq2seq.upgrade import load_config

LAUNCHERS = {
    "basic": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "joblib": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "submitit_local": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
}


@pytest.mark.parametrize("choice", sorted(LAUNCHERS))
def test_every_launcher_choice_composes(choice: str) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[f"hydra/launcher={choice}", "experiment=ablation_cpu"],
            return_hydra_config=True,
        )
    assert cfg.hydra.launcher._target_ == LAUNCHERS[choice]
    assert set(LAUNCHER_EXTRAS) == set(LAUNCHERS) - {"basic"}


def test_a_launcher_whose_plugin_is_missing_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from seq2seq.train import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if "joblib_launcher" in name else find_spec(name, *args),
    )
    monkeypatch.setattr(sys, "argv", ["train", "-m", "hydra/launcher=joblib", "seed=1,2"])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 1
    assert capsys.readouterr().err == (
        "error: hydra/launcher=joblib needs the hydra-joblib-launcher plugin, an optional extra: "
        f"{install_hint('sweep')}\n"
    )
    assert 'pip install "hydra-joblib-launcher' in install_hint("sweep")


def test_a_config_from_before_threads_still_loads() -> None:
    saved = config_to_dict(compose_config(["threads=2"]))
    del saved["threads"]
    assert load_config(saved).threads is None  # the launcher's share, as before the key
    assert compose_config(["threads=2"]).threads == 2
    with pytest.raises(ConfigError, match="config key 'threads': must be >= 1"):
        compose_config(["threads=0"])


def test_threads_come_from_the_setting_then_the_launcher_then_the_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert thread_budget(5) == 5
    assert thread_budget(None) == 3  # what joblib grants each worker: cores / jobs
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert thread_budget(None) == usable_cpus()


HOLD = """
import sys, time
from pathlib import Path
from seq2seq.concurrency import RunDirectory
RunDirectory(Path(sys.argv[1])).hold()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # starts a process that holds the directory
def test_a_live_runs_directory_is_refused_and_a_killed_ones_taken_again(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=f"another live run \\(process {holder.pid}\\)"):
            RunDirectory(tmp_path).hold()
    finally:
        holder.send_signal(signal.SIGKILL)  # the kernel drops its lock with it
        holder.wait()
    directory = RunDirectory(tmp_path)
    directory.hold()
    directory.release()


@pytest.mark.slow  # starts a process that holds the directory
def test_train_refuses_a_run_directory_in_use(tmp_path: Path) -> None:
    held = RunDirectory(tmp_path / "run")
    held.hold()
    try:
        result = run("train", tmp_path, f"hydra.run.dir={tmp_path / 'run'}")
    finally:
        held.release()
    assert result.returncode == 1
    assert f"hydra.run.dir={tmp_path / 'run'}: another live run (process {os.getpid()})" in (
        result.stderr
    )


def test_default_run_directories_differ_for_processes_started_in_the_same_second() -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    assert cfg.hydra.run.dir.endswith(f"-{os.getpid()}")
    assert cfg.hydra.sweep.dir.endswith(f"-{os.getpid()}")


def test_build_lock_removes_what_a_killed_builder_left(tmp_path: Path) -> None:
    target = tmp_path / "encoded" / "train-0123"
    leftover = tmp_path / "encoded" / ".train-0123.x1y2.part"
    (leftover / "src.npy").parent.mkdir(parents=True)
    (leftover / "src.npy").write_bytes(b"half")
    other = tmp_path / "encoded" / ".val-4567.x1y2.part"  # another key's: not this lock's
    other.mkdir()
    with build_lock(target):
        assert not leftover.exists() and other.exists()


def prepare_processes(shared_data: Path, cache: Path, count: int) -> list[ForkedPython]:
    overrides = [
        f"paths.data_dir={shared_data}",
        f"paths.cache_dir={cache}",
        "tokenizer.vocab_size=2000",
        "threads=1",
    ]
    return [
        start_python("-m", "seq2seq.prepare", *overrides, cwd=cache.parent) for _ in range(count)
    ]


def built_by(processes: list[ForkedPython]) -> list[str]:
    """What the processes say they built (`built: ...`) together, all of them having
    succeeded: each may have built some of the parts while others waited."""
    built = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        said = out.rsplit("built: ", 1)[1].split(";")[0]
        built += [] if said == "nothing (all from cache)" else said.split(", ")
    return sorted(built)


@pytest.mark.slow
def test_processes_racing_on_a_cold_cache_build_it_once(shared_data: Path, tmp_path: Path) -> None:
    built = built_by(prepare_processes(shared_data, tmp_path / "cache", 4))
    assert built == ["test_2016_flickr", "tokenizer", "train", "val"]  # each part once
    assert len(list((tmp_path / "cache" / "tokenizer").iterdir())) == 2  # the model, its lock
    assert not list((tmp_path / "cache").rglob("*.part"))


@pytest.mark.slow
def test_a_builder_killed_mid_way_leaves_a_cache_the_next_runs_finish(
    shared_data: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    (first,) = prepare_processes(shared_data, cache, 1)
    deadline = time.monotonic() + 300
    while not list((cache / "encoded").glob(".multi30k-train-*.part")):  # encoding the split
        assert first.poll() is None and time.monotonic() < deadline, "never began encoding"
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert list((cache / "encoded").glob(".multi30k-train-*.part"))  # what it left
    built = built_by(prepare_processes(shared_data, cache, 3))
    assert built == ["test_2016_flickr", "train", "val"]  # the tokenizer came before the kill
    assert not list(cache.rglob("*.part"))
    counts = json.loads(next((cache / "encoded").glob("multi30k-train-*/counts.json")).read_text())
    assert counts["total"] == 29000


def sweep_of_few_pairs(shared_data: Path, directory: Path) -> list[str]:
    """`python -m seq2seq.train -m` and the overrides of a tiny model on 40 Multi30k pairs
    written to `directory`."""
    from seq2seq.data.corpus import read_lines

    for side, lang in (("src", "en"), ("tgt", "de")):
        lines = read_lines(shared_data / "multi30k" / f"train.{lang}.gz")[:40]
        (directory / f"pairs.{side}").write_text("".join(line + "\n" for line in lines))
    return ["-m", "seq2seq.train", "-m", *few_pairs_overrides(directory, directory / "cache")]


@pytest.mark.slow
def test_a_failed_run_of_a_sweep_does_not_stop_the_others(
    shared_data: Path, tmp_path: Path
) -> None:
    """The first job's config cannot work (3 heads do not divide transformer_tiny's d_model
    64); the second still trains, and the failure is recorded for the report."""
    command = [
        *sweep_of_few_pairs(shared_data, tmp_path),
        "model.heads=3,2",
        "trainer.max_epochs=1",
        "average_last=0",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.sweep.subdir=${hydra.job.num}",
    ]
    result = python(*command, cwd=tmp_path)
    assert result.returncode == 1
    failed = (tmp_path / "sweep" / "0" / "failed.txt").read_text()
    assert failed.startswith("ConfigError: config key 'model.heads'")
    assert (tmp_path / "sweep" / "1" / "run_summary.json").is_file()
    assert not (tmp_path / "sweep" / "1" / "failed.txt").exists()


def test_a_failed_runs_model_is_freed_before_the_workers_next_run() -> None:
    """Hydra's job runner keeps a failed run's error in the job's result, a local of its own
    frame, which the error's traceback holds: a cycle that reference counting never frees, and
    with it the run's model, until the collector runs."""
    models: list[weakref.ref] = []

    def failing_run() -> None:
        model = nn.Linear(4, 4)
        models.append(weakref.ref(model))
        raise RuntimeError("CUDA out of memory")

    def run_job() -> dict:
        result = {}
        try:
            failing_run()
        except RuntimeError as error:
            result["return_value"] = error
        return result

    gc.disable()  # the collector would otherwise run at an unknown moment
    try:
        run_job()  # the launcher sends the result back and drops it
        assert models[0]() is not None
        release_run_memory()
        assert models[0]() is None
    finally:
        gc.enable()


@pytest.mark.slow
def test_a_joblib_sweeps_runs_start_loader_workers(shared_data: Path, tmp_path: Path) -> None:
    """Inside a joblib worker multiprocessing defaults to loky's processes, which a DataLoader
    could not start: every run with data.num_workers > 0 failed."""
    command = [
        *sweep_of_few_pairs(shared_data, tmp_path),
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "seed=1,2",
        "data.num_workers=1",
        "trainer.max_epochs=1",
        "average_last=0",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.sweep.subdir=${seed}",
    ]
    result = python(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for seed in (1, 2):
        summary = tmp_path / "sweep" / str(seed) / "run_summary.json"
        assert json.loads(summary.read_text())["steps"] > 0


@pytest.mark.slow
def test_a_submitit_sweep_runs_and_its_rerun_skips_the_finished_run(
    shared_data: Path, tmp_path: Path
) -> None:
    """hydra/launcher=submitit_local: the submitit path (as on SLURM) without a cluster."""
    command = [
        *sweep_of_few_pairs(shared_data, tmp_path),
        "hydra/launcher=submitit_local",
        "trainer.max_epochs=1",
        "average_last=0",
        "threads=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    result = python(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = tmp_path / "sweep" / "0_standard_seed1234" / "run_summary.json"
    written = summary.read_bytes()
    assert json.loads(written)["steps"] > 0
    result = python(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "sweep" / "0_standard_seed1234" / "train.log").read_text()
    assert "has finished (run_summary.json): skipped" in log
    assert summary.read_bytes() == written


@pytest.mark.slow
def test_data_parallel_training_inside_a_joblib_sweep_is_refused(tmp_path: Path) -> None:
    command = [
        "-m",
        "seq2seq.train",
        "-m",
        "hydra/launcher=joblib",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.sweep.subdir=${hydra.job.num}",
    ]
    result = python(*command, cwd=tmp_path)
    assert result.returncode == 1
    failed = (tmp_path / "sweep" / "0" / "failed.txt").read_text()
    assert failed.startswith(
        "ConfigError: trainer: data-parallel training (strategy, devices or num_nodes) cannot "
        "run inside hydra/launcher=joblib"
    )
    assert not (tmp_path / "sweep" / "0" / "checkpoints").exists()  # refused before training
