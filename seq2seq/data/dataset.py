"""Encoded parallel splits: token ids in flat numpy arrays, filtered and cached on disk."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from seq2seq.config import FilterConfig
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.io import atomic_path

log = logging.getLogger(__name__)


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


def _flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


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
        self.src_lens = np.diff(src_offsets)
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

    @classmethod
    def encode(
        cls,
        src_lines: list[str],
        tgt_lines: list[str],
        tokenizer: Tokenizer,
        limits: FilterConfig | None,
    ) -> EncodedSplit:
        """Encode normalised lines; with `limits`, drop empty, over-long and ill-ratioed pairs."""
        src_ids = tokenizer.encode_src(src_lines)
        tgt_ids = tokenizer.encode_tgt(tgt_lines)
        keep = np.ones(len(src_ids), dtype=bool)
        counts = FilterCounts(total=len(src_ids))
        if limits is not None:
            s = np.array([len(x) for x in src_ids])
            t = np.array([len(x) for x in tgt_ids])
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
                total=len(src_ids),
                empty=int(empty.sum()),
                too_long=int(too_long.sum()),
                bad_ratio=int(bad_ratio.sum()),
            )
        line = np.flatnonzero(keep)
        src, src_offsets = _flatten([src_ids[i] for i in line])
        tgt, tgt_offsets = _flatten([tgt_ids[i] for i in line])
        return cls(src, src_offsets, tgt, tgt_offsets, line, counts)

    def save(self, path: Path) -> None:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                src=self.src,
                src_offsets=self.src_offsets,
                tgt=self.tgt,
                tgt_offsets=self.tgt_offsets,
                line=self.line,
                counts=np.array(json.dumps(asdict(self.counts))),
            )

    @classmethod
    def load(cls, path: Path) -> EncodedSplit:
        with np.load(path) as z:
            counts = FilterCounts(**json.loads(str(z["counts"])))
            return cls(z["src"], z["src_offsets"], z["tgt"], z["tgt_offsets"], z["line"], counts)


def load_or_encode(
    cache_dir: Path,
    name: str,
    inputs: dict[str, str],
    tokenizer: Tokenizer,
    limits: FilterConfig | None,
    read: Callable[[], tuple[list[str], list[str]]],
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
    path = cache_dir / "encoded" / f"{name}-{key}.npz"
    if path.exists():
        return EncodedSplit.load(path), False
    src_lines, tgt_lines = read()
    split = EncodedSplit.encode(src_lines, tgt_lines, tokenizer, limits)
    split.save(path)
    return split, True
