"""Fixtures: the Multi30k copies in ../shared/data and toy corpora (functions: helpers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import SHARED_DATA, compose_config, toy_corpus, write_lines

from seq2seq.config import RootConfig

# the commands tests start keep the system allocator: seq2seq-train would otherwise start itself
# again under tcmalloc where it is installed (seq2seq.allocator; tests/test_allocator.py)
os.environ.setdefault("SEQ2SEQ_ALLOCATOR", "system")


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
