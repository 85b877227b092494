"""BPE-dropout: segmentations that decode to the line, one draw per epoch saved in the run
directory and read back, served by the loader epoch by epoch, within the filter's limit."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_config, toy_overrides
from lightning_fabric.utilities.data import _set_sampler_epoch
from recording import fit_recording

from seq2seq.data.batching import collate
from seq2seq.data.corpus import normalize, read_lines
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.subword_sampling import BPEDropoutSplit

# Prints a hash of SentencePiece's BPE-dropout ids of some lines, the seed set just before
SAMPLE_IN_A_NEW_PROCESS = """
import hashlib, sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
spm.set_random_generator_seed(7)
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
ids = sp.encode(lines, enable_sampling=True, alpha=0.1, num_threads=1)
print(hashlib.sha256(repr(ids).encode()).hexdigest())
"""


def val_lines(shared_data: Path) -> list[str]:
    return [normalize(x) for x in read_lines(shared_data / "multi30k" / "val.de.gz")][:500]


def test_sampled_segmentations_decode_to_the_line(multi30k, shared_data: Path) -> None:
    tokenizer, lines = multi30k.tokenizer, val_lines(shared_data)
    sampled = tokenizer.sample_tgt(lines, 0.1, seed=7)
    assert tokenizer.decode_tgt(sampled) == lines
    assert tokenizer.sample_tgt(lines, 0.1, seed=7) == sampled  # one process
    assert tokenizer.sample_tgt(lines, 0.1, seed=8) != sampled
    deterministic = tokenizer.encode_tgt(lines)
    assert tokenizer.sample_tgt(lines, 0.0, seed=7) == deterministic
    assert sum(map(len, sampled)) > 1.1 * sum(map(len, deterministic))


def test_sentencepiece_sampling_is_not_replayed_by_its_seed_in_another_process(
    multi30k, shared_data: Path, tmp_path: Path
) -> None:
    """Why each epoch's draw is saved: if this starts failing, a seed could replace the files."""
    model, text = tmp_path / "tgt.model", tmp_path / "lines.txt"
    model.write_bytes(multi30k.tokenizer.tgt_model)
    text.write_text("\n".join(val_lines(shared_data)), encoding="utf-8")
    script = tmp_path / "sample.py"
    script.write_text(SAMPLE_IN_A_NEW_PROCESS)
    hashes = {
        subprocess.run(
            [sys.executable, str(script), str(model), str(text)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for _ in range(3)
    }
    assert len(hashes) > 1


def bpe_dropout_module(toy_files: Path, tmp_path: Path, *overrides: str) -> TranslationDataModule:
    config = compose_config(
        [*toy_overrides(toy_files, tmp_path / "cache"), "data.bpe_dropout=0.3", *overrides]
    )
    module = TranslationDataModule(config, tmp_path / "run")
    module.setup()
    return module


def served(module: TranslationDataModule, epoch: int) -> list[tuple[list[int], list[int]]]:
    """(source ids, target ids) of every pair, in split order, as the training set serves
    them in `epoch`."""
    dataset = module.dataset("train", shuffle=True)
    assert isinstance(dataset, BPEDropoutSplit)
    dataset.lengths(epoch)
    return [(s.tolist(), t.tolist()) for _, s, t in (dataset[i] for i in range(len(dataset)))]


def test_an_epochs_draw_is_saved_and_read_back(
    toy_files: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = bpe_dropout_module(toy_files, tmp_path)
    epoch_3 = served(module, 3)
    resumed = bpe_dropout_module(toy_files, tmp_path)  # a resumed run, or another process
    with caplog.at_level(logging.INFO, logger="seq2seq.data.subword_sampling"):
        assert served(resumed, 3) == epoch_3
    # read, not drawn again: in one process a redraw from the same seed would also be equal
    assert "epoch 3: segmentation read from" in caplog.text and "drawn" not in caplog.text
    sources, targets = module.raw_pairs("train")
    tokenizer = module.tokenizer
    assert tokenizer.src.decode([s for s, _ in epoch_3]) == [normalize(x) for x in sources]
    assert tokenizer.decode_tgt([t for _, t in epoch_3]) == [normalize(x) for x in targets]
    assert served(module, 4) != epoch_3
    saved = tmp_path / "run" / "bpe_dropout"
    assert sorted(p.name for p in saved.iterdir()) == [".epoch00004.lock", "epoch00004"]


def test_pairs_sampled_too_long_keep_their_cached_ids(toy_files: Path, tmp_path: Path) -> None:
    limit = 12  # at dropout 0.99 nearly every merge is skipped: about a piece per character
    module = bpe_dropout_module(
        toy_files, tmp_path, f"data.filter.max_len={limit}", "data.bpe_dropout=0.99"
    )
    cached = module.prepared.splits["train"]
    sources, targets = module.raw_pairs("train")
    dataset = module.dataset("train", shuffle=True)
    src_lens, tgt_lens = dataset.lengths(0)
    assert max(src_lens.max(), tgt_lens.max()) <= limit
    fell_back = 0
    for i in range(len(dataset)):
        _, *sides = dataset[i]
        for got, kept, line, decode in (
            (sides[0], cached[i][1], sources[i], module.tokenizer.src.decode),
            (sides[1], cached[i][2], targets[i], module.tokenizer.tgt.decode),
        ):
            assert decode(got.tolist()) == normalize(line)
            if len(normalize(line)) > limit + 3:  # it would take 4 merges (1% each) to fit
                assert np.array_equal(got, kept)
                fell_back += 1
    assert fell_back > 0


def test_the_loader_serves_each_epochs_segmentation(toy_files: Path, tmp_path: Path) -> None:
    module = bpe_dropout_module(toy_files, tmp_path, "data.max_tokens=200")
    loader = module.train_dataloader()
    for epoch in (0, 4):
        _set_sampler_epoch(loader, epoch)  # what Lightning's fit loop calls at each epoch start
        batches = list(loader)
        pairs = served(module, epoch)  # the draw the loader used
        assert sorted(i for b in batches for i in b.index.tolist()) == list(range(len(pairs)))
        for batch in batches:
            items = [(i, np.array(pairs[i][0]), np.array(pairs[i][1])) for i in batch.index]
            expected = collate(items)
            assert batch.src.equal(expected.src) and batch.tgt_out.equal(expected.tgt_out)
            assert batch.src.numel() <= 200 and batch.tgt_in.numel() <= 200


def test_every_epoch_serves_its_own_batches_whole_and_validates(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = bpe_dropout_module(toy_files, tmp_path, "data.max_tokens=200")
    # SentencePiece's draws at one rate can give every epoch the same batch count (about 1 run
    # in 8 at 0.3): each epoch's target side at 0.99 or 0.0 by its seed makes the counts differ
    sample_tgt = module.tokenizer.sample_tgt
    monkeypatch.setattr(
        module.tokenizer,
        "sample_tgt",
        lambda lines, dropout, seed: sample_tgt(lines, 0.99 if seed % 2 else 0.0, seed),
    )
    model = fit_recording(module, tmp_path, epochs=6)
    assert len(set(model.expected.values())) > 1  # the epochs differ in their number of batches
    for batches in model.seen.values():
        assert sorted(i for b in batches for i in b) == list(
            range(len(module.dataset("train", True)))
        )
