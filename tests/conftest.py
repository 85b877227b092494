"""Shared fixtures: Hydra composition and the Multi30k copies in ../shared/data."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from seq2seq.config import RootConfig, validate_config

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
SHARED_DATA = Path(os.environ.get("SEQ2SEQ_SHARED_DATA", ROOT.parent / "shared" / "data"))


def run(module: str, cwd: Path, *overrides: str, stdin: str | None = None):
    """`python -m seq2seq.<module> <overrides>` in `cwd`, output captured."""
    return subprocess.run(
        [sys.executable, "-m", f"seq2seq.{module}", *overrides],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )


def compose_config(
    overrides: list[str] | None = None, config_name: str = "train", schema: type = RootConfig
):
    """Compose a root config of conf/ as the entry points do, and check it against the schema."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate_config(compose(config_name, overrides=overrides or []), schema)


def write_lines(path: Path, lines: list[str]) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


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


def random_batch(vocab: int) -> tuple:
    """A fixed random (src, tgt_in) pair of batches: 3 sentences, one with source padding."""
    import torch

    from seq2seq.data.tokenizer import BOS_ID, PAD_ID

    torch.manual_seed(1)
    src = torch.randint(4, vocab, (3, 8))
    src[1, 5:] = PAD_ID
    tgt = torch.randint(4, vocab, (3, 7))
    tgt[:, 0] = BOS_ID
    return src, tgt


def toy_corpus(n: int = 300) -> tuple[list[str], list[str]]:
    """A small deterministic corpus with varied lengths."""
    words = ["the", "a", "dog", "cat", "runs", "jumps", "over", "under"]
    words += ["red", "blue", "big", "small", "man", "woman", "child", "ball"]
    src, tgt = [], []
    for i in range(n):
        length = 1 + (i * 7) % 12
        sentence = [words[(i * 3 + j * 5) % len(words)] for j in range(length)]
        src.append(" ".join(sentence))
        tgt.append(" ".join(w.upper() for w in reversed(sentence)))
    return src, tgt


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


def split_file_overrides() -> list[str]:
    """data=parallel_files names: <split>.src and <split>.tgt for train, val and test."""
    return [
        f"data.splits.{s}.{side}={s}.{side}"
        for s in ("train", "val", "test")
        for side in ("src", "tgt")
    ]


def toy_overrides(data: Path, cache: Path) -> list[str]:
    return [
        "data=parallel_files",
        f"data.dir={data}",
        f"paths.cache_dir={cache}",
        *split_file_overrides(),
        "tokenizer.vocab_size=60",
        "tokenizer.byte_fallback=false",
    ]
