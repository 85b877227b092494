"""On a CUDA GPU: `trainer=gpu` training (bf16-mixed), the loss under bf16 autocast, and AdamW
under mixed precision. Skipped where torch sees no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import FP32, config_of, few_pairs_overrides, run, toy_corpus, write_lines

from seq2seq.config import OptimConfig
from seq2seq.model.loss import label_smoothed_cross_entropy
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


def test_trainer_gpu_trains_in_bf16_mixed_through_the_entry_point(tmp_path: Path) -> None:
    result = run("train", tmp_path, *gpu_training_overrides(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "GPU available: True (cuda), used: True" in output
    assert "Using bfloat16 Automatic Mixed Precision (AMP)" in output  # Lightning, bf16-mixed
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


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
