"""The optimizer of seq2seq.train: torch's fused AdamW, and the foreach kernel it falls back to;
weight decay on linear weight matrices only; the inverse square-root and linear-decay schedules."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from helpers import config_of, wired_model
from pytorch_lightning.callbacks import Timer

from seq2seq.model.config import Positions
from seq2seq.model.transformer import Transformer
from seq2seq.training.config import OptimConfig
from seq2seq.training.module import TranslationModule
from seq2seq.training.optim import (
    WarmupEnd,
    adamw,
    budget_warmup,
    clip_gradients,
    decayed_parameters,
    inverse_sqrt,
    learning_rate_factor,
    linear_decay,
    skip_update_if,
)

VOCAB = 40
LINEAR_WEIGHTS = ("query_projection.weight", "key_value_projection.weight")
LINEAR_WEIGHTS += ("attention.output_projection.weight", "expand.weight", "contract.weight")


def three_steps(fused: bool, scaled: bool = False) -> tuple[list[torch.Tensor], torch.optim.AdamW]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = adamw(
        model,
        config_of("optim/adam_inverse_sqrt", OptimConfig, lr=1e-2, fused=fused),
        scaled_gradients=scaled,
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


def test_float16s_scaled_gradients_use_the_foreach_kernel() -> None:
    # Lightning unscales before clipping and refuses optimizers that unscale (fused) there
    _, optimizer = three_steps(fused=True, scaled=True)
    assert not optimizer.defaults["fused"] and optimizer.defaults["foreach"]


def gradients(model: torch.nn.Module, poison: float | None = None) -> list[torch.nn.Parameter]:
    """Fixed random gradients on `model`, one element set to `poison` (NaN, inf) if given."""
    generator = torch.Generator().manual_seed(3)
    parameters = list(model.parameters())
    for p in parameters:
        p.grad = torch.randn(p.shape, generator=generator)
    if poison is not None:
        parameters[1].grad[0] = poison
    return parameters


@pytest.mark.parametrize("max_norm", [0.5, None])
def test_clipping_matches_torchs_and_returns_the_norm_before(max_norm: float | None) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    reference = gradients(copy.deepcopy(model))
    expected = torch.nn.utils.clip_grad_norm_(reference, max_norm or math.inf)
    norm = clip_gradients(gradients(model), max_norm)
    torch.testing.assert_close(norm, expected)
    direct = math.sqrt(sum(float(p.grad.square().sum()) for p in gradients(copy.deepcopy(model))))
    assert float(norm) == pytest.approx(direct, rel=1e-5) and float(norm) > 0.5
    for got, want in zip(model.parameters(), reference, strict=True):
        torch.testing.assert_close(got.grad, want.grad)
    total = math.sqrt(sum(float(p.grad.square().sum()) for p in model.parameters()))
    assert total == pytest.approx(min(direct, max_norm or math.inf), rel=1e-5)


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
def test_a_nonfinite_gradient_gives_a_nonfinite_norm(poison: float) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    assert not clip_gradients(gradients(model, poison), 1.0).isfinite()
    assert clip_gradients(gradients(model), 1.0).isfinite()


@pytest.mark.parametrize("skip", [True, False])
def test_a_fused_adamw_skips_on_the_device_without_changing_anything(skip: bool) -> None:
    """The skipped update leaves parameters, both moments and the step count as they were;
    one that is not skipped changes them (so the comparison can fail)."""
    _, optimizer = three_steps(fused=True)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    before = copy.deepcopy([(p.detach(), optimizer.state[p]) for p in parameters])
    for p in parameters:
        p.grad = torch.ones_like(p)
    assert skip_update_if(optimizer, torch.tensor(skip))
    optimizer.step()
    for p, (value, state) in zip(parameters, before, strict=True):
        now = optimizer.state[p]
        same = [torch.equal(p, value)] + [torch.equal(now[k], state[k]) for k in state]
        assert all(same) if skip else not any(same)


def test_an_optimizer_that_is_not_fused_leaves_the_skip_to_the_host() -> None:
    _, optimizer = three_steps(fused=False)
    assert not skip_update_if(optimizer, torch.tensor(True))
    assert not hasattr(optimizer, "found_inf")


def tiny_transformer(tie_embeddings: bool = True) -> Transformer:
    """Every kind of parameter: linear weights and biases, layer norms, tied or untied
    embeddings, learned positions, additive-attention energy vectors."""
    return wired_model(
        encoder_score="additive",
        decoder_layers=1,
        positions=Positions.learned,
        tie_embeddings=tie_embeddings,
    )


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_only_linear_weight_matrices_are_decayed(tie_embeddings: bool) -> None:
    model = tiny_transformer(tie_embeddings)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decayed_parameters(model)}
    expected = {name for name in names.values() if name.endswith(LINEAR_WEIGHTS)}
    if not tie_embeddings:  # then the output projection is a linear layer of its own
        expected.add("output_projection.weight")
    assert decayed == expected
    # 3 attentions of 3 linear layers, 2 feed-forward blocks of 2
    assert len(decayed) == 3 * 3 + 2 * 2 + (0 if tie_embeddings else 1)
    assert any(name.endswith("energy") for name in names.values())  # present, not decayed


@pytest.mark.parametrize("fused", [True, False])
def test_a_step_with_zero_gradients_shrinks_exactly_the_decayed_parameters(fused: bool) -> None:
    model = tiny_transformer()
    lr, weight_decay = 0.1, 0.2
    config = config_of(
        "optim/adam_inverse_sqrt", OptimConfig, lr=lr, weight_decay=weight_decay, fused=fused
    )
    optimizer = adamw(model, config)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # Adam's update is 0: only the decay moves parameters
    optimizer.step()
    decayed = {id(p) for p in decayed_parameters(model)}
    assert decayed
    for name, p in model.named_parameters():
        if id(p) in decayed:
            torch.testing.assert_close(p.detach(), before[name] * (1 - lr * weight_decay))
            assert not torch.equal(p, before[name]), name
        else:
            assert torch.equal(p, before[name]), name


def test_without_weight_decay_one_group_holds_every_parameter() -> None:
    """As before parameter groups existed: optimizer states of earlier checkpoints still load."""
    model = tiny_transformer()
    optimizer = adamw(model, config_of("optim/adam_inverse_sqrt", OptimConfig, weight_decay=0.0))
    assert len(optimizer.param_groups) == 1
    assert optimizer.param_groups[0]["params"] == list(model.parameters())


def learning_rates(warmup: int, steps: int, lr: float = 2.0, factor=None) -> list[float]:
    """The learning rate of each of the first `steps` updates, as LambdaLR hands them out
    (inverse square-root decay unless another `factor` is given)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor or inverse_sqrt(warmup))
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def test_schedule_without_warmup_decays_from_the_first_step() -> None:
    expected = [2.0 / math.sqrt(step) for step in range(1, 7)]
    assert learning_rates(warmup=0, steps=6) == pytest.approx(expected, rel=1e-12)


def test_schedule_warms_up_linearly_then_decays_with_the_inverse_square_root() -> None:
    rates = learning_rates(warmup=4, steps=9)
    warmup = [0.5, 1.0, 1.5, 2.0]  # lr * step / 4: the peak lr at step 4
    decay = [2.0 * math.sqrt(4 / step) for step in range(5, 10)]
    assert rates == pytest.approx(warmup + decay, rel=1e-12)


def test_linear_decay_warms_up_and_reaches_zero_with_the_budget() -> None:
    """Ten updates of budget, four of warmup: lr * min(step / 4, 1) * (1 - (step - 1) / 10)."""
    factor = linear_decay(4, lambda step: (step - 1) / 10)
    rates = learning_rates(warmup=4, steps=12, factor=factor)
    expected = [2.0 * min(s / 4, 1) * max(0.0, 1 - (s - 1) / 10) for s in range(1, 13)]
    assert rates == pytest.approx(expected, rel=1e-12)
    assert rates[9] == pytest.approx(0.2) and rates[10:] == [0.0, 0.0]  # spent: nothing left


def test_linear_decay_without_warmup_falls_from_the_peak() -> None:
    rates = learning_rates(warmup=0, steps=3, factor=linear_decay(0, lambda step: step / 4))
    assert rates == pytest.approx([1.5, 1.0, 0.5], rel=1e-12)


def test_budget_warmup_rises_over_its_share_then_decays_from_where_it_ended() -> None:
    """A budget of 20 updates, a quarter of it warm-up: lr * step / 5 up to update 5, then
    lr * sqrt(5 / step), the warm-up's end kept where the factor found it."""
    end = WarmupEnd()
    factor = budget_warmup(0.25, "inverse_sqrt", lambda step: step / 20, end)
    rates = learning_rates(warmup=0, steps=12, factor=factor)
    expected = [2.0 * s / 5 for s in range(1, 5)] + [2.0 * math.sqrt(5 / s) for s in range(5, 13)]
    assert rates == pytest.approx(expected, rel=1e-12) and end.step == 5


def test_budget_warmup_follows_the_pace_of_the_clock() -> None:
    """Time as the budget: a slow start (0.1 of the clock per update) ends the warm-up at the
    third update, whatever the pace after; a resumed run (end given) keeps decaying from it."""
    shares = {1: 0.0, 2: 0.1, 3: 0.2, 4: 0.3, 5: 0.31, 6: 0.32}
    end = WarmupEnd()
    factor = budget_warmup(0.2, "inverse_sqrt", shares.get, end)
    assert [factor(i) for i in range(6)] == pytest.approx(
        [0, 0.5, 1, (3 / 4) ** 0.5, (3 / 5) ** 0.5, 0.5**0.5]
    )
    assert end.step == 3
    resumed = budget_warmup(0.2, "inverse_sqrt", lambda step: 0.0, WarmupEnd(3))
    assert resumed(5) == pytest.approx(0.5**0.5)  # the clock no longer decides


def test_budget_warmup_with_linear_decay_reaches_zero_with_the_budget() -> None:
    factor = budget_warmup(0.25, "linear", lambda step: (step - 1) / 8, WarmupEnd())
    rates = learning_rates(warmup=0, steps=10, factor=factor)
    spent = [(s - 1) / 8 for s in range(1, 11)]
    expected = [2.0 * min(x / 0.25, 1) * max(0.0, 1 - x) for x in spent]
    assert rates == pytest.approx(expected, rel=1e-12) and rates[-2:] == [0.0, 0.0]


def test_learning_rate_factor_takes_the_ratio_over_warmup_steps() -> None:
    config = config_of("optim/adam_inverse_sqrt", OptimConfig, warmup_steps=4, warmup_ratio=0.5)
    factor = learning_rate_factor(config, lambda step: step / 10, WarmupEnd())
    assert [factor(i) for i in range(2)] == pytest.approx([0.2, 0.4])  # not step / 4
    plain = learning_rate_factor(replace(config, warmup_ratio=0.0), lambda step: 0.0, WarmupEnd())
    assert plain(0) == pytest.approx(0.25)


def trainer_with_budget(max_steps: int, max_time: str | None, elapsed: float):
    """What `spent_budget` reads of a Trainer: max_steps, and the Timer Lightning adds for
    max_time, here restored from a checkpoint that had trained for `elapsed` seconds."""
    callbacks = []
    if max_time is not None:
        timer = Timer(duration=max_time)
        timer.load_state_dict({"time_elapsed": {"train": elapsed}})
        callbacks.append(timer)
    return SimpleNamespace(trainer=SimpleNamespace(max_steps=max_steps, callbacks=callbacks))


@pytest.mark.parametrize(
    ("max_steps", "max_time", "elapsed", "spent"),
    [
        (50, None, 0.0, 0.6),  # 30 of 50 updates done before update 31
        (-1, "00:00:01:40", 25.0, 0.25),  # 25 s of 100: the time budget, as resumed
        (50, "00:00:01:40", 90.0, 0.9),  # both: the one nearer its end
        (50, "00:00:01:40", 25.0, 0.6),
    ],
)
def test_the_spent_budget_is_of_max_steps_or_max_time_whichever_is_nearer_its_end(
    max_steps: int, max_time: str | None, elapsed: float, spent: float
) -> None:
    trainer = trainer_with_budget(max_steps, max_time, elapsed)
    assert TranslationModule.spent_budget(trainer, 31) == pytest.approx(spent, abs=1e-3)
