"""The tests' way of starting `python -m seq2seq.<command>` or a script: forked, not fresh.

A fresh interpreter on a 2-core machine spends 9-10 s importing torch and Lightning before a
command does anything, and most of the suite's slow tests start one or more commands. So each
one runs in a child forked from multiprocessing's fork server: a fresh interpreter that has
imported those libraries and the package's non-command modules once and computed nothing (no
thread pools to inherit). The child takes the caller's working directory, environment, argv and
standard streams, runs the module as `__main__` through runpy as `python -m` does (or the
script, as `python script.py`), ends as an interpreter ends and exits with its status; its
sys.path is pytest's after the one entry `python` would put first. Tests of what happens before
a command runs (the allocator restart, the console scripts, a fresh interpreter's imports)
start a real interpreter instead.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

# imported once by the fork server; no command module (seq2seq.train, seq2seq.evaluate, ...):
# runpy warns when the module it runs as __main__ is already imported
PRELOAD = [
    "torch",
    "pytorch_lightning",
    "hydra",
    "sacrebleu",
    "sentencepiece",
    "seq2seq.training.run",
]

_server = multiprocessing.get_context("forkserver")
_server.set_forkserver_preload(PRELOAD)


class ForkedPython:
    """`python <arguments>` running in a child of the fork server, where `arguments` are
    `-m <module> ...` or `<script> ...`: subprocess.Popen's calls for the tests' commands, with
    standard output and error going to files that `output` reads, as far as written."""

    def __init__(
        self, arguments: list[str], cwd: Path | None, stdin: str | None, environ: dict[str, str]
    ) -> None:
        self.args = [sys.executable, *arguments]
        self._streams = tempfile.TemporaryDirectory(prefix="command-")
        self._paths = {n: Path(self._streams.name) / n for n in ("stdin", "stdout", "stderr")}
        self._paths["stdin"].write_text(stdin or "")
        self._child = _server.Process(
            target=_run_python, args=(arguments, str(cwd or Path.cwd()), environ, self._paths)
        )
        self._child.start()
        self.pid = self._child.pid

    @property
    def returncode(self) -> int | None:
        """The exit status, negative for a signal; None while it runs."""
        return self._child.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signal_number: int) -> None:
        os.kill(self.pid, signal_number)

    def wait(self, timeout: float | None = None) -> int:
        self._child.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def output(self, stream: str) -> str:
        """What it has written to "stdout" or "stderr" so far."""
        return self._paths[stream].read_text(errors="backslashreplace")

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Its standard output and error, once it has exited (killed after `timeout`)."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.join()
            raise
        try:
            return self.output("stdout"), self.output("stderr")
        finally:
            self._streams.cleanup()


def _run_python(
    arguments: list[str], cwd: str, environ: dict[str, str], paths: dict[str, Path]
) -> None:
    """In the child: become `python <arguments>` and exit as it would."""
    multiprocessing.set_start_method(None, force=True)  # the platform's default again
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    for fd, name, flags in (
        (0, "stdin", os.O_RDONLY),
        (1, "stdout", os.O_WRONLY | os.O_CREAT),
        (2, "stderr", os.O_WRONLY | os.O_CREAT),
    ):
        opened = os.open(paths[name], flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, kept open
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    status = 0
    try:
        if arguments[0] == "-m":  # python -m: sys.path starts with the working directory
            module = arguments[1]
            sys.argv = [module, *arguments[2:]]  # runpy puts the module's path first
            sys.path.insert(0, cwd)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:  # python script.py: sys.path starts with the script's directory
            sys.argv = list(arguments)
            sys.path.insert(0, str(Path(arguments[0]).resolve().parent))
            runpy.run_path(arguments[0], run_name="__main__")
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    threading._shutdown()  # then atexit, as an interpreter ends: joins threads, stops pools
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _exit_status(code: object) -> int:
    """The status an interpreter exits with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
