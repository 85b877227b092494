"""data.val_subset: validation in training decodes a seeded random sample of the validation
split, the same in every run whatever its seed, scored against the references of its pairs."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
from helpers import compose_config, small_model

import seq2seq.training.module as training_module
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.validation_sample import sample_indices
from seq2seq.decoding.search import Hypothesis
from seq2seq.errors import ConfigError
from seq2seq.training.module import TranslationModule

SUBSET = 10  # of the toy corpus's 30 validation pairs


def datamodule(toy_files: Path, cache: Path, *overrides: str) -> TranslationDataModule:
    config = compose_config([*small_model(toy_files, cache), *overrides])
    module = TranslationDataModule(config)
    module.setup()
    return module


def validated_indices(data: TranslationDataModule) -> list[int]:
    """The split indices of the pairs validation decodes, in the order it decodes them."""
    return [i for batch in data.val_dataloader() for i in batch.index.tolist()]


def test_the_sample_is_the_same_whatever_the_training_seed(toy_files: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = datamodule(toy_files, cache, "seed=1", f"data.val_subset={SUBSET}")
    second = datamodule(toy_files, cache, "seed=2", f"data.val_subset={SUBSET}")
    indices = validated_indices(first)
    assert indices == validated_indices(second)  # the same pairs in the same batches
    assert sorted(indices) == sample_indices(30, SUBSET).tolist()  # each once
    assert validated_indices(first) == indices  # and at every validation
    # the whole split when off
    assert sorted(validated_indices(datamodule(toy_files, cache))) == list(range(30))


def test_the_sample_is_random_not_the_shortest_pairs(toy_files: Path, tmp_path: Path) -> None:
    data = datamodule(toy_files, tmp_path / "cache", f"data.val_subset={SUBSET}")
    lengths = data.prepared.splits["val"].src_lens
    sampled = lengths[validated_indices(data)]
    assert np.mean(sampled) > np.mean(np.sort(lengths)[:SUBSET])  # limit_val_batches' choice
    assert len(np.unique(sampled)) > 3  # short and long sentences alike
    # batches still sorted by length: the sample's source lengths rise from batch to batch
    batches = [batch.index.tolist() for batch in data.val_dataloader()]
    assert len(batches) > 1
    longest = [int(lengths[b].max()) for b in batches]
    assert longest == sorted(longest)


def test_validation_scores_the_sample_against_its_own_references(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """A search that outputs each pair's reference scores 100 BLEU only if every hypothesis is
    compared with the reference of its own pair of the split."""
    data = datamodule(toy_files, tmp_path / "cache", f"data.val_subset={SUBSET}")
    split = data.prepared.splits["val"]
    target_of = {tuple(split[i][1].tolist()): split[i][2].tolist() for i in range(len(split))}
    assert len(target_of) == len(split)  # every source distinct: the oracle below is exact

    def oracle(model, src, max_len):
        rows = [row[row != model.pad_id][:-1].tolist() for row in src]  # without EOS
        return [(Hypothesis(target_of[tuple(row)], 0.0),) for row in rows]

    monkeypatch.setattr(training_module, "greedy_search", oracle)
    module = TranslationModule(data.config, data.tokenizer)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        default_root_dir=tmp_path, precision="32-true",
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        (result,) = trainer.validate(module, datamodule=data)
    assert result["val/bleu"] == pytest.approx(100.0)
    assert "validation BLEU (greedy) 100.0000 on 10 of 30 sentences" in caplog.text
    assert "a seeded random sample of 10 of the 30 pairs of 'val'" in caplog.text


def test_a_subset_of_the_whole_split_or_more_validates_on_all_of_it(
    toy_files: Path, tmp_path: Path, caplog
) -> None:
    data = datamodule(toy_files, tmp_path / "cache", "data.val_subset=30")
    with caplog.at_level(logging.INFO, logger="seq2seq.data.datamodule"):
        assert data.validation_sample() is None
    assert "data.val_subset=30: 'val' has 30 pairs; validation decodes all of them" in caplog.text
    assert sorted(validated_indices(data)) == list(range(30))


def test_a_negative_subset_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^config key 'data.val_subset': must be >= 0"):
        compose_config(["data.val_subset=-1"])
