"""Schema of the `optim` config group (conf/optim/): the optimizer, its learning-rate schedule
and the regularisers of the loss and weights (seq2seq.training.optim, seq2seq.training.module);
and the checks of the `trainer` group's processes that training features depend on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2seq.errors import require


@dataclass
class OptimConfig:
    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    fused: bool
    warmup_steps: int
    warmup_ratio: float  # the warmup as a share of the training budget (0: warmup_steps instead)
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
            0.0 <= self.warmup_ratio < 1.0,
            "optim.warmup_ratio",
            f"must be in [0, 1) (a share of the training budget; 0: optim.warmup_steps), got "
            f"{self.warmup_ratio}",
        )
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


def several_processes(trainer: dict) -> bool:
    """Whether the trainer group may start more than one process (data parallelism), reading
    `devices` as Lightning does: a count, a list or a string of indices ("0,1"; "1," is device
    1 alone), or -1 for every device. `auto` counts as one device, as it is on a CPU."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, str) and "," in devices:
        devices = [index for index in devices.split(",") if index.strip()]
    if isinstance(devices, (list, tuple)):
        several_devices = len(devices) > 1
    else:
        text = str(devices).strip()
        several_devices = text == "-1" or (text.isdigit() and int(text) > 1)
    strategy = str(trainer.get("strategy", "auto"))
    parallel = any(name in strategy for name in ("ddp", "fsdp", "deepspeed"))
    return parallel or several_devices or int(trainer.get("num_nodes", 1)) > 1


def check_cuda_graphs(cuda_graphs: int, trainer: dict[str, Any], compile: bool) -> None:
    """What a graph of the forward and backward cannot follow (seq2seq/training/
    cuda_graphs.py): gradients summed over several batches (a graph's gradients live in
    its own memory until the next replay), several processes' gradient hooks, and
    torch.compile's own graphs."""
    accumulate = trainer.get("accumulate_grad_batches", 1)
    require(
        accumulate == 1,
        "cuda_graphs",
        f"{cuda_graphs} with trainer.accumulate_grad_batches={accumulate}: graphs "
        "need one batch per update; raise data.max_tokens instead, or set cuda_graphs=0",
    )
    require(
        not several_processes(trainer),
        "cuda_graphs",
        f"{cuda_graphs} with trainer.devices={trainer.get('devices', 1)}, "
        f"trainer.num_nodes={trainer.get('num_nodes', 1)}, trainer.strategy="
        f"{trainer.get('strategy', 'auto')}: graphs train one process on one GPU; set "
        "trainer.devices=1 or cuda_graphs=0",
    )
    require(
        not compile,
        "cuda_graphs",
        f"{cuda_graphs} with compile=true, which makes graphs of its own: set "
        "compile=false or cuda_graphs=0",
    )
