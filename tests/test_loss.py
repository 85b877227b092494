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


def r_drop_reference(hidden, weight, target, smoothing: float, alpha: float, pad=None):
    """R-Drop's loss on full logits through autograd, halved: per scored row, the mean of the
    two passes' cross-entropies plus alpha / 4 * (KL(P1||P2) + KL(P2||P1))."""
    n = target.shape[0]
    log_p = (hidden @ weight.T).log_softmax(dim=-1).unflatten(0, (2, n))  # (2, N, V)
    scored = torch.ones(n, dtype=torch.bool) if pad is None else target != pad
    ce = [
        F.nll_loss(log_p[k], target, reduction="none") * (1 - smoothing)
        - log_p[k].mean(dim=-1) * smoothing
        for k in range(2)
    ]
    kl = F.kl_div(log_p[1], log_p[0], log_target=True, reduction="none").sum(-1) + F.kl_div(
        log_p[0], log_p[1], log_target=True, reduction="none"
    ).sum(-1)
    return ((ce[0] + ce[1]) / 2 + alpha / 4 * kl)[scored].sum()


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("alpha", [0.0, 0.7, 5.0])
@pytest.mark.parametrize("chunk_rows", [1, 8, 512])
def test_r_drop_loss_and_gradients_equal_the_full_logits_reference(
    smoothing: float, alpha: float, chunk_rows: int
) -> None:
    hidden, weight, target = inputs(rows=2 * 37)
    target = target[:37]
    pad = int(target[5])  # some rows are padding, in both passes
    for ignore_index in (None, pad):
        expected = r_drop_reference(hidden, weight, target, smoothing, alpha, ignore_index)
        loss = label_smoothed_cross_entropy(
            hidden, weight, target, smoothing, chunk_rows, ignore_index, r_drop=alpha
        )
        torch.testing.assert_close(loss, expected, rtol=1e-9, atol=1e-9)
        got = torch.autograd.grad(2.5 * loss, (hidden, weight))
        want = torch.autograd.grad(2.5 * expected, (hidden, weight))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
        with torch.no_grad():
            torch.testing.assert_close(
                label_smoothed_cross_entropy(
                    hidden, weight, target, smoothing, chunk_rows, ignore_index, r_drop=alpha
                ),
                expected.detach(),
            )


def test_r_drop_of_two_equal_passes_is_the_plain_loss() -> None:
    """Where the passes agree (no dropout) the penalty is 0: the loss is the one pass's, and
    each pass's rows get half of that pass's gradient."""
    hidden, weight, target = inputs()
    twice = torch.cat([hidden, hidden]).detach().requires_grad_(True)
    r_drop = label_smoothed_cross_entropy(twice, weight, target, 0.1, 8, r_drop=3.0)
    plain = label_smoothed_cross_entropy(hidden, weight, target, 0.1, 8)
    torch.testing.assert_close(r_drop, plain, rtol=1e-12, atol=1e-12)
    (grad_twice,) = torch.autograd.grad(r_drop, twice)
    (grad_plain,) = torch.autograd.grad(plain, hidden)
    torch.testing.assert_close(grad_twice[:37] + grad_twice[37:], grad_plain)
    torch.testing.assert_close(grad_twice[:37], grad_twice[37:])
