"""Bidirectional training: the first epochs serve every pair as given and reversed, each once,
the later epochs the pairs as given; Lightning counts each epoch's own batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import compose_config, toy_overrides
from lightning_fabric.utilities.data import _set_sampler_epoch
from recording import fit_recording

from seq2seq.data.batching import collate
from seq2seq.data.bidirectional import BidirectionalSplit
from seq2seq.data.datamodule import TranslationDataModule


def bidirectional_module(toy_files: Path, tmp_path: Path, *overrides: str) -> TranslationDataModule:
    config = compose_config(
        [
            *toy_overrides(toy_files, tmp_path / "cache"),
            "data.bidirectional_epochs=2",
            "data.max_tokens=200",
            *overrides,
        ]
    )
    module = TranslationDataModule(config, tmp_path / "run")
    module.setup()
    return module


def as_lists(item: tuple[int, np.ndarray, np.ndarray]) -> tuple[int, list[int], list[int]]:
    index, src, tgt = item
    return index, src.tolist(), tgt.tolist()


def test_both_directions_in_the_first_epochs_then_as_given(toy_files: Path, tmp_path: Path) -> None:
    module = bidirectional_module(toy_files, tmp_path)
    encoded = module.prepared.splits["train"]
    dataset = module.dataset("train", shuffle=True)
    assert isinstance(dataset, BidirectionalSplit)
    assert module.dataset("val", shuffle=False) is module.prepared.splits["val"]
    n = len(encoded)
    for epoch in (0, 1):
        src_lens, tgt_lens = dataset.lengths(epoch)
        assert len(dataset) == 2 * n
        for i in range(n):
            _, src, tgt = as_lists(encoded[i])
            assert as_lists(dataset[i]) == (i, src, tgt)
            assert as_lists(dataset[n + i]) == (n + i, tgt, src)  # target -> source
            assert (src_lens[i], tgt_lens[i]) == (len(src), len(tgt))
            assert (src_lens[n + i], tgt_lens[n + i]) == (len(tgt), len(src))
    for epoch in (2, 7):
        src_lens, tgt_lens = dataset.lengths(epoch)
        assert len(dataset) == n
        assert np.array_equal(src_lens, encoded.src_lens)
        assert np.array_equal(tgt_lens, encoded.tgt_lens)


def test_the_loader_serves_each_pair_once_per_direction(toy_files: Path, tmp_path: Path) -> None:
    module = bidirectional_module(toy_files, tmp_path)
    n = len(module.prepared.splits["train"])
    loader = module.train_dataloader()
    dataset = module.dataset("train", shuffle=True)
    for epoch, pairs in ((0, 2 * n), (1, 2 * n), (2, n)):
        _set_sampler_epoch(loader, epoch)  # what Lightning's fit loop calls at each epoch start
        batches = list(loader)
        assert sorted(i for b in batches for i in b.index.tolist()) == list(range(pairs))
        for batch in batches:
            expected = collate([dataset[i] for i in batch.index.tolist()])
            assert batch.src.equal(expected.src) and batch.tgt_out.equal(expected.tgt_out)
            assert batch.src.numel() <= 200 and batch.tgt_in.numel() <= 200


def test_every_epoch_serves_its_own_batches_whole_and_validates(
    toy_files: Path, tmp_path: Path
) -> None:
    module = bidirectional_module(toy_files, tmp_path)
    n = len(module.prepared.splits["train"])
    model = fit_recording(module, tmp_path, epochs=4)
    counts = model.expected
    assert counts[0] > counts[2] and counts[1] > counts[3]
    for epoch, batches in model.seen.items():
        pairs = 2 * n if epoch < 2 else n
        assert sorted(i for b in batches for i in b) == list(range(pairs))
