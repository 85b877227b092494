"""BPE-dropout (Provilkov et al. 2020): the training split segmented anew each epoch.

SentencePiece's sampling cannot be replayed in another process: its generator depends on the
process as well as on `set_random_generator_seed` (tested). So each epoch's segmentation is
drawn once and, given a directory (the run's), saved there; a run resumed in the middle of the
epoch, and every other data-parallel process, reads that draw instead of making its own. The
pairs are the cached split's (the filters judged them on their deterministic encoding); a pair
whose sampled encoding is longer than the filter's limit keeps its deterministic one.
"""

from __future__ import annotations

import itertools
import logging
import shutil
from pathlib import Path

import numpy as np
import torch

from seq2seq.concurrency import build_lock
from seq2seq.data.dataset import EncodedSplit
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.io import atomic_dir

log = logging.getLogger(__name__)


class BPEDropoutSplit(torch.utils.data.Dataset):
    """The pairs of `split` in the segmentation of the epoch last asked for by `lengths`.

    `sources` and `targets` are the split's normalised lines in dataset order. Without a
    `directory` each epoch is drawn in memory and a resumed run cannot see it again.
    """

    def __init__(
        self,
        split: EncodedSplit,
        sources: list[str],
        targets: list[str],
        tokenizer: Tokenizer,
        dropout: float,
        seed: int,
        max_len: int,
        directory: Path | None = None,
    ) -> None:
        assert len(sources) == len(targets) == len(split), "one line per pair of the split"
        self.split, self.sources, self.targets = split, sources, targets
        self.tokenizer, self.dropout, self.seed, self.max_len = tokenizer, dropout, seed, max_len
        self.directory = directory
        self.epoch: int | None = None
        self.sampled = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        return self.sampled[i]

    def lengths(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target lengths of `epoch`'s segmentation, which the dataset then serves."""
        if epoch != self.epoch:
            self.sampled = self._saved_or_drawn(epoch)
            if self.split.max_len is not None:
                self.sampled.truncate(self.split.max_len)
            self.epoch = epoch
        return self.sampled.src_lens, self.sampled.tgt_lens

    def epoch_path(self, epoch: int) -> Path:
        assert self.directory is not None
        return self.directory / f"epoch{epoch:05d}"

    def _saved_or_drawn(self, epoch: int) -> EncodedSplit:
        if self.directory is None:
            return self._draw(epoch)
        path = self.epoch_path(epoch)
        drawn = False
        if not (path / "counts.json").exists():
            with build_lock(path):  # data-parallel processes: one draws, the others read
                if not (path / "counts.json").exists():
                    with atomic_dir(path) as tmp:
                        self._draw(epoch).save(tmp)
                    self._remove_before(epoch)
                    drawn = True
        log.info(
            "BPE-dropout, epoch %d: segmentation %s %s",
            epoch,
            "drawn into" if drawn else "read from",
            path,
        )
        return EncodedSplit.load(path)

    def _remove_before(self, epoch: int) -> None:
        """Earlier epochs' draws: no resume goes back to them (readers keep their mapping)."""
        assert self.directory is not None
        for old in self.directory.glob("epoch[0-9]*"):
            if old.is_dir() and int(old.name.removeprefix("epoch")) < epoch:
                shutil.rmtree(old, ignore_errors=True)
                old.with_name(f".{old.name}.lock").unlink(missing_ok=True)

    def _draw(self, epoch: int) -> EncodedSplit:
        """A segmentation seeded from (seed, epoch, side): in one process the epochs differ and
        a draw repeats; in another it does not repeat (SentencePiece), hence the saved files."""
        split = self.split
        src, src_offsets = self._segment(epoch, self.sources, split.src, split.src_offsets, 0)
        tgt, tgt_offsets = self._segment(epoch, self.targets, split.tgt, split.tgt_offsets, 1)
        return EncodedSplit(src, src_offsets, tgt, tgt_offsets, split.line, split.counts)

    def _segment(
        self, epoch: int, lines: list[str], ids: np.ndarray, offsets: np.ndarray, side: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One side's sampled ids, flat, and their offsets (as EncodedSplit holds them)."""
        sample = self.tokenizer.sample_src if side == 0 else self.tokenizer.sample_tgt
        seed = int(np.random.SeedSequence([self.seed, epoch, side]).generate_state(1)[0])
        segmented = sample(lines, self.dropout, seed)
        for k, sampled in enumerate(segmented):
            if len(sampled) > self.max_len:  # too long for training: the cached ids
                segmented[k] = ids[offsets[k] : offsets[k + 1]].tolist()
        flat_offsets = np.zeros(len(segmented) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in segmented], out=flat_offsets[1:])
        flat = np.fromiter(itertools.chain.from_iterable(segmented), np.int32, flat_offsets[-1])
        return flat, flat_offsets
