"""Data-parallel training: the token-budget sampler shared among processes, and a real
two-process run through Lightning's DDP strategy on CPU (gloo)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers import assert_scores_of_the_files_named, compose_config, run, toy_overrides

from seq2seq.data.batching import TokenBudgetBatchSampler
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.dataset import EncodedSplit
from seq2seq.decoding.checkpoint import read_checkpoint
from seq2seq.errors import ConfigError
from seq2seq.training.module import TranslationModule


def samplers(lengths: np.ndarray, replicas: int, max_tokens: int = 40):
    return [
        TokenBudgetBatchSampler(lengths, lengths[::-1].copy(), max_tokens, True, 3, replicas, r)
        for r in range(replicas)
    ]


@pytest.mark.parametrize("replicas", [2, 3])
def test_each_pair_goes_to_exactly_one_process_and_all_run_equal_steps(replicas: int) -> None:
    lengths = np.random.default_rng(0).integers(1, 12, size=257)
    for epoch in (0, 1):
        shards = samplers(lengths, replicas)
        for shard in shards:
            shard.set_epoch(epoch)
        batches = [list(shard) for shard in shards]
        assert len({len(b) for b in batches}) == 1  # the same number of steps everywhere
        pairs = [i for shard in batches for batch in shard for i in batch]
        assert sorted(pairs) == list(range(257))  # none twice, none skipped
        for shard, shard_batches in zip(shards, batches, strict=True):
            for batch in shard_batches:
                assert len(batch) * int(shard.size[batch].max()) <= 40
    one = samplers(lengths, 1)[0]
    assert len(one) <= sum(len(s) for s in samplers(lengths, replicas)) <= len(one) + replicas


def test_the_same_epoch_is_drawn_alike_by_every_process() -> None:
    lengths = np.random.default_rng(1).integers(1, 12, size=100)
    first, second = samplers(lengths, 2)
    assert not set(map(tuple, first)) & set(map(tuple, second))
    first.set_epoch(1)
    assert list(first) != list(samplers(lengths, 2)[0])  # another epoch, another order


def test_too_few_pairs_for_the_processes_is_a_config_error() -> None:
    lengths = np.array([5, 5, 5])
    with pytest.raises(ConfigError, match="trainer.devices: 3 batches of one pair each"):
        len(samplers(lengths, 2, max_tokens=6)[0])


def two_processes(toy_files: Path, tmp_path: Path) -> list[str]:
    """A tiny model trained by two gloo processes on the toy corpus."""
    return [
        *toy_overrides(toy_files, tmp_path / "cache"),
        "model=transformer_tiny",
        "data.max_tokens=160",
        "decoding=greedy",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.num_sanity_val_steps=0",
    ]


def train_in_run_dir(overrides: list[str], tmp_path: Path) -> None:
    """`seq2seq.train` into tmp_path/run; fails the test on a non-zero exit."""
    result = run("train", tmp_path, *overrides, "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_on_cpu_share_each_epoch(toy_files: Path, tmp_path: Path) -> None:
    overrides = [*two_processes(toy_files, tmp_path), "trainer.max_epochs=2", "average_last=2"]
    train_in_run_dir(overrides, tmp_path)
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert_scores_of_the_files_named(summary["test"]["test"], 30)  # all 30, each once
    config = compose_config(overrides)
    data = TranslationDataModule(config)
    data.setup()
    single = data.batch_sampler("train", shuffle=True)
    shard = TokenBudgetBatchSampler(
        single.src_size - 1, single.tgt_size - 1, 160, True, config.seed, num_replicas=2, rank=0
    )
    steps = 0
    for epoch in (0, 1):
        shard.set_epoch(epoch)
        steps += len(shard)
    last = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert last["global_step"] == steps  # half the batches per process, not all of them
    assert steps < len(single) * 2

    # validation: each process decoded its share of the batches, and both scored all 30
    logs = [tmp_path / "run" / "train.log", tmp_path / "run" / "train_ddp_process_1.log"]
    pattern = r"validation BLEU \(greedy\) ([\d.]+) on (\d+) of 30 sentences \((\d+) decoded"
    ranks = [re.findall(pattern, log.read_text()) for log in logs]
    assert len(ranks[0]) == len(ranks[1]) == 2, ranks
    for first, second in zip(*ranks, strict=True):
        assert first[:2] == second[:2] and first[1] == "30"  # the same score on every process
        assert 0 < int(first[2]) < 30 and int(first[2]) + int(second[2]) == 30
    # ... and the score is a one-process validation's on the same checkpoint
    with open(tmp_path / "run" / "metrics.csv") as f:
        logged = [float(row["val/bleu"]) for row in csv.DictReader(f) if row["val/bleu"]]
    one_process = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, precision="32-true", default_root_dir=tmp_path
    )
    module = TranslationModule(config, data.tokenizer)
    (result,) = one_process.validate(
        module, datamodule=data, ckpt_path=tmp_path / "run" / "checkpoints" / "epoch001.ckpt"
    )
    assert result["val/bleu"] == pytest.approx(logged[1], abs=1e-6)
    assert float(ranks[0][1][0]) == pytest.approx(logged[1], abs=1e-4)


@pytest.mark.slow
def test_two_processes_train_on_one_bpe_dropout_draw(toy_files: Path, tmp_path: Path) -> None:
    overrides = [
        *two_processes(toy_files, tmp_path),
        "data.bpe_dropout=0.3",
        "trainer.max_epochs=1",
        "average_last=0",
        "evaluate_after=false",
    ]
    train_in_run_dir(overrides, tmp_path)
    drawn = EncodedSplit.load(tmp_path / "run" / "bpe_dropout" / "epoch00000")
    seed = compose_config(overrides).seed
    shard = TokenBudgetBatchSampler(drawn.src_lens, drawn.tgt_lens, 160, True, seed, 2, 0)
    last = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert last["global_step"] == len(shard)  # both processes cut the saved draw's batches
    logs = [
        (tmp_path / "run" / name).read_text() for name in ("train.log", "train_ddp_process_1.log")
    ]
    told = sorted(
        "drawn" if "epoch 0: segmentation drawn into" in text else "read"
        for text in logs
        if "epoch 0: segmentation" in text
    )
    assert told == ["drawn", "read"]  # one process drew the epoch, the other read its draw
    data = TranslationDataModule(compose_config(overrides))
    data.setup()
    split = data.prepared.splits["train"]
    assert drawn.tgt_lens.sum() > split.tgt_lens.sum()  # a draw, not the cached encoding


@pytest.mark.slow
def test_two_processes_keep_the_moving_average_of_every_update(
    toy_files: Path, tmp_path: Path
) -> None:
    overrides = [
        *two_processes(toy_files, tmp_path),
        "optim.ema_decay=0.5",
        "trainer.max_epochs=1",
        "average_last=0",
        "evaluate_after=false",
    ]
    train_in_run_dir(overrides, tmp_path)
    last = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert int(last["averaging_state"]["n_averaged"]) == last["global_step"] > 1
    trained = last["current_model_state"]
    assert trained.keys() == last["state_dict"].keys()
    assert any(not torch.equal(trained[k], v) for k, v in last["state_dict"].items())
