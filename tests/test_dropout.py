"""Packed dropout masks: torch's dropout in distribution and gradient, drawn from torch's seed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.model.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_masks_drop_a_fraction_p(p: float) -> None:
    torch.manual_seed(0)
    kept = keep_mask(torch.Size([1000, 1000]), p, torch.device("cpu")).double().mean().item()
    assert abs((1 - kept) - p) < 5 * (p * (1 - p) / 1e6) ** 0.5  # five standard deviations


def test_each_lane_is_used_and_lanes_are_independent() -> None:
    torch.manual_seed(0)
    keep = keep_mask(torch.Size([400_000]), 0.5, torch.device("cpu")).view(-1, 4).double()
    lane_rates = keep.mean(0)
    assert torch.all((lane_rates - 0.5).abs() < 0.005), lane_rates
    both = (keep[:, 0] * keep[:, 1]).mean()  # neighbours of one 64-bit draw
    assert abs(both.item() - 0.25) < 0.005


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_and_gradient_are_the_mask_times_one_over_keep(dtype: torch.dtype) -> None:
    x = torch.randn(7, 5, 3, dtype=dtype, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.3, training=True)
    torch.manual_seed(3)
    keep = keep_mask(x.shape, 0.3, x.device)
    assert y.dtype == dtype and keep.any() and not keep.all()
    expected = torch.where(keep, x.detach() / 0.7, torch.zeros((), dtype=dtype))
    torch.testing.assert_close(y, expected)
    grad = torch.randn_like(y)
    y.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(keep, grad / 0.7, torch.zeros((), dtype=dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_bytes_of_the_mask_give_the_bool_masks_bits(dtype: torch.dtype) -> None:
    """A run draws the same masks and computes the same values as with the bool mask that
    dropout applied before: a lane is kept when at least round(p * 2**16) - 2**15."""
    x = torch.randn(9, 7, 5, dtype=dtype, requires_grad=True)
    grad = torch.randn(9, 7, 5, dtype=dtype)
    torch.manual_seed(11)
    words = torch.randint(-(2**63), 2**63 - 1, (((x.numel() + 3) // 4),), dtype=torch.int64)
    keep = words.view(torch.int16)[: x.numel()].view(x.shape) >= round(0.3 * 2**16) - 2**15
    torch.manual_seed(11)
    y = dropout(x, 0.3, training=True)
    y.backward(grad)
    scale = 1 / 0.7
    assert keep.any() and not keep.all()
    assert torch.equal(y, torch.ops.aten.native_dropout_backward(x.detach(), keep, scale))
    assert torch.equal(x.grad, torch.ops.aten.native_dropout_backward(grad, keep, scale))
    torch.manual_seed(11)
    assert torch.equal(keep_mask(x.shape, 0.3, x.device), keep)


def test_probabilities_within_2_to_the_minus_17_of_0_or_1_keep_all_or_drop_all() -> None:
    """Near 1 the threshold is 2**15, which does not fit the lanes' 16 bits (it wrapped to
    -2**15 and kept every element)."""
    shape, cpu = torch.Size([1000]), torch.device("cpu")
    assert keep_mask(shape, 2**-18, cpu).all()
    assert not keep_mask(shape, 1 - 2**-18, cpu).any()
    x = torch.randn(50, 20)
    assert torch.equal(dropout(x, 1 - 2**-18, training=True), torch.zeros(50, 20))


def test_same_seed_same_mask_other_seed_another() -> None:
    x = torch.ones(64, 64)
    masks = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        masks.append(dropout(x, 0.3, training=True))
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])


def test_off_in_evaluation_at_p_0_and_all_dropped_at_p_1() -> None:
    x = torch.randn(4, 4)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros(4, 4))
    module = Dropout(0.3).eval()
    assert module(x) is x and not dict(module.state_dict()) and repr(module) == "Dropout(p=0.3)"


def test_expectation_matches_torch_dropout() -> None:
    """Same mean and second moment as F.dropout's output (its masks are Bernoulli(1 - p))."""
    torch.manual_seed(0)
    x = torch.full((2000, 500), 2.0)
    ours, torch_s = dropout(x, 0.3, training=True), F.dropout(x, 0.3, training=True)
    for moment in (1, 2):
        assert abs(ours.pow(moment).mean() - torch_s.pow(moment).mean()) < 0.02 * moment
