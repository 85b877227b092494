"""The exponential moving average of the weights (`optim.ema_decay`, Lightning's
EMAWeightAveraging): what the checkpoints hold, and resuming from them."""

from __future__ import annotations

import pytest
import torch
from helpers import compose_config, small_model, tiny_checkpoint

from seq2seq.decoding.checkpoint import load_trained, read_checkpoint
from seq2seq.errors import CheckpointError
from seq2seq.training.module import TranslationModule
from seq2seq.training.run import train

DECAY = 0.75
OVERRIDES = ("model.dropout=0.1", "optim.lr=3e-3", "optim.warmup_steps=2")


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory: pytest.TempPathFactory):
    """A 6-update run with ema_decay=DECAY, and the weights after each of its updates."""
    work = tmp_path_factory.mktemp("moving_average")
    weights: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, outputs, batch, batch_idx):
        weights.append({k: v.detach().clone() for k, v in self.model.state_dict().items()})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TranslationModule, "on_train_batch_end", on_train_batch_end)
        tiny_checkpoint(work, 6, *OVERRIDES, f"optim.ema_decay={DECAY}")
    return work, weights


@pytest.mark.slow
def test_checkpoints_hold_the_moving_average_of_the_weights_after_each_update(
    averaged_run,
) -> None:
    work, weights = averaged_run
    assert len(weights) == 6
    average = dict(weights[0])  # then decay * average + (1 - decay) * each update's weights
    for after in weights[1:]:
        average = {k: DECAY * average[k] + (1 - DECAY) * after[k] for k in average}
    checkpoint = read_checkpoint(work / "run" / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 6
    moved = 0
    for name, value in average.items():
        torch.testing.assert_close(checkpoint["state_dict"][f"model.{name}"], value)
        trained = checkpoint["current_model_state"][f"model.{name}"]
        torch.testing.assert_close(trained, weights[-1][name])
        moved += not torch.equal(trained, value)
    assert moved > len(average) / 2  # the average is not the last weights
    trained_model = load_trained(work / "run" / "checkpoints" / "last.ckpt").model  # decoding's
    for name, value in trained_model.state_dict().items():
        torch.testing.assert_close(value, average[name])


@pytest.mark.slow
def test_resuming_a_moving_average_without_one_is_refused(averaged_run) -> None:
    """Its state dict is the average: training on from it would lose the trained weights."""
    work, _ = averaged_run
    last = work / "run" / "checkpoints" / "last.ckpt"
    config = compose_config([*small_model(work, work / "cache"), *OVERRIDES, f"ckpt_path={last}"])
    with pytest.raises(CheckpointError, match=rf"resume with optim.ema_decay={DECAY}") as info:
        train(config, work / "refused")
    assert f"cannot resume from {last}:" in str(info.value)  # names the file
