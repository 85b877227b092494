"""Token-budget batches: exact padding, budget respected, each pair once, order by seed+epoch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import compose_config, toy_overrides, wired_model
from lightning_fabric.utilities.data import _set_sampler_epoch
from recording import RecordBatches, bare_trainer

from seq2seq.data.batching import TokenBudgetBatchSampler, collate
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.tokenizer import PAD_ID


def test_collate_exact_output() -> None:
    items = [(7, np.array([10, 11, 12]), np.array([20])), (3, np.array([13]), np.array([21, 22]))]
    batch = collate(items)
    assert batch.src.tolist() == [[10, 11, 12, 3], [13, 3, 0, 0]]
    assert batch.tgt_in.tolist() == [[2, 20, 0], [2, 21, 22]]
    assert batch.tgt_out.tolist() == [[20, 3, 0], [21, 22, 3]]
    assert batch.index.tolist() == [7, 3]
    assert batch.tgt_tokens == 5 == int((batch.tgt_out != 0).sum())  # counted on the host
    moved = batch.to(torch.device("cpu"))
    assert moved.tgt_tokens == 5 and torch.equal(moved.tgt_out, batch.tgt_out)


def test_collate_pads_lengths_to_a_multiple() -> None:
    items = [(7, np.array([10, 11, 12]), np.array([20])), (3, np.array([13]), np.array([21, 22]))]
    batch = collate(items, pad_to_multiple=3)
    assert batch.src.tolist() == [[10, 11, 12, 3, 0, 0], [13, 3, 0, 0, 0, 0]]  # 4 -> 6
    assert batch.tgt_in.tolist() == [[2, 20, 0], [2, 21, 22]]  # 3: a multiple already
    assert batch.tgt_out.tolist() == [[20, 3, 0], [21, 22, 3]]
    assert batch.tgt_tokens == 5


@pytest.mark.parametrize("static_shapes", [False, True])
def test_padding_to_a_multiple_keeps_loss_and_gradients(static_shapes: bool) -> None:
    """Extra padding columns are masked keys and unscored targets: the loss and every
    gradient equal the unpadded batch's (float64, so only summation order differs)."""
    model = wired_model().double()
    rng = np.random.default_rng(0)
    items = [
        (i, rng.integers(4, 40, s), rng.integers(4, 40, t))
        for i, (s, t) in enumerate([(5, 3), (2, 7), (9, 4)])
    ]

    def loss_and_gradients(multiple: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch = collate(items, pad_to_multiple=multiple)
        loss = model.loss(batch.src, batch.tgt_in, batch.tgt_out, 0.1, static_shapes)
        return loss, torch.autograd.grad(loss, list(model.parameters()))

    assert collate(items, pad_to_multiple=8).src.shape == (3, 16)  # from 10
    assert collate(items, pad_to_multiple=8).tgt_in.shape == (3, 8)
    loss, gradients = loss_and_gradients(1)
    padded_loss, padded_gradients = loss_and_gradients(8)
    torch.testing.assert_close(padded_loss, loss, rtol=1e-12, atol=1e-12)
    for padded, plain in zip(padded_gradients, gradients, strict=True):
        torch.testing.assert_close(padded, plain, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("multiple", [4, 8])
def test_padded_batches_take_few_shapes_on_multi30k(multi30k, multiple: int) -> None:
    """Every pair once, within the budget at its padded lengths; the shapes and padding that
    the sampler reports are those of the collated tensors; fewer shapes than without."""
    train = multi30k.splits["train"]
    args = (train.src_lens, train.tgt_lens, 8192, True, 1)
    sampler = TokenBudgetBatchSampler(*args, pad_to_multiple=multiple)
    shapes, real, total = set(), 0, 0
    batches = list(sampler)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(train)))
    for indices in batches:
        batch = collate([train[i] for i in indices], pad_to_multiple=multiple)
        (size, src_len), tgt_len = batch.src.shape, batch.tgt_in.shape[1]
        assert src_len % multiple == 0 and tgt_len % multiple == 0
        assert size * max(src_len, tgt_len) <= 8192
        shapes.add((size, src_len, tgt_len))
        real += int((batch.src != PAD_ID).sum() + (batch.tgt_in != PAD_ID).sum())
        total += batch.src.numel() + batch.tgt_in.numel()
    assert sampler.shapes() == len(shapes)
    assert sampler.padding_fraction() == pytest.approx(1 - real / total, abs=1e-12)
    plain = TokenBudgetBatchSampler(*args)
    assert 2 * sampler.shapes() < plain.shapes()
    assert plain.padding_fraction() < sampler.padding_fraction()


def test_only_training_batches_are_padded_to_the_multiple(toy_files: Path, tmp_path: Path) -> None:
    overrides = [*toy_overrides(toy_files, tmp_path / "cache"), "data.pad_to_multiple=8"]
    module = TranslationDataModule(compose_config(overrides))
    module.setup()
    for batch in module.train_dataloader():
        assert batch.src.shape[1] % 8 == 0 and batch.tgt_in.shape[1] % 8 == 0
    for batch in module.val_dataloader():  # to the longest pair: some row ends in a token
        assert (batch.src[:, -1] != PAD_ID).any() and (batch.tgt_out[:, -1] != PAD_ID).any()


def check_epoch(sampler: TokenBudgetBatchSampler, n: int, max_tokens: int) -> None:
    batches = list(sampler)
    seen = np.concatenate([np.asarray(b) for b in batches])
    assert sorted(seen.tolist()) == list(range(n)), "every pair exactly once per epoch"
    for b in batches:
        padded = len(b) * max(sampler.src_size[b].max(), sampler.tgt_size[b].max())
        assert padded <= max_tokens


@pytest.mark.parametrize("max_tokens", [4096, 1000, 130])
def test_batches_respect_the_budget_on_multi30k(multi30k, max_tokens: int) -> None:
    train = multi30k.splits["train"]
    for shuffle in (True, False):
        sampler = TokenBudgetBatchSampler(train.src_lens, train.tgt_lens, max_tokens, shuffle, 1)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            check_epoch(sampler, len(train), max_tokens)


def test_padding_under_ten_percent_on_multi30k_train(multi30k) -> None:
    train = multi30k.splits["train"]
    sampler = TokenBudgetBatchSampler(train.src_lens, train.tgt_lens, 4096, True, 1234)
    assert sampler.padding_fraction() < 0.10


def test_oversized_evaluation_pair_gets_its_own_batch() -> None:
    sampler = TokenBudgetBatchSampler(np.array([3, 50, 4]), np.array([3, 2, 5]), 20, False)
    assert list(sampler) == [[0, 2], [1]]


def test_order_is_a_function_of_seed_and_epoch(multi30k) -> None:
    train = multi30k.splits["train"]

    def order(seed: int, epoch: int) -> list[list[int]]:
        sampler = TokenBudgetBatchSampler(train.src_lens, train.tgt_lens, 4096, True, seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(1, 0) == order(1, 0)
    assert order(1, 3) == order(1, 3)  # a restart at epoch 3 replays epoch 3's order
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)


def test_lightning_sets_the_epoch_on_our_sampler(toy_files: Path, tmp_path: Path) -> None:
    module = TranslationDataModule(compose_config(toy_overrides(toy_files, tmp_path / "cache")))
    module.setup()
    loader = module.train_dataloader()
    _set_sampler_epoch(loader, 5)  # what Lightning's fit loop calls at each epoch start
    expected = module.batch_sampler("train", shuffle=True)
    expected.set_epoch(5)
    assert [b.index.tolist() for b in loader] == list(expected)


def test_trainer_epochs_follow_the_seeded_order(toy_files: Path, tmp_path: Path) -> None:
    config = compose_config([*toy_overrides(toy_files, tmp_path / "cache"), "data.max_tokens=200"])
    data = TranslationDataModule(config)
    model = RecordBatches()
    trainer = bare_trainer(tmp_path, max_epochs=2, limit_val_batches=0)
    trainer.fit(model, datamodule=data)
    for epoch in (0, 1):
        expected = data.batch_sampler("train", shuffle=True)
        expected.set_epoch(epoch)
        assert model.seen[epoch] == list(expected)
    assert model.seen[0] != model.seen[1]
