"""The fused chunked loss equals F.cross_entropy on full logits, in value and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.model.loss import label_smoothed_cross_entropy


def inputs(rows: int = 37, d: int = 16, vocab: int = 50) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    hidden = torch.randn(rows, d, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, d, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, vocab, (rows,))
    return hidden, weight, target


def reference(hidden, weight, target, smoothing: float) -> torch.Tensor:
    return F.cross_entropy(hidden @ weight.T, target, label_smoothing=smoothing, reduction="sum")


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_rows", [1, 8, 37, 512])  # many chunks, a ragged last one, one
def test_loss_and_gradients_equal_cross_entropy(smoothing: float, chunk_rows: int) -> None:
    hidden, weight, target = inputs()
    expected = reference(hidden, weight, target, smoothing)
    expected_grads = torch.autograd.grad(2.5 * expected, (hidden, weight))
    loss = label_smoothed_cross_entropy(hidden, weight, target, smoothing, chunk_rows)
    grads = torch.autograd.grad(2.5 * loss, (hidden, weight))  # upstream scale is applied
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_tied_weight_accumulates_both_gradients() -> None:
    """The output projection is the embedding too: autograd must add the two gradients."""
    hidden, weight, target = inputs()
    ids = torch.tensor([3, 4, 3])

    def total(loss_fn) -> list[torch.Tensor]:
        embedded = weight[ids].sum()
        return torch.autograd.grad(loss_fn(hidden * 1.0, weight) + embedded, (hidden, weight))

    got = total(lambda h, w: label_smoothed_cross_entropy(h, w, target, 0.1, 5))
    want = total(lambda h, w: reference(h, w, target, 0.1))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_without_gradients_gives_the_same_loss() -> None:
    hidden, weight, target = inputs()
    with torch.no_grad():
        loss = label_smoothed_cross_entropy(hidden, weight, target, 0.1, 8)
    torch.testing.assert_close(loss, reference(hidden, weight, target, 0.1).detach())


def test_bf16_autocast_runs_the_matmuls_in_bf16() -> None:
    hidden, weight, target = inputs(rows=64, d=32, vocab=100)
    hidden = hidden.detach().float().requires_grad_(True)
    weight = weight.detach().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = label_smoothed_cross_entropy(hidden, weight, target, 0.1, 16)
    loss.backward()
    expected = reference(hidden.bfloat16().float(), weight.bfloat16().float(), target, 0.1)
    assert loss.dtype == torch.float32 and hidden.grad.dtype == torch.float32
    torch.testing.assert_close(loss, expected.detach(), rtol=2e-2, atol=0)
    assert not torch.equal(loss, reference(hidden, weight, target, 0.1))  # not silently fp32


@pytest.mark.parametrize("chunk_rows", [1, 8, 512])
def test_ignored_rows_add_nothing_to_loss_or_gradients(chunk_rows: int) -> None:
    """Padding left in (static shapes) against padding selected out, and F.cross_entropy's
    ignore_index: the same loss, the same gradients, and exact zeros on the ignored rows."""
    hidden, weight, target = inputs()
    pad = 7
    target[::3] = pad  # every third row is padding, some in every chunk
    kept = target != pad
    loss = label_smoothed_cross_entropy(hidden, weight, target, 0.1, chunk_rows, ignore_index=pad)
    grads = torch.autograd.grad(2.5 * loss, (hidden, weight))
    selected = label_smoothed_cross_entropy(hidden[kept], weight, target[kept], 0.1, chunk_rows)
    expected = F.cross_entropy(
        hidden @ weight.T, target, ignore_index=pad, label_smoothing=0.1, reduction="sum"
    )
    torch.testing.assert_close(loss, selected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    expected_grads = torch.autograd.grad(2.5 * expected, (hidden, weight))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(grads[0][~kept], torch.zeros_like(grads[0][~kept]))
