"""On a CUDA GPU: `trainer=gpu` training (bf16-mixed), the loss under bf16 autocast, AdamW
under mixed precision, and the training step through CUDA graphs. Skipped where torch sees no
GPU."""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    FP32,
    config_of,
    configured_model,
    few_pairs_overrides,
    gradient_norms,
    multilingual_overrides,
    run,
    toy_corpus,
    write_aligned,
    write_lines,
)

from seq2seq.data.batching import Batch
from seq2seq.data.tokenizer import PAD_ID
from seq2seq.model.loss import label_smoothed_cross_entropy
from seq2seq.training.config import OptimConfig
from seq2seq.training.cuda_graphs import GraphedLoss
from seq2seq.training.module import seed_generators
from seq2seq.training.optim import adamw, clip_gradients, skip_update_if

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)


def gpu_training_overrides(tmp_path: Path) -> list[str]:
    """A few bf16-mixed steps of a tiny model on the toy corpus, on one GPU (without the toy
    runs' fp32 override, which would win over trainer=gpu's precision)."""
    src, tgt = toy_corpus()
    data = tmp_path / "data"
    data.mkdir()
    write_lines(data / "pairs.src", src)
    write_lines(data / "pairs.tgt", tgt)
    return [
        *(o for o in few_pairs_overrides(data, tmp_path / "cache", vocab_size=60) if o != FP32),
        "trainer=gpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=2",
        "average_last=0",
        "evaluate_after=false",
        "hydra.run.dir=run",
    ]


@pytest.mark.slow
def test_trainer_gpu_trains_in_bf16_mixed_through_the_entry_point(tmp_path: Path) -> None:
    # a fresh interpreter, as users start it: the tests' fork server has not been run on a GPU
    result = run("train", tmp_path, *gpu_training_overrides(tmp_path), fresh_interpreter=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "GPU available: True (cuda), used: True" in output
    assert "Using bfloat16 Automatic Mixed Precision (AMP)" in output  # Lightning, bf16-mixed
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_the_gradient_norm_under_float16_is_the_unscaled_gradients(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16-mixed leaves clipping to Lightning's gradient scaler, which has unscaled the gradients
    by then: the logged norm is theirs, not the scaled one (about 65,536 times larger). An
    early update may overflow in float16 (the scaler then skips it and lowers its scale): its
    norm is inf in both."""
    logged, recomputed = gradient_norms(toy_files, tmp_path, monkeypatch, "16-mixed")
    assert list(logged) == [2, 5]
    assert logged == pytest.approx({step: recomputed[step] for step in logged}, rel=1e-5)
    assert math.isfinite(logged[5])
    assert all(0.05 < norm < 1e3 for norm in logged.values() if math.isfinite(norm))


def test_loss_under_cuda_bf16_autocast_is_close_to_fp32() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(300, 64, device="cuda", requires_grad=True)
    weight = (torch.randn(500, 64, device="cuda") * 64**-0.5).requires_grad_(True)
    target = torch.randint(0, 500, (300,), device="cuda")

    def loss_and_grads(bf16: bool) -> tuple[torch.Tensor, ...]:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = label_smoothed_cross_entropy(hidden, weight, target, 0.1, 64)
        return loss.detach(), *torch.autograd.grad(loss, (hidden, weight))

    fp32, bf16 = loss_and_grads(bf16=False), loss_and_grads(bf16=True)
    expected = F.cross_entropy(hidden @ weight.T, target, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(fp32[0], expected.detach(), rtol=1e-5, atol=0)
    assert all(t.dtype == torch.float32 for t in bf16)  # loss and gradients in fp32
    assert not torch.equal(bf16[0], fp32[0])  # the matmuls did run in bf16
    torch.testing.assert_close(bf16[0], fp32[0], rtol=1e-2, atol=0)
    for got, want in zip(bf16[1:], fp32[1:], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=3e-2 * float(want.abs().max()))


def test_a_bf16_step_clips_and_skips_nonfinite_updates_without_a_host_sync() -> None:
    """AdamW is fused under bf16-mixed, and clipping, the NaN/inf decision and the update
    run with CUDA's sync debug mode set to error: nothing in them waits for the host."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = model.cuda()
    config = config_of("optim/adam_inverse_sqrt", OptimConfig, lr=1e-2, fused=True)
    optimizer = adamw(model, config)
    assert optimizer.defaults["fused"]
    parameters = list(model.parameters())
    for poison in (None, float("nan")):
        before = [p.detach().clone() for p in parameters]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(5, 8, device="cuda")).float().square().mean()
        loss.backward()
        if poison is not None:
            parameters[0].grad[0, 0] = poison
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            skip_update_if(optimizer, ~clip_gradients(parameters, 1.0).isfinite())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        changed = [not torch.equal(old, new) for old, new in zip(before, parameters, strict=True)]
        assert all(changed) if poison is None else not any(changed)


def graph_batch(sentences: int, src_len: int, tgt_len: int, vocab: int = 60) -> Batch:
    """Random ids on the GPU, the first sentence shorter (padding on both sides)."""
    src = torch.randint(4, vocab, (sentences, src_len), device="cuda")
    tgt = torch.randint(4, vocab, (sentences, tgt_len + 1), device="cuda")
    src[0, src_len // 2 :] = PAD_ID
    tgt[0, tgt_len // 2 :] = PAD_ID
    tgt_out = tgt[:, 1:].contiguous()
    index = torch.arange(sentences, device="cuda")
    return Batch(src, tgt[:, :-1].contiguous(), tgt_out, index, int((tgt_out != PAD_ID).sum()))


@pytest.mark.parametrize("r_drop", [None, 1.0], ids=["one_pass", "r_drop"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_graphed_step_gives_the_eager_steps_loss_and_gradients(
    dropout: float, bf16: bool, r_drop: float | None
):
    """Each new batch shape is captured, a known one replayed, and every step's loss and
    gradients are the eager training step's (Transformer.loss selecting the scored
    positions) from the same seed: dropout masks included, the replay reads the seed."""
    model = configured_model(vocab=60, dropout=dropout).cuda().train()
    parameters = list(model.parameters())
    graphed = GraphedLoss(model, 0.1, r_drop, max_shapes=8)

    def step(batch: Batch, graph: bool) -> list[torch.Tensor]:
        torch.manual_seed(11)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            if graph:
                loss = graphed(batch, lambda: torch.manual_seed(11))
            else:
                loss = model.loss(batch.src, batch.tgt_in, batch.tgt_out, 0.1, r_drop=r_drop)
        loss.backward()
        values = [loss.detach().clone(), *(p.grad.clone() for p in parameters)]
        model.zero_grad(set_to_none=True)
        return values

    tolerance = {"rtol": 2e-2, "atol": 2e-3} if bf16 else {"rtol": 1e-4, "atol": 1e-5}
    for shape in [(6, 9, 7), (4, 12, 10), (6, 9, 7)]:  # the third replays the first's graph
        batch = graph_batch(*shape)
        eager, replayed = step(batch, graph=False), step(batch, graph=True)
        for got, want in zip(replayed, eager, strict=True):
            torch.testing.assert_close(got, want, **tolerance)
    assert sorted(graphed.graphs) == [(4, 12, 10), (6, 9, 7)]


def test_a_capture_survives_another_thread_pinning_memory() -> None:
    """The loader's pin-memory thread pins batches while a new shape is captured; in CUDA's
    "global" capture mode its calls invalidated the capture (two runs sharing a GPU)."""
    model = configured_model(vocab=60, dropout=0.1).cuda().train()
    graphed = GraphedLoss(model, 0.1, None, max_shapes=8)
    stop, pinned = threading.Event(), [0]

    def pin() -> None:
        while not stop.is_set():
            torch.empty(1 << (16 + pinned[0] % 6), pin_memory=True)
            torch._C._host_emptyCache()  # each pin a fresh cudaHostAlloc, each free its own
            pinned[0] += 1

    pinning = threading.Thread(target=pin, daemon=True)
    pinning.start()
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for shape in [(6, 9, 7), (4, 12, 10), (8, 5, 6), (3, 20, 18)]:
                graphed(graph_batch(*shape), lambda: None).backward()
    finally:
        stop.set()
        pinning.join()
    assert len(graphed.graphs) == 4 and pinned[0] > 0


def test_a_graphed_update_does_not_wait_for_the_host() -> None:
    """Once a shape is captured, its update (replay, backward, clipping, the NaN/inf decision,
    fused AdamW) runs with CUDA's sync debug mode set to error."""
    model = configured_model(vocab=60, dropout=0.1).cuda().train()
    optimizer = adamw(model, config_of("optim/adam_inverse_sqrt", OptimConfig, fused=True))
    graphed = GraphedLoss(model, 0.1, None, max_shapes=8)
    batch = graph_batch(5, 8, 9)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = graphed(batch, lambda: None)  # the capture
    loss.backward()
    optimizer.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in model.parameters()]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.manual_seed(3)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = graphed(batch, lambda: None) / batch.tgt_tokens
        loss.backward()
        skip_update_if(optimizer, ~clip_gradients(list(model.parameters()), 1.0).isfinite())
        optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_seeding_a_step_on_a_gpu_draws_torch_manual_seeds_streams() -> None:
    """The CPU's and the GPU's streams after the step's seeding are torch.manual_seed's, on
    the fused dropout kernel and in a graph's replay, which reads the generator as it starts."""
    x = torch.ones(4096, device="cuda")
    graph, static = torch.cuda.CUDAGraph(), torch.empty_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # a warm-up before the capture, as torch's guide has it
        F.dropout(x, 0.3)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        static.copy_(F.dropout(x, 0.3))

    def draws() -> list[torch.Tensor]:
        graph.replay()
        return [torch.rand(8), F.dropout(x, 0.3), static.clone()]

    torch.manual_seed(11)
    reference = draws()
    seed_generators(11, torch.device("cuda"))
    assert all(torch.equal(a, b) for a, b in zip(reference, draws(), strict=True))


@pytest.mark.slow
def test_trainer_gpu_trains_with_cuda_graphs_through_the_entry_point(tmp_path: Path) -> None:
    overrides = [*gpu_training_overrides(tmp_path), "cuda_graphs=8", "model.dropout=0.1"]
    result = run("train", tmp_path, *overrides, fresh_interpreter=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert "cuda_graphs: captured batch shape" in log
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert summary["steps"] == 4 and math.isfinite(summary["train_loss"])


@pytest.mark.slow
def test_padded_lengths_reach_the_captured_shapes(tmp_path: Path) -> None:
    overrides = [*gpu_training_overrides(tmp_path), "cuda_graphs=8", "data.pad_to_multiple=8"]
    result = run("train", tmp_path, *overrides, fresh_interpreter=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    shapes = re.findall(r"captured batch shape \((\d+), (\d+), (\d+)\)", log)
    assert shapes and all(int(s) % 8 == 0 and int(t) % 8 == 0 for _, s, t in shapes)


@pytest.mark.slow
def test_a_multilingual_run_trains_graphed_and_tests_each_direction(tmp_path: Path) -> None:
    """The tag served before each source lengthens it by one piece: the padded shapes still
    reach the captured graphs, and each direction is decoded on the GPU with its own tag."""
    data = write_aligned(tmp_path / "aligned")
    overrides = [
        *(o for o in multilingual_overrides(data, tmp_path / "cache") if o != FP32),
        "model=transformer_tiny",
        "trainer=gpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=4",
        "cuda_graphs=8",
        "data.pad_to_multiple=8",
        "decoding=greedy",
        "average_last=0",
        "hydra.run.dir=run",
    ]
    result = run("train", tmp_path, *overrides, fresh_interpreter=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert "cuda_graphs: captured batch shape" in log
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert summary["steps"] == 4
    assert set(summary["test"]) == {"test.en-xx", "test.en-yy"}
    assert all(math.isfinite(s["bleu"]) for s in summary["test"].values())


@pytest.mark.slow
def test_a_joblib_workers_next_run_starts_with_the_last_ones_gpu_memory_handed_back(
    tmp_path: Path,
) -> None:
    """Two graphed runs in one joblib worker, one after the other: the first ends by handing its
    memory back to CUDA, so the second starts without it (an ablation sweep's second runs ran
    out of memory)."""
    overrides = [o for o in gpu_training_overrides(tmp_path) if o != "hydra.run.dir=run"]
    result = run(
        "train",
        tmp_path,
        "-m",
        *overrides,
        "cuda_graphs=8",
        "seed=1,2",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.sweep.subdir=${seed}",
        fresh_interpreter=True,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    pattern = r"reserved by this process: ([\d.]+) MiB, ([\d.]+) MiB after"
    first, second = (
        [tuple(map(float, m)) for m in re.findall(pattern, (run_dir / "train.log").read_text())]
        for run_dir in (tmp_path / "sweep" / "1", tmp_path / "sweep" / "2")
    )
    assert len(first) == 1 and len(second) == 2, (first, second)  # no CUDA before the first run
    (held, after), (brought, _) = first[0], second[0]
    assert held > after and after < 64 and brought < 64, (first, second)
