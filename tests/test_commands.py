"""The suite's forked commands (tests/commands.py) behave as a fresh `python` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import python

SCRIPT = """
import os, signal, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0], "name", __name__)
print("variable", os.environ.get("SEQ2SEQ_TEST_VARIABLE"), "stdin", sys.stdin.read().split())
print("to stderr: é", file=sys.stderr)
how = sys.argv[1]
if how == "status":
    sys.exit(3)
if how == "message":
    sys.exit("stopped: a message")
if how == "raise":
    raise ValueError("uncaught")
if how == "thread":  # an interpreter waits for its threads, then runs atexit
    import atexit, threading, time
    atexit.register(print, "atexit ran")
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread done"))).start()
if how == "pool":  # the platform's start method, as in a fresh interpreter
    import concurrent.futures, multiprocessing
    pool = concurrent.futures.ProcessPoolExecutor(1)
    print("pool", pool.submit(abs, -2).result(), multiprocessing.get_start_method())
if how == "kill":
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["return", "status", "message", "raise", "thread", "pool", "kill"])
def test_a_script_runs_as_in_a_fresh_interpreter(how: str, tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "script.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    arguments = [str(script), how, "two words"]
    env = {"SEQ2SEQ_TEST_VARIABLE": "set"}
    fresh = subprocess.run(
        [sys.executable, *arguments],
        cwd=work,
        input="from stdin",
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    forked = python(*arguments, cwd=work, stdin="from stdin", env=env, timeout=60)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    assert forked.stderr.splitlines()[0] == fresh.stderr.splitlines()[0] == "to stderr: é"


def test_a_module_runs_as_python_dash_m(tmp_path: Path) -> None:
    fresh = subprocess.run(
        [sys.executable, "-m", "seq2seq"], cwd=tmp_path, capture_output=True, text=True
    )
    forked = python("-m", "seq2seq", cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert "seq2seq-train" in forked.stdout


@pytest.mark.skipif(
    int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2,
    reason="runs in pytest-xdist's workers only (pyproject's -n auto; not under -n 0)",
)
def test_a_worker_and_the_commands_it_starts_get_their_share_of_the_threads(
    tmp_path: Path,
) -> None:
    """conftest.py: with `-n auto` on N CPUs, each of the N workers runs on 1 thread, and so do
    the commands its tests start, through thread_budget (`threads: null`)."""
    import torch

    from seq2seq.concurrency import usable_cpus

    share = max(1, usable_cpus() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    assert torch.get_num_threads() == share
    probe = tmp_path / "probe.py"
    probe.write_text("from seq2seq.concurrency import thread_budget\nprint(thread_budget(None))\n")
    forked = python(probe)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.split() == [str(share)]
