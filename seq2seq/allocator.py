"""The memory allocator of a training process: tcmalloc where the machine has it.

Token-budget batches change shape every step, and glibc's malloc fragments under them: a
training process keeps growing (3.0 to 3.6 GB in four epochs, 4.5 GB by the sixth) and each
epoch trains slower than the one before; under tcmalloc it holds 1.5 GB and a steady rate,
1.11-1.22x glibc's in the first four epochs and 1.31x over a 60-minute run (AMD EPYC; bf16
units: avx512_bf16; docs/performance.md). The allocator is fixed when a process starts, so
`seq2seq-train` starts itself again with tcmalloc preloaded (LD_PRELOAD), as
torch.backends.xeon.run_cpu does. That is why the choice is an environment variable, read before
any config is: SEQ2SEQ_ALLOCATOR=auto (tcmalloc when found, the default), tcmalloc (required) or
system.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from seq2seq.errors import ConfigError

VARIABLE = "SEQ2SEQ_ALLOCATOR"
CHOICES = ("auto", "tcmalloc", "system")
TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")  # gperftools' libraries, either will do
INSTALL_HINT = (
    "install tcmalloc (Debian/Ubuntu: apt install libtcmalloc-minimal4; Fedora: dnf install "
    "gperftools-libs; conda: conda install gperftools)"
)


def find_tcmalloc() -> str | None:
    """A tcmalloc library: this Python's own (a conda env or venv) first, then the system's."""
    for name in TCMALLOC_NAMES:
        for prefix in dict.fromkeys([sys.prefix, sys.base_prefix]):
            found = sorted(Path(prefix, "lib").glob(f"lib{name}.so*"))
            if found:
                return str(found[0])
        found = ctypes.util.find_library(name)  # the loader's cache: a name LD_PRELOAD finds
        if found:
            return found
    return None


def allocator_in_use() -> str:
    """tcmalloc or jemalloc when one is loaded into this process, else "system"."""
    maps = Path("/proc/self/maps")
    loaded = maps.read_text() if maps.exists() else ""
    for name in ("tcmalloc", "jemalloc"):
        if f"lib{name}" in loaded:
            return name
    return "system"


def allocator_description(in_use: str, environ: Mapping[str, str], library: str | None) -> str:
    """The allocator for the training log; under the system's, why, and how to get tcmalloc."""
    linux = sys.platform.startswith("linux")
    if in_use != "system" or environ.get(VARIABLE, "auto") == "system" or not linux:
        return in_use
    if library is None:
        return f"system (no tcmalloc found: training runs faster with it; {INSTALL_HINT})"
    return (
        f"system (tcmalloc, {library}, is preloaded when seq2seq-train or python -m "
        "seq2seq.train starts the process, not when a Python session calls main())"
    )


def restart_command(
    environ: Mapping[str, str], in_use: str, library: str | None, argv: Sequence[str]
) -> tuple[list[str], dict[str, str]] | None:
    """The command line and environment that start this process again under tcmalloc, or None
    when it should go on as it is. `argv` is the interpreter's (sys.orig_argv)."""
    choice = environ.get(VARIABLE, "auto")
    if choice not in CHOICES:
        raise ConfigError(
            f"{VARIABLE}={choice!r}: the memory allocator of seq2seq-train is one of "
            f"{', '.join(CHOICES)}; unset it for auto"
        )
    if choice == "system" or in_use != "system":
        return None
    preload = [entry for entry in environ.get("LD_PRELOAD", "").split(":") if entry]
    if library is None or library in preload:  # none here, or the loader refused it
        if choice == "tcmalloc":
            where = "was not found" if library is None else f"({library}) could not be preloaded"
            raise ConfigError(
                f"{VARIABLE}=tcmalloc, but tcmalloc {where}: {INSTALL_HINT}, or set "
                f"{VARIABLE}=auto to train with the system's allocator where it is missing"
            )
        return None
    return [sys.executable, *argv[1:]], {**environ, "LD_PRELOAD": ":".join([library, *preload])}


def started_as_command() -> bool:
    """Whether this process was started as a seq2seq command (`python -m seq2seq.<command>` or
    `seq2seq-<command>`), rather than a Python session that called a command's main(): a
    notebook or test run is never replaced."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("seq2seq."):
        return True
    return Path(sys.argv[0]).name.startswith("seq2seq-")


def restart_under_tcmalloc() -> None:
    """Replace this process by the same command under tcmalloc, when SEQ2SEQ_ALLOCATOR and the
    machine allow (Linux only). Call it before anything is written: nothing runs twice."""
    if not sys.platform.startswith("linux") or not started_as_command():
        return
    restart = restart_command(os.environ, allocator_in_use(), find_tcmalloc(), sys.orig_argv)
    if restart is not None:
        argv, environ = restart
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(argv[0], argv, environ)
