"""Bidirectional training (Ding et al. 2021, "Improving Neural Machine Translation by
Bidirectional Training"): for the first `epochs` epochs the training split serves every pair
twice, as given and reversed (target -> source), then as given only.

The reversed pairs give the shared embeddings and the attention both directions' alignments
before the model tunes to the one it is asked for; Ding et al. spend a third of training on
them. The ids of a target sentence must mean the same on the source side, hence one joint
vocabulary. Which epochs serve both directions depends on the epoch number alone, so a resumed
run, and every data-parallel process, serves the same pairs.
"""

from __future__ import annotations

import numpy as np
import torch

from seq2seq.data.dataset import EncodedSplit


class BidirectionalSplit(torch.utils.data.Dataset):
    """Pair i < n of `split` as given; pair n + i, in the epochs that serve both directions,
    is pair i reversed."""

    def __init__(self, split: EncodedSplit, epochs: int) -> None:
        self.split, self.epochs = split, epochs
        self.both = epochs > 0  # whether the epoch last asked for by `lengths` serves both

    def __len__(self) -> int:
        return 2 * len(self.split) if self.both else len(self.split)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        n = len(self.split)
        if i < n:
            return self.split[i]
        _, src, tgt = self.split[i - n]
        return i, tgt, src

    def lengths(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target lengths of the pairs `epoch` serves, which the dataset then serves."""
        self.both = epoch < self.epochs
        src, tgt = self.split.src_lens, self.split.tgt_lens
        if not self.both:
            return src, tgt
        return np.concatenate([src, tgt]), np.concatenate([tgt, src])
