"""The pairs a multilingual run serves: each direction's encoded split with the target
language's tag in front of every source (TaggedSplit), and the training epochs' mixture of the
directions (MixtureSplit).

An epoch holds as many pairs as all directions together, each direction's share drawn with
temperature T (Arivazhagan et al. 2019): p_d = q_d^(1/T) / sum q^(1/T), q_d its share of the
pairs. T = 1 serves the corpora as they are; a larger T moves the shares toward equal,
repeating a small direction's pairs within an epoch. Which pairs an epoch holds follows from
(seed, epoch) alone, as the batch order does, so that a resumed run and every data-parallel
process serve the same pairs.
"""

from __future__ import annotations

import numpy as np
import torch

from seq2seq.data.dataset import EncodedSplit


class TaggedSplit(torch.utils.data.Dataset):
    """The pairs of `split`, each source led by the token `tag_id`."""

    def __init__(self, split: EncodedSplit, tag_id: int) -> None:
        self.split, self.tag = split, np.array([tag_id], dtype=np.int32)

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        index, src, tgt = self.split[i]
        return index, np.concatenate([self.tag, src]), tgt

    @property
    def src_lens(self) -> np.ndarray:
        return self.split.src_lens + 1  # read when batched: after any truncation

    @property
    def tgt_lens(self) -> np.ndarray:
        return self.split.tgt_lens


def mixture_shares(sizes: list[int], temperature: float) -> np.ndarray:
    """Each direction's share of an epoch: its share of the pairs to the power 1/T, normalised."""
    weights = (np.asarray(sizes, dtype=np.float64) / sum(sizes)) ** (1.0 / temperature)
    return weights / weights.sum()


def epoch_counts(sizes: list[int], temperature: float) -> np.ndarray:
    """How many pairs of each direction an epoch of sum(sizes) pairs serves: the shares
    rounded by largest remainder, so that they add up exactly."""
    total = sum(sizes)
    exact = mixture_shares(sizes, temperature) * total
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def draw(size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` indices into `size` pairs: whole permutations while count exceeds size (every
    pair as often as the others, give or take one), the rest without replacement."""
    rounds, rest = divmod(count, size)
    parts = [rng.permutation(size) for _ in range(rounds)]
    parts.append(rng.permutation(size)[:rest])
    return np.concatenate(parts)


class MixtureSplit(torch.utils.data.Dataset):
    """Training pairs of several directions (TaggedSplits), the epoch last asked for by
    `lengths`: position k serves the pair drawn k-th, as (k, source, target)."""

    def __init__(self, parts: list[TaggedSplit], temperature: float, seed: int) -> None:
        self.parts, self.seed = parts, seed
        self.counts = epoch_counts([len(part) for part in parts], temperature)
        self.part = np.empty(0, dtype=np.int64)  # the epoch's pairs: direction, and index
        self.index = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.counts.sum())

    def __getitem__(self, k: int) -> tuple[int, np.ndarray, np.ndarray]:
        _, src, tgt = self.parts[self.part[k]][int(self.index[k])]
        return k, src, tgt

    def lengths(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw `epoch`'s pairs, which the dataset then serves; their source and target
        lengths."""
        drawn = []
        for d, (part, count) in enumerate(zip(self.parts, self.counts, strict=True)):
            rng = np.random.default_rng([self.seed, epoch, d])
            drawn.append(draw(len(part), int(count), rng))
        self.part = np.repeat(np.arange(len(self.parts)), self.counts)
        self.index = np.concatenate(drawn)
        src = np.concatenate([p.src_lens[i] for p, i in zip(self.parts, drawn, strict=True)])
        tgt = np.concatenate([p.tgt_lens[i] for p, i in zip(self.parts, drawn, strict=True)])
        return src, tgt
