"""Reliability of training: kill and resume, signals, atomic checkpoints, seeds, NaN steps."""

from __future__ import annotations

import csv
import itertools
import math
import re
import shlex
import shutil
import signal
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import compose_config, python, toy_overrides

from seq2seq.analysis.learning_curves import metrics_files, read_metrics
from seq2seq.decoding.checkpoint import read_checkpoint
from seq2seq.decoding.translator import Translator
from seq2seq.errors import TrainingError
from seq2seq.training.checkpoint import AtomicCheckpointIO
from seq2seq.training.module import TranslationModule, seed_generators
from seq2seq.training.run import out_of_memory_advice, train

# Runs the train entry point and sends a signal to itself at the end of one training step.
SIGNAL_AT_STEP = """
import os, signal, sys
from seq2seq.training.module import TranslationModule
signum, step = getattr(signal, sys.argv.pop(1)), int(sys.argv.pop(1))

def on_train_batch_end(self, outputs, batch, batch_idx):
    if self.global_step == step:
        os.kill(os.getpid(), signum)

TranslationModule.on_train_batch_end = on_train_batch_end
from seq2seq.train import main
main()
"""

# Runs the train entry point keeping every epoch's BPE-dropout draw (it keeps the latest only)
KEEP_EVERY_DRAW = """
from seq2seq.data.subword_sampling import BPEDropoutSplit
BPEDropoutSplit._remove_before = lambda self, epoch: None
from seq2seq.train import main
main()
"""


def tiny_overrides(toy_files: Path, cache: Path) -> list[str]:
    """A tiny model with dropout on the toy corpus: about 15 steps per epoch."""
    return [
        *toy_overrides(toy_files, cache),
        "model=transformer_tiny",
        "model.dropout=0.3",
        "data.max_tokens=160",
        "optim.lr=3e-3",
        "optim.warmup_steps=10",
        "trainer.log_every_n_steps=1",
        "trainer.num_sanity_val_steps=0",
        "decoding=greedy",
        "average_last=0",
        "evaluate_after=false",
    ]


def train_cli(
    cwd: Path, *args: str, signal_at: tuple[str, int] | None = None, keep_draws: bool = False
):
    command = ["-m", "seq2seq.train"]
    if signal_at is not None:
        script = cwd / "signal_at_step.py"
        script.write_text(SIGNAL_AT_STEP)
        command = [str(script), signal_at[0], str(signal_at[1])]
    elif keep_draws:
        script = cwd / "keep_every_draw.py"
        script.write_text(KEEP_EVERY_DRAW)
        command = [str(script)]
    return python(*command, *args, cwd=cwd)


def losses(run_dir: Path) -> dict[int, tuple[float, float]]:
    """(train loss, learning rate) by step, over the run's metrics files."""
    rows = read_metrics(metrics_files(run_dir))
    loss = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    lr = {int(r["step"]): float(r["lr-AdamW"]) for r in rows if r.get("lr-AdamW")}
    return {step: (loss[step], lr[step]) for step in loss}


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["data.bpe_dropout=0.1"],
        ["optim.ema_decay=0.9"],
        ["data.bidirectional_epochs=1"],
        ["optim.warmup_ratio=0.05", "trainer.max_steps=200"],  # warm-up ends at 11, before 20
    ],
    ids=["cached", "bpe_dropout", "moving_average", "bidirectional", "budget_warmup"],
)
def test_sigkill_mid_epoch_then_resume_matches_the_uninterrupted_run(
    extra: list[str], toy_files: Path, tmp_path: Path
) -> None:
    base = [*tiny_overrides(toy_files, tmp_path / "cache"), "trainer.max_epochs=3", *extra]
    full = train_cli(tmp_path, *base, "hydra.run.dir=full", keep_draws=True)
    assert full.returncode == 0, full.stderr[-3000:]
    if (tmp_path / "full" / "bpe_dropout").is_dir():  # the same draws for the killed run
        shutil.copytree(tmp_path / "full" / "bpe_dropout", tmp_path / "killed" / "bpe_dropout")
    rows = read_metrics(metrics_files(tmp_path / "full"))
    steps_per_epoch = Counter(int(r["epoch"]) for r in rows if r.get("train/loss"))
    epoch_ends = set(itertools.accumulate(steps_per_epoch[e] for e in sorted(steps_per_epoch)))

    every = ["checkpoint_every_n_steps=4", "hydra.run.dir=killed"]
    killed = train_cli(tmp_path, *base, *every, signal_at=("SIGKILL", 22))
    assert killed.returncode == -signal.SIGKILL
    last = read_checkpoint(tmp_path / "killed/checkpoints/last.ckpt")
    assert last["global_step"] == 20 and 20 not in epoch_ends  # mid-epoch
    assert not list((tmp_path / "killed/checkpoints").glob("*.part"))

    resumed = train_cli(tmp_path, *base, *every, "ckpt_path=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "ckpt_path=auto: resuming from" in resumed.stdout + resumed.stderr
    expected, got = losses(tmp_path / "full"), losses(tmp_path / "killed")
    assert sorted(got) == sorted(expected)  # every step once: none lost, none repeated
    assert len(got) == sum(steps_per_epoch.values()) and len(steps_per_epoch) == 3
    for step in sorted(expected):  # up to the kill from metrics.1.csv, then the resumed run's
        assert got[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step
    final = read_checkpoint(tmp_path / "killed/checkpoints/last.ckpt")
    reference = read_checkpoint(tmp_path / "full/checkpoints/last.ckpt")
    assert final["global_step"] == reference["global_step"] and final["epoch"] == 2
    for key, value in reference["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, rtol=1e-5, atol=1e-6)
    # with a moving average, state_dict holds it, and the trained weights are kept beside it
    assert ("current_model_state" in reference) == ("optim.ema_decay=0.9" in extra)
    for key, value in reference.get("current_model_state", {}).items():
        torch.testing.assert_close(final["current_model_state"][key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_after_the_step_with_a_checkpoint_and_the_resume_command(
    signal_name: str, toy_files: Path, tmp_path: Path
) -> None:
    base = [*tiny_overrides(toy_files, tmp_path / "cache"), "trainer.max_epochs=2"]
    stopped = train_cli(tmp_path, *base, "hydra.run.dir=run", signal_at=(signal_name, 5))
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    message = re.search(rf"stopped by {signal_name} at step (\d+) \(epoch 0\)", stopped.stderr)
    assert message, stopped.stderr[-3000:]
    step = int(message.group(1))
    assert step in (5, 6)  # the step during which the signal arrived is finished first
    assert read_checkpoint(tmp_path / "run/checkpoints/last.ckpt")["global_step"] == step
    assert "Traceback" not in stopped.stderr
    command = stopped.stderr.split("Resume with:\n")[1].splitlines()[0].strip()
    assert command.endswith("ckpt_path=auto") and "hydra.run.dir=" in command

    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "seq2seq.train"]
    resumed = python(*words[1:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "run/run_summary.json").is_file()
    steps = sorted(losses(tmp_path / "run"))
    assert steps == list(range(steps[0], steps[0] + len(steps)))  # continuous, no step twice


KILL_DURING_SAVE = """
import os, signal, sys, torch
from seq2seq.training.checkpoint import AtomicCheckpointIO
path = sys.argv[1]
AtomicCheckpointIO().save_checkpoint({"step": 1, "weights": torch.ones(1000)}, path)

def dying_save(obj, f, *args, **kwargs):
    f.write(b"PK\\x03\\x04 half a checkpoint")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

torch.save = dying_save
AtomicCheckpointIO().save_checkpoint({"step": 2, "weights": torch.zeros(1000)}, path)
"""


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_DURING_SAVE)
    path = tmp_path / "checkpoints" / "last.ckpt"
    result = python(script, path)
    assert result.returncode == -signal.SIGKILL
    saved = torch.load(path, weights_only=True)
    assert saved["step"] == 1 and bool((saved["weights"] == 1).all())
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert len(leftovers) == 1 and leftovers[0].startswith(".last.ckpt.")
    assert leftovers[0].endswith(".part")  # never taken for a checkpoint (not *.ckpt)


def test_checkpoint_io_refuses_storage_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="storage_options"):
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})


@pytest.mark.slow
def test_same_seed_same_losses_and_translations_other_seed_differs(
    toy_files: Path, tmp_path: Path
) -> None:
    base = [*tiny_overrides(toy_files, tmp_path / "cache"), "trainer.max_epochs=2"]
    sources = ["the dog runs over the ball", "a small child", "red blue big"]

    def run(seed: int, name: str) -> tuple[list[float], list[str]]:
        summary = train(compose_config([*base, f"seed={seed}"]), tmp_path / name)
        with open(tmp_path / name / "metrics.csv", newline="") as f:
            loss = [float(r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"]]
        translator = Translator.from_checkpoint(summary["final_checkpoint"])
        return loss, translator.translate(sources)

    first, again, other = run(7, "first"), run(7, "again"), run(8, "other")
    assert len(first[0]) > 20
    assert first == again
    assert other[0] != first[0]


def test_seeding_a_step_draws_torch_manual_seeds_stream_without_recording_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step's seeding gives the CPU generator torch.manual_seed's state (so runs and
    resumes draw the masks they drew before), and it formats no stack: torch.manual_seed
    queues the seeding of each backend not started (CUDA here) with the caller's stack."""
    torch.manual_seed(20261201)
    reference = torch.rand(1000), torch.randint(-(2**63), 2**63 - 1, (100,))

    def no_stacks() -> list[str]:
        raise AssertionError("a stack was formatted")

    monkeypatch.setattr(traceback, "format_stack", no_stacks)
    seed_generators(20261201, torch.device("cpu"))
    drawn = torch.rand(1000), torch.randint(-(2**63), 2**63 - 1, (100,))
    assert all(torch.equal(a, b) for a, b in zip(reference, drawn, strict=True))
    if not torch.cuda.is_initialized():  # what the seeding leaves out costs a stack
        with pytest.raises(AssertionError, match="stack was formatted"):
            torch.manual_seed(20261201)


@pytest.mark.slow
def test_validating_less_often_trains_the_same_weights(toy_files: Path, tmp_path: Path) -> None:
    """Validation draws nothing from the training's random streams and leaves the weights and
    the moving average as it found them, so trainer.check_val_every_n_epoch only moves time
    between validation and updates: runs 72 and 73 of docs/results.md rest on this."""
    base = [
        *tiny_overrides(toy_files, tmp_path / "cache"),
        "trainer.max_epochs=4",
        "optim.ema_decay=0.9",
        "average_last=4",  # keeps every epoch's checkpoint
    ]
    for every in (1, 2):
        train(
            compose_config([*base, f"trainer.check_val_every_n_epoch={every}"]),
            tmp_path / f"{every}",
        )
    validated = [
        sum(1 for row in read_metrics(metrics_files(tmp_path / f"{every}")) if row.get("val/bleu"))
        for every in (1, 2)
    ]
    assert validated == [4, 2]
    for epoch in range(4):
        each, second = (
            read_checkpoint(tmp_path / f"{every}" / "checkpoints" / f"epoch{epoch:03d}.ckpt")
            for every in (1, 2)
        )
        assert each["global_step"] == second["global_step"]
        for state in ("state_dict", "current_model_state"):
            assert each[state].keys() == second[state].keys()
            for key, value in each[state].items():
                assert torch.equal(second[state][key], value), (epoch, state, key)


def nan_at_step(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Make the training loss NaN at one optimizer step."""
    loss = TranslationModule.loss

    def poisoned(self, batch):
        value, tokens = loss(self, batch)
        if self.training and self.global_step == step:
            value = value * math.nan
        return value, tokens

    monkeypatch.setattr(TranslationModule, "loss", poisoned)


@pytest.mark.slow
def test_linear_decay_spends_the_step_budget(toy_files: Path, tmp_path: Path) -> None:
    """optim=adam_linear_decay with trainer.max_steps=20: each update's logged learning rate
    is lr * min(step / warmup, 1) * (1 - (step - 1) / 20), the last one 1/20 of its peak."""
    overrides = [*tiny_overrides(toy_files, tmp_path / "cache"), "optim=adam_linear_decay"]
    config = compose_config([*overrides, "trainer.max_steps=20"])
    train(config, tmp_path / "run")
    rates = {step: lr for step, (_, lr) in losses(tmp_path / "run").items()}
    assert sorted(rates) == list(range(20))  # logged at global steps 0..19, before each update
    expected = {i: 3e-3 * min((i + 1) / 10, 1) * (1 - i / 20) for i in range(20)}
    assert rates == pytest.approx(expected, rel=1e-6)


def snapshots_after_steps(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[torch.Tensor]]:
    """Parameters and every AdamW state tensor at the end of each training step, by the
    number of updates taken (skipped ones count, as Lightning counts them)."""
    taken: dict[int, list[torch.Tensor]] = {}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        optimizer = self.optimizers().optimizer
        state = [t for p in self.parameters() for t in optimizer.state[p].values()]
        taken[self.global_step] = [t.detach().clone() for t in [*self.parameters(), *state]]

    monkeypatch.setattr(TranslationModule, "on_train_batch_end", on_train_batch_end)
    return taken


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False])  # skipped on the device; on the host
def test_a_nan_step_is_skipped_and_no_nan_reaches_a_checkpoint(
    fused: bool, toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    nan_at_step(monkeypatch, 3)
    taken = snapshots_after_steps(monkeypatch)
    config = compose_config(
        [
            *tiny_overrides(toy_files, tmp_path / "cache"),
            "trainer.max_epochs=1",
            f"optim.fused={fused}",
        ]
    )
    summary = train(config, tmp_path / "run")
    assert summary["skipped_steps"] == 1
    assert "step 4: NaN/inf loss or gradients, update skipped" in caplog.text
    for before, after in zip(taken[3], taken[4], strict=True):  # update 4: nothing changed
        assert torch.equal(before, after)
    changed = [not torch.equal(a, b) for a, b in zip(taken[4], taken[5], strict=True)]
    assert all(changed)  # update 5 moved every parameter and moment, and the step counts
    for name in ("last.ckpt", "best.ckpt"):
        state = read_checkpoint(tmp_path / "run" / "checkpoints" / name)["state_dict"]
        assert all(bool(torch.isfinite(v).all()) for v in state.values()), name


@pytest.mark.slow
def test_a_nan_step_stops_the_run_when_asked(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nan_at_step(monkeypatch, 3)
    overrides = [*tiny_overrides(toy_files, tmp_path / "cache"), "on_nonfinite=stop"]
    with pytest.raises(TrainingError, match=r"step 4: the loss or gradients are NaN or inf"):
        train(compose_config(overrides), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints" / "best.ckpt").exists()


# torch's message as a run beside nine others on an 80 GiB H100 got it (docs/performance.md)
TORCH_OUT_OF_MEMORY = (
    "CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacity of 79.18 GiB "
    "of which 19.19 MiB is free. Process 18421 has 66.00 MiB memory in use. Including "
    "non-PyTorch memory, this process has 11.55 GiB memory in use."
)


def fail_at_step(monkeypatch: pytest.MonkeyPatch, step: int, error: Exception) -> None:
    """Make the training loss raise `error` at one optimizer step."""
    loss = TranslationModule.loss

    def failing(self, batch):
        if self.training and self.global_step == step:
            raise error
        return loss(self, batch)

    monkeypatch.setattr(TranslationModule, "loss", failing)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (
            torch.cuda.OutOfMemoryError(TORCH_OUT_OF_MEMORY),
            "CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacity of "
            "79.18 GiB of which 19.19 MiB is free",
        ),
        (
            RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported late"),
            "CUDA error: out of memory",
        ),
    ],
    ids=["allocator", "cuda_call"],
)
def test_running_out_of_gpu_memory_names_what_to_lower_and_keeps_the_checkpoints(
    error: Exception, cause: str, toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_at_step(monkeypatch, 20, error)
    overrides = [*tiny_overrides(toy_files, tmp_path / "cache"), "checkpoint_every_n_steps=4"]
    with pytest.raises(TrainingError) as caught:
        train(compose_config(overrides), tmp_path / "run")
    assert caught.value.__cause__ is error
    assert str(caught.value) == (
        f"training ran out of GPU memory ({cause}). Lower data.max_tokens (now 160), or run "
        'fewer runs side by side on this GPU (hydra.launcher.n_jobs; docs/sweeps.md, "One '
        'GPU"). The run resumes from its last checkpoint, if it wrote one, with: python -m '
        f"seq2seq.train hydra.run.dir={tmp_path / 'run'} ckpt_path=auto"
    )
    assert read_checkpoint(tmp_path / "run/checkpoints/last.ckpt")["global_step"] == 20


def test_the_out_of_memory_advice_names_the_graphs_where_a_run_captures_them(
    tmp_path: Path,
) -> None:
    config = compose_config(["cuda_graphs=200", "data.pad_to_multiple=4"])
    advice = out_of_memory_advice(
        config, tmp_path, torch.cuda.OutOfMemoryError("CUDA out of memory.")
    )
    assert advice.startswith(
        "training ran out of GPU memory (CUDA out of memory). Lower data.max_tokens (now "
        f"{config.data.max_tokens}) or cuda_graphs (now 200; each captured batch shape keeps its "
        "own memory pool, and a higher data.pad_to_multiple, now 4, gives fewer shapes), or run "
        "fewer runs side by side"
    )


@pytest.mark.slow
def test_another_runtime_error_in_training_is_not_taken_for_one_of_memory(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_at_step(monkeypatch, 3, RuntimeError("CUDA error: an illegal memory access"))
    with pytest.raises(RuntimeError, match="^CUDA error: an illegal memory access$"):
        train(compose_config(tiny_overrides(toy_files, tmp_path / "cache")), tmp_path / "run")


def test_a_module_with_nan_weights_refuses_to_be_checkpointed(
    toy_files: Path, tmp_path: Path
) -> None:
    from seq2seq.data.datamodule import TranslationDataModule

    config = compose_config(tiny_overrides(toy_files, tmp_path / "cache"))
    data = TranslationDataModule(config)
    data.setup()
    module = TranslationModule(config, data.tokenizer)
    with torch.no_grad():
        module.model.output_projection.weight[0, 0] = math.inf
    with pytest.raises(TrainingError, match="holds NaN or inf; no checkpoint written") as error:
        module.on_save_checkpoint({})
    (poisoned,) = [name for name, p in module.named_parameters() if not p.isfinite().all()]
    assert f"parameter {poisoned} holds" in str(error.value)
