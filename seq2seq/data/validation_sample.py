"""The validation pairs decoded during training: all of data.val_split, or a seeded random
sample of data.val_subset of them.

A random sample, not fewer batches (trainer.limit_val_batches): evaluation batches are sorted by
length, so the first batches hold the shortest sentences. The sample is drawn from SAMPLE_SEED
alone, not from the run's seed: every validation, every run of a corpus (whatever its seed) and
every data-parallel process decodes the same pairs, so their scores compare. Samples of the same
split are nested: the first n pairs drawn are the sample of n.
"""

from __future__ import annotations

import numpy as np
import torch

from seq2seq.data.dataset import EncodedSplit

SAMPLE_SEED = 0  # the one seed of every validation sample


def sample_indices(size: int, count: int) -> np.ndarray:
    """Indices, ascending, of `count` pairs drawn at random from a split of `size` pairs."""
    return np.sort(np.random.default_rng(SAMPLE_SEED).permutation(size)[:count])


class SplitSample(torch.utils.data.Dataset):
    """Some pairs of an encoded split. Each is served with its index in the split, not in the
    sample, so that hypotheses stay keyed to the split's references."""

    def __init__(self, split: EncodedSplit, indices: np.ndarray) -> None:
        self.split, self.indices = split, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[int, np.ndarray, np.ndarray]:
        return self.split[int(self.indices[position])]

    @property
    def src_lens(self) -> np.ndarray:
        return self.split.src_lens[self.indices]  # read when batched: after any truncation

    @property
    def tgt_lens(self) -> np.ndarray:
        return self.split.tgt_lens[self.indices]
