"""Schema of the `optim` config group (conf/optim/): the optimizer, its learning-rate schedule
and the regularisers of the loss and weights (seq2seq.training.optim, seq2seq.training.module).
"""

from __future__ import annotations

from dataclasses import dataclass

from seq2seq.errors import require


@dataclass
class OptimConfig:
    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    fused: bool
    warmup_steps: int
    decay: str  # after warmup: inverse_sqrt | linear (to 0 at the end of the training budget)
    label_smoothing: float
    r_drop: float  # R-Drop's alpha: two passes per batch, their symmetric KL (0: off)
    ema_decay: float  # exponential moving average of the weights, per update (0: off)

    def check(self) -> None:
        require(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        require(
            self.decay in ("inverse_sqrt", "linear"),
            "optim.decay",
            f"'{self.decay}': use inverse_sqrt or linear",
        )
        require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        require(
            0.0 <= self.label_smoothing < 1.0,
            "optim.label_smoothing",
            f"must be in [0, 1), got {self.label_smoothing}",
        )
        require(self.r_drop >= 0, "optim.r_drop", f"must be >= 0 (0: off), got {self.r_drop}")
        require(
            0.0 <= self.ema_decay < 1.0,
            "optim.ema_decay",
            f"must be in [0, 1) (0: off; e.g. 0.999), got {self.ema_decay}",
        )
