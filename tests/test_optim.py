"""The optimizer of seq2seq.train: torch's fused AdamW, and the foreach kernel it falls back to."""

from __future__ import annotations

import torch
from helpers import config_of

from seq2seq.config import OptimConfig
from seq2seq.module import adamw


def three_steps(fused: bool, mixed: bool = False) -> tuple[list[torch.Tensor], torch.optim.AdamW]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = adamw(
        model.parameters(),
        config_of("optim/adam_inverse_sqrt", OptimConfig, lr=1e-2, fused=fused),
        mixed,
    )
    for step in range(3):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step))
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()], optimizer


def test_fused_adamw_takes_the_same_steps_as_the_foreach_kernel() -> None:
    fused, fused_optimizer = three_steps(fused=True)
    foreach, foreach_optimizer = three_steps(fused=False)
    assert fused_optimizer.defaults["fused"] and not foreach_optimizer.defaults["fused"]
    assert foreach_optimizer.defaults["foreach"]
    for a, b in zip(fused, foreach, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_mixed_precision_uses_the_foreach_kernel() -> None:
    # Lightning's mixed-precision gradient clipping refuses optimizers that unscale (fused)
    _, optimizer = three_steps(fused=True, mixed=True)
    assert not optimizer.defaults["fused"] and optimizer.defaults["foreach"]
