"""Label-smoothed cross-entropy fused with the output projection, computed in row chunks.

The plain path materialises (tokens x vocabulary) logits, their log-softmax and three
gradients of the same size: at 4,000 tokens x 8,000 pieces that is 128 MB a tensor, and on a
CPU the time goes to touching fresh memory rather than to arithmetic (it was half of a
transformer_small training step). Here each chunk of rows goes from hidden states to loss and
to the gradients of hidden states and projection weight at once, and only a chunk of logits
ever exists (as in Liger-Kernel's fused linear cross-entropy).

The loss is F.cross_entropy's with `label_smoothing=s`, summed:
    (1 - s) * -log p(target) + s * mean_v(-log p(v)),
whose gradient with respect to the logits is softmax - (1 - s) * onehot(target) - s / V.

Why not torch's `F.linear_cross_entropy` (torch 2.13): its chunked path
(`options=torch.nn.LinearCrossEntropyOptions()`) requires label_smoothing == 0; with smoothing
it warns and computes the full logits like the plain path. Measured by scripts/loss_benchmark.py
(forward + backward, 4,000 tokens x d_model 256 x 8,000 pieces, smoothing 0.1, CPU with
avx512_bf16, 1 thread, medians of 5 interleaved rounds; docs/performance.md has the rest):
torch 1,692 ms against ours 1,291 in fp32 and 1,054 against 489 under bf16 autocast, and
366 MiB peak against 106. Even without smoothing, where it does chunk, it is 2.7x slower than
ours under bf16 autocast (which does not reach its op: the inputs must be cast), returns a bf16
loss (2e-2 relative error against 3e-6) and a weight gradient 4 to 5x less accurate.

R-Drop (Liang et al. 2021) trains on two forward passes of each batch, each with its own
dropout masks, and adds to their cross-entropies alpha times the symmetric KL divergence of the
two passes' distributions, token by token: CE_1 + CE_2 + alpha / 2 * (KL(P1||P2) + KL(P2||P1)).
Here it is that loss halved, so that it reads as the mean cross-entropy of the passes plus the
penalty (Adam does not see a constant factor). Its gradient with respect to pass 1's logits is
that of the two cross-entropies plus alpha / 4 * (P1 * (D - E_P1[D]) + P1 - P2), D = log P1 -
log P2 (pass 2's is the same with the passes swapped), computed in the same chunks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

DEFAULT_CHUNK_ROWS = 512


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The matmul dtype autocast would use here (bf16 under bf16-mixed), else the input's."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


def _smoothed_chunk(
    h: Tensor, w: Tensor, t: Tensor, c: Tensor | None, smoothing: float, grads: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One chunk of the plain loss: the rows' losses (n, 1) weighted by c (0 for padding) and,
    when `grads`, the gradient with respect to the logits less its constant -c * s / V, held as
    g (n, V) and a row scale (n, 1): c * (softmax - (1 - s) * onehot(t)) = scale * g. The
    row's max is subtracted and exp taken in place, and g is that exp with -(1 - s) * sum at
    the target: fewer passes over the (n, V) chunk than logsumexp, softmax and a subtraction."""
    exact = torch.promote_types(h.dtype, torch.float32)  # softmax and sums: fp32 at least
    logits = (h @ w.T).to(exact)  # (n, V)
    logits.sub_(logits.amax(dim=-1, keepdim=True))  # exp <= 1
    mean = logits.mean(dim=-1, keepdim=True)
    picked = logits.gather(1, t)
    e = logits.exp_()
    total = e.sum(dim=-1, keepdim=True)  # (n, 1)
    log_z = total.log()
    rows = (1.0 - smoothing) * (log_z - picked) + smoothing * (log_z - mean)
    if c is not None:
        rows = rows * c
    if not grads:
        return rows, None, None
    e.scatter_add_(1, t, total * (smoothing - 1.0))  # one entry per row: deterministic
    return rows, e, total.reciprocal() if c is None else c / total


def _r_drop_rows(
    logits: Tensor, t: Tensor, smoothing: float, alpha: float, grads: bool
) -> tuple[Tensor, Tensor | None]:
    """R-Drop's halved per-row loss of two passes' logits (2, n, V), and its gradient."""
    vocab = logits.shape[-1]
    log_p = logits.log_softmax(dim=-1)  # (2, n, V)
    p = log_p.exp()
    targets = t.expand(2, -1, -1)  # (2, n, 1)
    nll = -log_p.gather(2, targets)
    uniform = -log_p.mean(dim=-1, keepdim=True)
    log_ratio = log_p[0] - log_p[1]  # D, (n, V)
    difference = p[0] - p[1]
    kl = (difference * log_ratio).sum(dim=-1, keepdim=True)  # KL(P1||P2) + KL(P2||P1), (n, 1)
    rows = ((1.0 - smoothing) * nll + smoothing * uniform).mean(dim=0) + alpha / 4 * kl
    if not grads:
        return rows, None
    grad = p.sub(smoothing / vocab)
    grad.scatter_add_(2, targets, torch.full_like(nll, smoothing - 1.0))
    grad.mul_(0.5)
    centred = [
        log_ratio - (p[i] * log_ratio).sum(dim=-1, keepdim=True) for i in range(2)
    ]  # D - E_Pi[D]
    grad[0].add_(p[0] * centred[0] + difference, alpha=alpha / 4)
    grad[1].sub_(p[1] * centred[1] + difference, alpha=alpha / 4)
    return rows, grad


def _accumulators(
    hidden: Tensor, weight: Tensor, grads: bool
) -> tuple[torch.dtype, torch.dtype, Tensor, Tensor, Tensor | None, Tensor | None]:
    """What both chunk loops start from: the matmul dtype, the dtype of softmax and sums (fp32
    at least), the weight in the matmul dtype, and the zero loss and gradients they add to."""
    dtype = _compute_dtype(hidden.device, hidden.dtype)
    exact = torch.promote_types(dtype, torch.float32)
    loss = torch.zeros((), dtype=exact, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if grads else None
    grad_weight = torch.zeros_like(weight, dtype=exact) if grads else None
    return dtype, exact, weight.to(dtype), loss, grad_hidden, grad_weight


def _chunked_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    smoothing: float,
    chunk_rows: int,
    grads: bool,
    ignore_index: int | None = None,
    r_drop: float | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Summed loss and, when `grads`, d loss / d hidden and d loss / d weight; rows whose
    target is `ignore_index` count 0 towards both. With `r_drop` (alpha), hidden (2N, d) holds
    two passes of the N targets: R-Drop's loss, the same rows of both passes in one chunk.

    The plain loss's gradient with respect to the logits, c * (softmax - s / V - (1 - s) *
    onehot(target)) for a row weighted c, enters both matmuls without its constant term and
    with its row scale applied after (`_smoothed_chunk`); the constant's share is a sum of the
    weight's rows, s / V * sum_v w_v, for d hidden and of the hidden states', s / V * sum_i c_i
    h_i on every row, for d weight."""
    if r_drop is not None:
        return _chunked_r_drop_loss(
            hidden, weight, target, smoothing, chunk_rows, grads, ignore_index, r_drop
        )
    dtype, exact, w, loss, grad_hidden, grad_weight = _accumulators(hidden, weight, grads)
    constant = smoothing / weight.shape[0]
    if grads:
        h_sum = torch.zeros(weight.shape[1], dtype=exact, device=hidden.device)  # sum_i c_i h_i
        w_share = constant * weight.sum(dim=0, dtype=exact)  # (d,)
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, target.shape[0], chunk_rows):
            rows_of = slice(start, start + chunk_rows)
            h = hidden[rows_of].to(dtype)  # (n, d)
            t = target[rows_of, None]  # (n, 1)
            c = None if ignore_index is None else (t != ignore_index).to(exact)
            rows, g, scale = _smoothed_chunk(h, w, t, c, smoothing, grads)
            loss += rows.sum()
            if grads:
                g = g.to(dtype)
                grad_h = (g @ w).to(exact).mul_(scale)
                grad_hidden[rows_of] = grad_h.sub_(w_share if c is None else c * w_share)
                grad_weight += g.T @ (h * scale).to(dtype)
                h_sum += h.sum(dim=0, dtype=exact) if c is None else (h * c).sum(dim=0)
    if grads:
        grad_weight -= constant * h_sum
    return loss, grad_hidden, grad_weight


def _chunked_r_drop_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    smoothing: float,
    chunk_rows: int,
    grads: bool,
    ignore_index: int | None,
    r_drop: float,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`_chunked_loss` of R-Drop: hidden (2N, d) holds two passes of the N targets, the same
    rows of both passes in one chunk; the gradient with respect to the logits is formed."""
    dtype, exact, w, loss, grad_hidden, grad_weight = _accumulators(hidden, weight, grads)
    targets = target.shape[0]
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, targets, chunk_rows):
            end = min(start + chunk_rows, targets)
            rows_of = (slice(start, end), slice(targets + start, targets + end))
            h = torch.cat([hidden[r] for r in rows_of]).to(dtype)  # (2n, d)
            t = target[start:end, None]  # (n, 1)
            logits = (h @ w.T).to(exact).unflatten(0, (2, -1))  # (2, n, V)
            rows, grad = _r_drop_rows(logits, t, smoothing, r_drop, grads)
            scored = None if ignore_index is None else (t != ignore_index).to(exact)
            loss += (rows if scored is None else rows * scored).sum()
            if grads:
                if scored is not None:
                    grad.mul_(scored)
                grad = grad.flatten(0, 1).to(dtype)  # (2n, V)
                grad_h = grad @ w
                grad_hidden[rows_of[0]], grad_hidden[rows_of[1]] = grad_h.chunk(2)
                grad_weight += grad.T @ h
    return loss, grad_hidden, grad_weight


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        smoothing: float,
        rows: int,
        ignore_index: int | None,
        r_drop: float | None,
    ) -> Tensor:
        # the gradients are by-products of the forward chunks; backward only scales them
        loss, grad_hidden, grad_weight = _chunked_loss(
            hidden, weight, target, smoothing, rows, True, ignore_index, r_drop
        )
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_loss.to(grad_hidden.dtype)
        grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        return grad_hidden * scale, grad_weight, None, None, None, None, None


def label_smoothed_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    smoothing: float,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    ignore_index: int | None = None,
    r_drop: float | None = None,
) -> Tensor:
    """Summed label-smoothed cross-entropy of `target` (N,) under logits hidden @ weight.T.

    hidden (N, d) are the final decoder states of the N target positions to score; weight
    (V, d) is the output projection. Rows whose target is `ignore_index` (padding left in, so
    that shapes do not depend on the data) add exactly 0 to the loss and the gradients. With
    `r_drop` (R-Drop's alpha, >= 0), hidden is (2N, d): rows i and N + i are two forward passes
    of target i, and the loss is R-Drop's, halved (module docstring).
    """
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _FusedLinearCrossEntropy.apply(
            hidden, weight, target, smoothing, chunk_rows, ignore_index, r_drop
        )
    return _chunked_loss(
        hidden, weight, target, smoothing, chunk_rows, False, ignore_index, r_drop
    )[0]
