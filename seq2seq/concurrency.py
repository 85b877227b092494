"""Runs side by side on one machine or a cluster: threads per run, shared caches built by one
process while the others wait, and a run directory held by one live process.

Locks are `flock` locks on a `.lock` file: the kernel releases them when their process dies,
however it dies (`kill -9` included), so a lock never outlives its holder. Correctness never
rests on them: every cache entry is written under a temp name and renamed (seq2seq.io), so
without a lock (a filesystem without `flock`) runs may repeat work but never read half of it.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import multiprocessing
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from seq2seq.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there may repeat a cache build
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# written into a sweep's run directory when its run fails (seq2seq.cli); the report names it
FAILED_FILE = "failed.txt"

# what flock answers on a filesystem that does not support it (Lustre mounted noflock, some NFS)
NO_FLOCK = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_start_method() -> str:
    """How loader workers start: the platform's default method. A joblib worker's default is
    loky's, whose processes torch's DataLoader cannot start ("'Process' object has no
    attribute 'env'"), so a sweep's runs with data.num_workers > 0 failed at their first batch."""
    return multiprocessing.get_all_start_methods()[0]


def release_run_memory() -> None:
    """Hand back the memory of the runs this process has finished, before it starts another or
    waits. A joblib worker trains job after job in one process, and on a GPU its second run of
    experiment=ablation_gpu ran out of memory where ten first runs fitted: one worker held
    23.4 GiB, a first run 7-10 (docs/performance.md, "Sweeps on a GPU"). A failed run's
    traceback keeps its frames in a reference cycle until the collector runs; then the
    allocator's cache, CUDA graph pools included, goes back to CUDA for the other processes."""
    gc.collect()
    torch = sys.modules.get("torch")  # not imported: nothing was put on a GPU
    if torch is None or not torch.cuda.is_initialized():
        return
    held = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    log.info(
        "GPU memory reserved by this process: %.1f MiB, %.1f MiB after handing back its "
        "earlier runs' cache",
        held / 2**20,
        torch.cuda.memory_reserved() / 2**20,
    )


def thread_budget(threads: int | None) -> int:
    """The threads one run may use: `threads` when set, else what the launcher granted in
    OMP_NUM_THREADS (joblib's workers get cores / jobs), else every usable CPU."""
    if threads is not None:
        return threads
    granted = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if granted.isdigit() and int(granted) > 0:
        return int(granted)
    return usable_cpus()


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


def _flock(fd: int, blocking: bool) -> bool | None:
    """True: locked; False: held by another process; None: the filesystem has no flock."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in NO_FLOCK:
            return None
        raise
    return True


def remove_leftovers(path: Path) -> None:
    """Delete the temp files and directories that a writer of `path` killed mid-way left
    (seq2seq.io names them `.<name>.*.part` and `.<name>.*.old`). Only safe while holding
    `path`'s build lock: then no live process is writing them."""
    for pattern in (f".{path.name}.*.part", f".{path.name}.*.old"):
        for leftover in path.parent.glob(pattern):
            log.info("removing %s, left by a process that stopped while writing", leftover)
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold `.<name>.lock` beside `path` while building it: other processes building the same
    `path` wait here, then find it built. Leftovers of killed builders are removed once the lock
    is held. The lock file stays (removing it would let two processes lock two files)."""
    lock_path = path.with_name(f".{path.name}.lock")
    fd = _open_lock(lock_path)
    try:
        locked = _flock(fd, blocking=False)
        if locked is False:
            log.info("waiting for another process to finish building %s (%s)", path, lock_path)
            locked = _flock(fd, blocking=True)
        if locked:
            remove_leftovers(path)
        else:
            log.warning(
                "%s: no file locks on this filesystem; runs started together may each build "
                "%s (the result stays whole). docs/sweeps.md: shared filesystems",
                lock_path,
                path,
            )
        yield
    finally:
        os.close(fd)  # releases the lock


class RunDirectory:
    """A run directory held by one live process: `hold()` refuses a second one while the first
    lives; a finished or killed run's directory can be taken again (to resume it)."""

    LOCK_NAME = ".run.lock"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def hold(self) -> None:
        lock_path = self.path / self.LOCK_NAME
        fd = _open_lock(lock_path)
        locked = _flock(fd, blocking=False)
        if locked is False:
            holder = lock_path.read_text().strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"hydra.run.dir={self.path}: another live run (process {holder}) is using this "
                "directory. Give this run its own hydra.run.dir (the default is unique per run), "
                "or wait for that run to finish and resume it with ckpt_path=auto"
            )
        if locked:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
