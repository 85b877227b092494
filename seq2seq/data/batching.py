"""Token-budget batches of similar-length pairs, reshuffled per epoch from the seed.

A batch's cost is its padded size, sentences x longest side (source with EOS, target with
BOS/EOS), and stays within `max_tokens`; a single pair longer than that (possible only in
evaluation sets, which are never filtered) forms a batch of its own. Sorting by (source length,
target length) before cutting keeps padding low; the order of batches is then shuffled.
With `pad_to_multiple` > 1, lengths are padded up to a multiple of it, costs included: an
epoch's batches then take a few shapes, each of which a GPU captures once as CUDA graphs
(seq2seq.training.cuda_graphs), for more padding.
Under data parallelism every process draws the same batches and takes every n-th of them;
the loader remembers how many batches of the epoch it served, so a run checkpointed in the
middle of an epoch resumes with the next batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.errors import ConfigError


class Batch(NamedTuple):
    src: torch.Tensor  # (B, S) source ids + EOS, right-padded with PAD_ID
    tgt_in: torch.Tensor  # (B, T) BOS + target ids: decoder input
    tgt_out: torch.Tensor  # (B, T) target ids + EOS: what the decoder must predict
    index: torch.Tensor  # (B,) position of each pair in its split
    tgt_tokens: int  # target tokens + EOS, padding excluded: counted on the host, so that
    # dividing the loss by it never waits for a GPU

    def to(self, device: torch.device) -> Batch:
        # non_blocking: from the loader's pinned memory the copy does not wait for the GPU
        tensors = (
            t.to(device, non_blocking=True)
            for t in (self.src, self.tgt_in, self.tgt_out, self.index)
        )
        return Batch(*tensors, self.tgt_tokens)


def padded(size: np.ndarray | int, multiple: int) -> np.ndarray | int:
    """`size` rounded up to a multiple of `multiple` (`size` itself for 1: no copy)."""
    return size if multiple == 1 else -(-size // multiple) * multiple


def collate(items: list[tuple[int, np.ndarray, np.ndarray]], pad_to_multiple: int = 1) -> Batch:
    """Pad a list of (index, source ids, target ids) into a Batch, each side's length up to a
    multiple of `pad_to_multiple`."""
    n = len(items)
    src_len = padded(max(len(s) for _, s, _ in items) + 1, pad_to_multiple)
    tgt_len = padded(max(len(t) for _, _, t in items) + 1, pad_to_multiple)
    src = np.full((n, src_len), PAD_ID, dtype=np.int64)
    tgt_in = np.full((n, tgt_len), PAD_ID, dtype=np.int64)
    tgt_out = np.full((n, tgt_len), PAD_ID, dtype=np.int64)
    for row, (_, s, t) in enumerate(items):
        src[row, : len(s)] = s
        src[row, len(s)] = EOS_ID
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS_ID
    index = torch.tensor([i for i, _, _ in items], dtype=torch.long)
    tokens = sum(len(t) + 1 for _, _, t in items)
    return Batch(
        torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), index, tokens
    )


class EpochSeededSampler(Sampler[int]):
    """A permutation that is a function of (seed, epoch) alone, as DistributedSampler's.

    Lightning calls `set_epoch` on it each epoch (also after a restart), which makes the batch
    order of a resumed run the same as an uninterrupted one.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def generator(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch])

    def __iter__(self) -> Iterator[int]:
        return iter(self.generator().permutation(self.size).tolist())

    def __len__(self) -> int:
        return self.size


class BatchList(Sequence[list[int]]):
    """Batches of pair indices held compactly: batch k is `indices[offsets[k]:offsets[k + 1]]`.

    Two flat arrays instead of a list of lists of Python ints: at 2M pairs the lists took about
    130 MB per process (an int object and a pointer per pair), these take 8 MB (4 bytes per pair
    in int32). A batch becomes a list of ints only when it is served.
    """

    def __init__(self, indices: np.ndarray, offsets: np.ndarray) -> None:
        self.indices, self.offsets = indices, offsets

    @classmethod
    def gather(cls, order: np.ndarray, offsets: np.ndarray, chosen: np.ndarray) -> BatchList:
        """The batches `chosen` (their numbers, in the order given) of the batches that cut
        `order` at `offsets`, copied into arrays of their own."""
        starts, lengths = offsets[chosen], offsets[chosen + 1] - offsets[chosen]
        new_offsets = np.zeros(len(chosen) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        positions = np.arange(new_offsets[-1], dtype=np.int64)
        positions += np.repeat(starts - new_offsets[:-1], lengths)
        dtype = np.int32 if len(order) <= np.iinfo(np.int32).max else np.int64
        return cls(order[positions].astype(dtype, copy=False), new_offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def array(self, k: int) -> np.ndarray:
        """Batch `k` as an array (a view)."""
        return self.indices[self.offsets[k] : self.offsets[k + 1]]

    @overload
    def __getitem__(self, k: int) -> list[int]: ...

    @overload
    def __getitem__(self, k: slice) -> BatchList: ...

    def __getitem__(self, k: int | slice) -> list[int] | BatchList:
        if isinstance(k, slice):
            chosen = np.arange(len(self), dtype=np.int64)[k]
            return BatchList.gather(self.indices, self.offsets, chosen)
        if not -len(self) <= k < len(self):
            raise IndexError(f"batch {k} of {len(self)}")
        return self.array(k % len(self)).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[list[int]]:
        """The batches from number `start` on, as lists of ints."""
        for k in range(start, len(self)):
            yield self.array(k).tolist()

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


_CUT_BLOCK = 1 << 16  # sizes turned into Python ints at a time by _cut


def _cut(order: np.ndarray, size: np.ndarray, max_tokens: int) -> np.ndarray:
    """Cut `order` into consecutive batches with len(batch) * max(size) <= max_tokens; the
    offsets of the batches in `order` (batch k is order[offsets[k]:offsets[k + 1]])."""
    ends: list[int] = []
    count = longest = 0
    for first in range(0, len(order), _CUT_BLOCK):
        block = size[order[first : first + _CUT_BLOCK]].tolist()
        for position, s in enumerate(block, first):
            grown = longest if longest > s else s
            if count and grown * (count + 1) > max_tokens:
                ends.append(position)
                count, grown = 0, s
            count += 1
            longest = grown
    if count:
        ends.append(len(order))
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    offsets[1:] = ends
    return offsets


def _split_until_divisible(offsets: np.ndarray, parts: int) -> np.ndarray:
    """Halve the biggest batches (the first of the biggest) until their number divides by
    `parts`: every process then runs the same number of steps, and no pair is dropped or
    repeated. Batches are given and returned as offsets (see _cut)."""
    while (len(offsets) - 1) % parts:
        lengths = np.diff(offsets)
        biggest = int(np.argmax(lengths))
        if lengths[biggest] < 2:
            raise ConfigError(
                f"trainer.devices: {len(lengths)} batches of one pair each cannot be shared "
                f"evenly by {parts} processes; use fewer processes or more training pairs"
            )
        half = int(lengths[biggest]) // 2
        offsets = np.insert(offsets, biggest + 1, offsets[biggest] + half)
    return offsets


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches within a token budget.

    With `shuffle`, ties in length are broken and the batch order is drawn from the
    sampler's (seed, epoch); without, batches come in length order (evaluation). With
    `num_replicas` > 1 this process (`rank`) gets every num_replicas-th batch of the epoch.
    Only this process's batches of the current epoch are kept, as a BatchList.
    `lengths_of_epoch`, where pairs change length from epoch to epoch (BPE-dropout), gives
    each epoch's lengths in place of `src_lens` and `tgt_lens` when its batches are drawn.
    `pad_to_multiple`: the lengths a batch is padded to (collate's) are multiples of this, and
    the batches are sorted and cut by those lengths.
    """

    def __init__(
        self,
        src_lens: np.ndarray,
        tgt_lens: np.ndarray,
        max_tokens: int,
        shuffle: bool,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        lengths_of_epoch: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None,
        pad_to_multiple: int = 1,
    ) -> None:
        self.pad_to_multiple = pad_to_multiple
        self._set_lengths(src_lens, tgt_lens)
        self.lengths_of_epoch = lengths_of_epoch
        self.max_tokens, self.shuffle = max_tokens, shuffle
        self.num_replicas, self.rank = num_replicas, rank
        self.sampler = EpochSeededSampler(len(self.size), seed)
        self._cache: tuple[int, BatchList] | None = None
        self._resume: tuple[int, int] | None = None  # (epoch, batches already served)

    def _set_lengths(self, src_lens: np.ndarray, tgt_lens: np.ndarray) -> None:
        # +1: EOS on the source; BOS (input) or EOS (output) on the target. int32: half the
        # memory of the int64 lengths, and no sentence has 2**31 tokens
        self.src_size = np.asarray(src_lens).astype(np.int32) + 1
        self.tgt_size = np.asarray(tgt_lens).astype(np.int32) + 1
        # what the batches are sorted and cut by: the padded lengths
        self.src_padded = padded(self.src_size, self.pad_to_multiple)
        self.tgt_padded = padded(self.tgt_size, self.pad_to_multiple)
        self.size = np.maximum(self.src_padded, self.tgt_padded)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def batches(self) -> BatchList:
        """This process's batches of the current epoch."""
        epoch = self.sampler.epoch if self.shuffle else -1
        if self._cache is None or self._cache[0] != epoch:
            self._cache = None  # the previous epoch's batches go before the next are drawn
            self._cache = (epoch, self._make_batches())
        return self._cache[1]

    def _make_batches(self) -> BatchList:
        if not self.shuffle:
            order = np.lexsort((self.tgt_padded, self.src_padded))
            offsets = _split_until_divisible(
                _cut(order, self.size, self.max_tokens), self.num_replicas
            )
            chosen = np.arange(len(offsets) - 1, dtype=np.int64)
        else:
            if self.lengths_of_epoch is not None:
                self._set_lengths(*self.lengths_of_epoch(self.epoch))
            rng = self.sampler.generator()
            perm = rng.permutation(len(self.size))
            order = perm[np.lexsort((self.tgt_padded[perm], self.src_padded[perm]))]
            del perm
            offsets = _cut(order, self.size, self.max_tokens)
            offsets = _split_until_divisible(offsets, self.num_replicas)
            chosen = rng.permutation(len(offsets) - 1)
        return BatchList.gather(order, offsets, chosen[self.rank :: self.num_replicas])

    def resume(self, epoch: int, served: int) -> None:
        """Make the next pass over `epoch` start after its first `served` batches."""
        self._resume = (epoch, served)

    def resume_offset(self) -> int:
        """How many batches of the current epoch the next pass skips."""
        if self._resume is not None and self._resume[0] == self.epoch:
            return self._resume[1]
        return 0

    def __iter__(self) -> Iterator[list[int]]:
        # a generator: the epoch's batches are drawn at the first next(), after Lightning's
        # set_epoch, even when the iterator was created before it (as on a resume)
        start = self.resume_offset()
        self._resume = None
        yield from self.batches().iter_from(start)

    def __len__(self) -> int:
        return len(self.batches())

    def _padded_shapes(self) -> np.ndarray:
        """(sentences, source length, target length) of each of the epoch's padded batches."""
        batches = self.batches()
        if not len(batches):
            return np.zeros((0, 3), dtype=np.int64)
        starts = batches.offsets[:-1]
        src = np.maximum.reduceat(self.src_padded[batches.indices], starts)
        tgt = np.maximum.reduceat(self.tgt_padded[batches.indices], starts)
        return np.stack([batches.lengths(), src, tgt], axis=1).astype(np.int64)

    def shapes(self) -> int:
        """How many distinct batch shapes the epoch has: graphs a GPU captures for it."""
        return len(np.unique(self._padded_shapes(), axis=0))

    def padding_fraction(self) -> float:
        """Share of pad tokens in all padded source and target tensors of one epoch."""
        batches = self.batches()
        shapes = self._padded_shapes()
        real = int(self.src_size[batches.indices].sum(dtype=np.int64))
        real += int(self.tgt_size[batches.indices].sum(dtype=np.int64))
        padded_total = int((shapes[:, 0] * (shapes[:, 1] + shapes[:, 2])).sum())
        return 1.0 - real / padded_total if padded_total else 0.0


class ResumableLoader(DataLoader):
    """A DataLoader over a TokenBudgetBatchSampler whose position Lightning saves in every
    checkpoint (`state_dict`) and restores on resume (`load_state_dict`)."""

    batch_sampler: TokenBudgetBatchSampler

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.served = 0  # batches of the current epoch handed out so far

    def __iter__(self) -> Iterator[Batch]:
        self.served = self.batch_sampler.resume_offset()
        for batch in super().__iter__():
            self.served += 1  # counted before the step runs: a checkpoint after it includes it
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.batch_sampler.epoch, "served": self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batch_sampler.resume(state["epoch"], state["served"])
