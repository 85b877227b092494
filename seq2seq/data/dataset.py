"""Encoded parallel splits: token ids in flat arrays, filtered, cached on disk and memory-mapped.

A split is encoded in chunks of pairs, in a pool of processes when it has more than one chunk,
and written straight to `.npy` files, so that encoding holds one chunk per process rather than
the corpus. Every reader (training, evaluation, each data-parallel process and loader worker)
maps the same files read-only and shares their pages.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import json
import logging
import multiprocessing
import multiprocessing.pool
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from seq2seq.concurrency import build_lock
from seq2seq.data.config import FilterConfig
from seq2seq.data.corpus import normalize
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.io import atomic_dir

log = logging.getLogger(__name__)

CHUNK_PAIRS = 1 << 14  # pairs a process encodes at a time
TOKEN_ARRAYS = ("src", "tgt")  # int32 ids
INDEX_ARRAYS = ("src_offsets", "tgt_offsets", "line")  # int64
ARRAY_DTYPES = dict.fromkeys(TOKEN_ARRAYS, np.int32) | dict.fromkeys(INDEX_ARRAYS, np.int64)


@dataclass(frozen=True)
class FilterCounts:
    """Pairs dropped from a split, by first failing reason."""

    total: int
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0

    @property
    def kept(self) -> int:
        return self.total - self.empty - self.too_long - self.bad_ratio

    def __add__(self, other: FilterCounts) -> FilterCounts:
        return FilterCounts(
            self.total + other.total,
            self.empty + other.empty,
            self.too_long + other.too_long,
            self.bad_ratio + other.bad_ratio,
        )


class EncodedSplit(torch.utils.data.Dataset):
    """Subword ids of kept pairs, without BOS/EOS; `line` maps each pair to its 0-based line."""

    def __init__(
        self,
        src: np.ndarray,
        src_offsets: np.ndarray,
        tgt: np.ndarray,
        tgt_offsets: np.ndarray,
        line: np.ndarray,
        counts: FilterCounts,
    ) -> None:
        self.src, self.src_offsets = src, src_offsets
        self.tgt, self.tgt_offsets = tgt, tgt_offsets
        self.line = line
        self.counts = counts
        self.src_lens = np.diff(src_offsets)  # lengths only: the tokens stay on disk
        self.tgt_lens = np.diff(tgt_offsets)
        self.max_len: int | None = None

    def __len__(self) -> int:
        return len(self.line)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        src = self.src[self.src_offsets[i] : self.src_offsets[i + 1]][: self.max_len]
        tgt = self.tgt[self.tgt_offsets[i] : self.tgt_offsets[i + 1]][: self.max_len]
        return i, src, tgt

    def longer_than(self, max_len: int) -> np.ndarray:
        """Indices of the pairs with a side longer than `max_len` tokens."""
        return np.flatnonzero((self.src_lens > max_len) | (self.tgt_lens > max_len))

    def truncate(self, max_len: int) -> None:
        """Serve at most `max_len` tokens per side (evaluation splits are never filtered)."""
        self.max_len = max_len
        self.src_lens = np.minimum(self.src_lens, max_len)
        self.tgt_lens = np.minimum(self.tgt_lens, max_len)

    def save(self, directory: Path) -> None:
        """Write the arrays and counts into `directory`, as `load` reads them."""
        for name, dtype in ARRAY_DTYPES.items():
            np.save(directory / f"{name}.npy", np.asarray(getattr(self, name), dtype=dtype))
        (directory / "counts.json").write_text(json.dumps(asdict(self.counts)))

    @classmethod
    def load(cls, directory: Path) -> EncodedSplit:
        """Map the arrays of `directory` read-only; the counts come from counts.json."""
        arrays = {
            name: np.load(directory / f"{name}.npy", mmap_mode="r")
            for name in (*TOKEN_ARRAYS, *INDEX_ARRAYS)
        }
        counts = FilterCounts(**json.loads((directory / "counts.json").read_text()))
        return cls(counts=counts, **arrays)

    @classmethod
    def encode(
        cls,
        pairs: Iterable[tuple[str, str]],
        tokenizer: Tokenizer,
        limits: FilterConfig | None,
        directory: Path,
        processes: int = 1,
    ) -> EncodedSplit:
        """Normalise and encode raw line pairs into `directory` (written atomically) and map it.

        With `limits`, drop empty, over-long and ill-ratioed pairs. `processes` bounds the pool
        (or SentencePiece's threads, for a split of one chunk); the arrays do not depend on it.
        """
        with atomic_dir(directory) as tmp, contextlib.ExitStack() as files:
            streams = {
                name: _NpyStream(files.enter_context(open(tmp / f"{name}.npy", "wb")), dtype)
                for name, dtype in ARRAY_DTYPES.items()
            }
            src_end = tgt_end = 0
            streams["src_offsets"].write(np.zeros(1))
            streams["tgt_offsets"].write(np.zeros(1))
            counts = FilterCounts(total=0)
            for chunk in _encoded_chunks(pairs, tokenizer, limits, processes):
                streams["src"].write(chunk.src)
                streams["tgt"].write(chunk.tgt)
                streams["src_offsets"].write(src_end + np.cumsum(chunk.src_lens))
                streams["tgt_offsets"].write(tgt_end + np.cumsum(chunk.tgt_lens))
                streams["line"].write(chunk.line)
                src_end, tgt_end = src_end + len(chunk.src), tgt_end + len(chunk.tgt)
                counts += chunk.counts
            for stream in streams.values():
                stream.finish()
            (tmp / "counts.json").write_text(json.dumps(asdict(counts)))
        return cls.load(directory)


class _NpyStream:
    """A 1-D `.npy` file written chunk by chunk. Its header is written first with length 0 and
    rewritten by `finish`: numpy pads headers to a fixed size, so the data never moves."""

    def __init__(self, file: BinaryIO, dtype: type) -> None:
        self.file, self.dtype, self.length = file, np.dtype(dtype), 0
        self.data_start = self._write_header()

    def _write_header(self) -> int:
        self.file.seek(0)
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.length,),
        }
        np.lib.format.write_array_header_1_0(self.file, header)
        return self.file.tell()

    def write(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.length += len(values)

    def finish(self) -> None:
        end = self.file.tell()
        if self._write_header() != self.data_start:
            raise RuntimeError(f"{self.file.name}: the .npy header changed size")
        self.file.seek(end)


@dataclass
class _Chunk:
    src: np.ndarray  # kept pairs' source ids, flat
    src_lens: np.ndarray
    tgt: np.ndarray
    tgt_lens: np.ndarray
    line: np.ndarray  # kept pairs' 0-based lines in the split
    counts: FilterCounts


def _flatten(seqs: list[list[int]]) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32)


def _encode_chunk(
    pairs: list[tuple[str, str]],
    first_line: int,
    tokenizer: Tokenizer,
    limits: FilterConfig | None,
    num_threads: int,
) -> _Chunk:
    src_ids = tokenizer.encode_src([normalize(s) for s, _ in pairs], num_threads)
    tgt_ids = tokenizer.encode_tgt([normalize(t) for _, t in pairs], num_threads)
    s = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(pairs))
    t = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(pairs))
    keep = np.ones(len(pairs), dtype=bool)
    counts = FilterCounts(total=len(pairs))
    if limits is not None:
        empty = (s == 0) | (t == 0)
        too_long = ~empty & ((s > limits.max_len) | (t > limits.max_len))
        longer, shorter = np.maximum(s, t), np.maximum(np.minimum(s, t), 1)
        bad_ratio = (
            ~empty
            & ~too_long
            & (longer >= limits.ratio_min_len)
            & (longer > limits.max_ratio * shorter)
        )
        keep = ~(empty | too_long | bad_ratio)
        counts = FilterCounts(
            total=len(pairs),
            empty=int(empty.sum()),
            too_long=int(too_long.sum()),
            bad_ratio=int(bad_ratio.sum()),
        )
    kept = np.flatnonzero(keep)
    return _Chunk(
        src=_flatten([src_ids[i] for i in kept]),
        src_lens=s[kept],
        tgt=_flatten([tgt_ids[i] for i in kept]),
        tgt_lens=t[kept],
        line=first_line + kept,
        counts=counts,
    )


_worker_state: tuple[Tokenizer, FilterConfig | None] | None = None


def _start_worker(src_model: bytes, tgt_model: bytes, limits: FilterConfig | None) -> None:
    global _worker_state
    _worker_state = (Tokenizer(src_model, tgt_model), limits)


def _encode_in_worker(pairs: list[tuple[str, str]], first_line: int) -> _Chunk:
    assert _worker_state is not None
    tokenizer, limits = _worker_state
    return _encode_chunk(pairs, first_line, tokenizer, limits, num_threads=1)


def _encoded_chunks(
    pairs: Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    limits: FilterConfig | None,
    processes: int,
) -> Iterator[_Chunk]:
    """Encoded chunks in corpus order. A pool only for more than one chunk, and with at most
    two chunks per process in flight, so that reading never runs ahead of encoding."""
    iterator = iter(pairs)
    chunks = iter(lambda: list(itertools.islice(iterator, CHUNK_PAIRS)), [])
    head = list(itertools.islice(chunks, 2))
    if processes <= 1 or len(head) < 2:
        for number, chunk in enumerate(itertools.chain(head, chunks)):
            yield _encode_chunk(chunk, number * CHUNK_PAIRS, tokenizer, limits, processes)
        return
    initargs = (tokenizer.src_model, tokenizer.tgt_model, limits)
    gc.freeze()  # forked workers then leave this process's objects (and their pages) alone
    try:
        with multiprocessing.Pool(processes, _start_worker, initargs) as pool:
            pending: deque[multiprocessing.pool.AsyncResult] = deque()
            for number, chunk in enumerate(itertools.chain(head, chunks)):
                pending.append(pool.apply_async(_encode_in_worker, (chunk, number * CHUNK_PAIRS)))
                if len(pending) >= 2 * processes:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
    finally:
        gc.unfreeze()


def load_or_encode(
    cache_dir: Path,
    name: str,
    inputs: dict[str, str],
    tokenizer: Tokenizer,
    limits: FilterConfig | None,
    read: Callable[[], Iterable[tuple[str, str]]],
    processes: int = 1,
) -> tuple[EncodedSplit, bool]:
    """Return the cached encoding for this key, or encode and cache it. Also says if it encoded.

    The key covers the split's files (`inputs`), the tokenizer's content and the filter limits.
    """
    payload = {
        "inputs": inputs,
        "tokenizer": tokenizer.fingerprint,
        "limits": asdict(limits) if limits else None,
    }
    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    directory = cache_dir / "encoded" / f"{name}-{key}"
    if (directory / "counts.json").exists():
        return EncodedSplit.load(directory), False
    with build_lock(directory):  # runs started together: one encodes, the others wait
        if (directory / "counts.json").exists():
            return EncodedSplit.load(directory), False
        return EncodedSplit.encode(read(), tokenizer, limits, directory, processes), True
