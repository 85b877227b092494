"""seq2seq-train starts itself again under tcmalloc (seq2seq.allocator): when, how, and the
errors of SEQ2SEQ_ALLOCATOR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run, toy_overrides

from seq2seq.allocator import (
    VARIABLE,
    allocator_description,
    find_tcmalloc,
    restart_command,
    restart_under_tcmalloc,
)
from seq2seq.errors import ConfigError

ARGV = ["python", "-m", "seq2seq.train", "seed=1"]
LIBRARY = "/usr/lib/libtcmalloc_minimal.so.4"


def test_auto_restarts_the_same_command_with_tcmalloc_preloaded_before_the_users_libraries() -> (
    None
):
    environ = {"LD_PRELOAD": "/opt/libmine.so", "HOME": "/home/u"}
    argv, restarted = restart_command(environ, "system", LIBRARY, ARGV)
    assert argv == [sys.executable, "-m", "seq2seq.train", "seed=1"]
    assert restarted == {"LD_PRELOAD": f"{LIBRARY}:/opt/libmine.so", "HOME": "/home/u"}
    assert restart_command({VARIABLE: "tcmalloc"}, "system", LIBRARY, ARGV)[1] == {
        VARIABLE: "tcmalloc",
        "LD_PRELOAD": LIBRARY,
    }


@pytest.mark.parametrize(
    ("environ", "in_use", "library"),
    [
        ({VARIABLE: "system"}, "system", LIBRARY),  # asked for the system's
        ({}, "tcmalloc", LIBRARY),  # restarted already
        ({}, "jemalloc", LIBRARY),  # the user preloaded another allocator
        ({}, "system", None),  # none on this machine: auto goes on without
        ({"LD_PRELOAD": LIBRARY}, "system", LIBRARY),  # preloaded, but the loader refused it
    ],
)
def test_no_restart(environ: dict, in_use: str, library: str | None) -> None:
    assert restart_command(environ, in_use, library, ARGV) is None


def test_a_required_tcmalloc_that_is_missing_or_refused_says_how_to_get_it() -> None:
    with pytest.raises(ConfigError, match=r"tcmalloc was not found: install tcmalloc .*apt"):
        restart_command({VARIABLE: "tcmalloc"}, "system", None, ARGV)
    with pytest.raises(ConfigError, match=rf"\({LIBRARY}\) could not be preloaded"):
        restart_command({VARIABLE: "tcmalloc", "LD_PRELOAD": LIBRARY}, "system", LIBRARY, ARGV)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tcmalloc is preloaded on Linux")
def test_the_log_says_why_a_run_trains_under_the_system_allocator() -> None:
    assert allocator_description("tcmalloc", {}, LIBRARY) == "tcmalloc"
    assert allocator_description("system", {VARIABLE: "system"}, LIBRARY) == "system"
    assert "apt install libtcmalloc-minimal4" in allocator_description("system", {}, None)
    assert "not when a Python session calls main()" in allocator_description("system", {}, LIBRARY)


def test_an_unknown_choice_is_refused_before_hydra_starts(tmp_path: Path) -> None:
    result = run("train", tmp_path, "seed=1", env={VARIABLE: "tcmaloc"})
    assert result.returncode == 1
    assert "SEQ2SEQ_ALLOCATOR='tcmaloc'" in result.stderr and "auto, tcmalloc, system" in (
        result.stderr
    )
    assert not (tmp_path / "outputs").exists()  # nothing written


def test_the_command_restarts_before_torch_and_lightning_are_imported() -> None:
    """They are most of the command's start; imported before the restart, they loaded twice."""
    heavy = "{'torch', 'pytorch_lightning'}"
    check = f"import sys, seq2seq.train; print(sorted({heavy} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "[]\n"


TCMALLOC = pytest.mark.skipif(
    not sys.platform.startswith("linux") or find_tcmalloc() is None,
    reason="tcmalloc is not installed (apt install libtcmalloc-minimal4)",
)


@pytest.mark.slow
@TCMALLOC
@pytest.mark.parametrize(
    ("command", "choice", "expected"),
    [
        ("python -m seq2seq.train", "auto", "tcmalloc"),
        ("seq2seq-train", "auto", "tcmalloc"),
        ("python -m seq2seq.train", "system", "system"),
    ],
)
def test_a_run_trains_under_the_allocator_chosen(
    command: str, choice: str, expected: str, toy_files: Path, tmp_path: Path
) -> None:
    result = run(
        "train",
        tmp_path,
        *toy_overrides(toy_files, tmp_path / "cache"),
        "model=transformer_tiny",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "average_last=0",
        "evaluate_after=false",
        "hydra.run.dir=run",
        env={VARIABLE: choice},
        console_script=command == "seq2seq-train",
        fresh_interpreter=True,  # the restart happens before the command runs
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert summary["allocator"] == expected
    log = (tmp_path / "run" / "train.log").read_text()
    assert [line.split(" - ")[-1] for line in log.splitlines() if "memory allocator" in line] == [
        f"memory allocator: {expected}"
    ]


@TCMALLOC
def test_a_python_session_calling_main_is_never_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest here, a notebook for a user: only a process started as the command restarts."""
    monkeypatch.setenv(VARIABLE, "auto")
    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail(f"restarted: {args[1]}"))
    restart_under_tcmalloc()
