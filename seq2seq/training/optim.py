"""The optimizer and learning-rate schedule of training: AdamW; after a linear warmup (over
optim.warmup_steps updates, or a share of the training budget), inverse square-root decay or a
linear decay to zero at the end of the training budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from seq2seq.training.config import OptimConfig


def decayed_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The weight matrices of linear layers: what weight decay is meant for.

    Biases, layer norms, embeddings and other free vectors (the additive-attention `energy`)
    are left out, as AdamW users expect. Selected by module type, not name; a linear weight
    that is also an embedding's (the tied output projection) is an embedding and stays out.
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    return [p for p in model.parameters() if id(p) in linears - embeddings]


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: decay for `decayed_parameters` only. Without decay, one group
    of all parameters, as before groups existed (so older checkpoints still resume)."""
    if weight_decay == 0:
        return [{"params": list(model.parameters()), "weight_decay": 0.0}]
    decayed = {id(p) for p in decayed_parameters(model)}
    parameters = list(model.parameters())
    return [
        {"params": [p for p in parameters if id(p) in decayed], "weight_decay": weight_decay},
        {"params": [p for p in parameters if id(p) not in decayed], "weight_decay": 0.0},
    ]


def adamw(
    model: nn.Module, config: OptimConfig, scaled_gradients: bool = False
) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel when `optim.fused`, except under float16's gradient
    scaler (`scaled_gradients`): there Lightning unscales the gradients before clipping and
    refuses optimizers that unscale them in their step (fused ones), so the multi-tensor
    (foreach) kernel is used instead."""
    fused = config.fused and not scaled_gradients
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        fused=fused or None,
        foreach=None if fused else True,
    )


def clip_gradients(parameters: list[nn.Parameter], max_norm: float | None) -> Tensor:
    """Scale the gradients to a global L2 norm of at most `max_norm` (None or 0: leave them).
    Returns the norm before clipping, a 0-dim tensor on the gradients' device: NaN or inf when
    a gradient element is (or the sum of squares overflows), so it also decides whether the
    update is skipped, without a read on the host."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = nn.utils.get_total_norm(grads, foreach=True)
    if max_norm:
        nn.utils.clip_grads_with_norm_(parameters, max_norm, norm, foreach=True)
    return norm


def skip_update_if(optimizer: torch.optim.Optimizer, skip: Tensor) -> bool:
    """Have a fused AdamW skip its next update where `skip` (0-dim bool, on the device) holds:
    the kernel then changes no parameter or moment, and the step counts stay (torch's
    `found_inf`, as its GradScaler passes it). Returns False for an optimizer that is not
    fused: the caller decides on the host."""
    if not optimizer.defaults.get("fused"):
        return False
    optimizer.found_inf = skip.float()
    return True


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """The learning-rate factor of update `index` (0-based, as LambdaLR counts) for
    Vaswani et al. (2017): linear warmup to the peak at step `warmup`, then 1/sqrt(step) decay.
    With `warmup` 0 the decay starts at step 1 (factor step^-0.5), so the rate still falls."""

    def factor(index: int) -> float:
        step = index + 1
        if warmup == 0:
            return step**-0.5
        return min(step / warmup, (warmup / step) ** 0.5)

    return factor


def linear_decay(warmup: int, spent: Callable[[int], float]) -> Callable[[int], float]:
    """The learning-rate factor of update `index` (0-based) for a linear warmup over `warmup`
    updates times a linear decay to 0 as `spent(step)`, the fraction of the training budget
    spent before update `step`, goes from 0 to 1 (budgeted training, Li et al. 2020). It holds
    no state: a resumed run continues from the budget it has spent."""

    def factor(index: int) -> float:
        step = index + 1
        rise = min(step / warmup, 1.0) if warmup else 1.0
        return rise * max(0.0, 1.0 - spent(step))

    return factor


@dataclass
class WarmupEnd:
    """The update at which a warm-up of optim.warmup_ratio of the budget ended (None: not yet).
    Found as training runs, since how many updates a clock holds depends on the machine; kept
    in checkpoints, so a resumed run goes on with the same schedule."""

    step: int | None = None


def budget_warmup(
    ratio: float, decay: str, spent: Callable[[int], float], end: WarmupEnd
) -> Callable[[int], float]:
    """The learning-rate factor of update `index` (0-based) for a linear warmup over the first
    `ratio` of the training budget (`spent(step)`: the fraction spent before update `step`),
    then the decay `decay` names: inverse square root from the update the warmup ended at
    (as `inverse_sqrt` with that warmup), or linear to 0 at the budget's end."""

    def factor(index: int) -> float:
        step = index + 1
        share = spent(step)
        if end.step is None and share < ratio:
            rise = share / ratio
            return rise * (1.0 - share) if decay == "linear" else rise
        if end.step is None:
            end.step = step
        if decay == "linear":
            return max(0.0, 1.0 - share)
        return (end.step / step) ** 0.5

    return factor


def learning_rate_factor(
    config: OptimConfig, spent: Callable[[int], float], end: WarmupEnd
) -> Callable[[int], float]:
    """The factor `optim.decay` names, after the warmup optim.warmup_ratio (a share of the
    budget) or else optim.warmup_steps gives; `spent` is read by the linear decay and the
    budget's warmup, `end` by the latter only."""
    if config.warmup_ratio > 0:
        return budget_warmup(config.warmup_ratio, config.decay, spent, end)
    if config.decay == "linear":
        return linear_decay(config.warmup_steps, spent)
    return inverse_sqrt(config.warmup_steps)
