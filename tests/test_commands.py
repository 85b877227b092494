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
