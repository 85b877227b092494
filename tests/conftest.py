"""Fixtures: the Multi30k copies in ../shared/data and toy corpora (functions: helpers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import SHARED_DATA, compose_config, toy_corpus, write_lines

from seq2seq.concurrency import thread_budget, usable_cpus
from seq2seq.config import RootConfig

# the commands tests start keep the system allocator: seq2seq-train would otherwise start itself
# again under tcmalloc where it is installed (seq2seq.allocator; tests/test_allocator.py)
os.environ.setdefault("SEQ2SEQ_ALLOCATOR", "system")

# pytest-xdist's workers (pyproject's `-n auto`) share the CPUs: each worker, and the commands
# its tests start (seq2seq.concurrency.thread_budget), gets its share of threads. The tests'
# models are tiny: a second thread per step took 23 s of CPU to 35 s and no wall time off a
# toy run on 2 cores (AMD EPYC; bf16 units: none), so two single-threaded workers finish the
# suite sooner than one with two.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // WORKERS)))
    torch.set_num_threads(thread_budget(None))  # torch may have read the variable already


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per CPU this process may use (its affinity, as a run's threads:
    os.cpu_count() counts the host's CPUs in a container limited to fewer)."""
    return usable_cpus()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a `slow` test first, each module's tests in their order: `--dist loadfile`
    hands a worker whole modules in this order, and a long one handed out last keeps one
    worker busy after the others have finished."""
    slow = {item.module for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module not in slow)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "multi30k" / "train.en.gz").exists():
        pytest.skip(f"Multi30k copies not found in {SHARED_DATA} (set SEQ2SEQ_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def multi30k_config(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> RootConfig:
    cache = tmp_path_factory.mktemp("cache")
    return compose_config([f"paths.data_dir={shared_data}", f"paths.cache_dir={cache}"])


@pytest.fixture(scope="session")
def multi30k(multi30k_config: RootConfig):
    """Multi30k en-de, prepared once for the session with the default tokenizer settings."""
    from seq2seq.data.datamodule import prepare

    return prepare(multi30k_config)


@pytest.fixture
def toy_files(tmp_path: Path) -> Path:
    """A parallel_files data directory with train/val/test splits of the toy corpus."""
    src, tgt = toy_corpus()
    data = tmp_path / "corpus"
    data.mkdir()
    for split, lo, hi in (("train", 0, 240), ("val", 240, 270), ("test", 270, 300)):
        write_lines(data / f"{split}.src", src[lo:hi])
        write_lines(data / f"{split}.tgt", tgt[lo:hi])
    return data
