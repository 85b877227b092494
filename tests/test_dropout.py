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
