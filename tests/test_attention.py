"""Multi-head attention against torch's reference, and the fused path against the explicit one."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn
from torch.autograd.profiler_util import FunctionEvent
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile

from seq2seq.model.attention import MultiHeadAttention, kernel_choice, preferred_kernels_off


def make(d_model: int = 32, heads: int = 4) -> MultiHeadAttention:
    torch.manual_seed(0)
    attention = MultiHeadAttention(d_model, heads).eval()
    for p in attention.parameters():  # non-zero biases too
        nn.init.normal_(p, std=0.3)
    return attention


def test_equals_torch_multihead_attention_with_the_same_weights() -> None:
    ours = make()
    reference = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        in_projections = [ours.query_projection, ours.key_value_projection]
        reference.in_proj_weight.copy_(torch.cat([p.weight for p in in_projections]))
        reference.in_proj_bias.copy_(torch.cat([p.bias for p in in_projections]))
        reference.out_proj.weight.copy_(ours.output_projection.weight)
        reference.out_proj.bias.copy_(ours.output_projection.bias)
    query, key_value = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 4:] = True  # torch: True = ignore; ours: True = attend
    expected, expected_weights = reference(
        query, key_value, key_value, key_padding_mask=padding, average_attn_weights=False
    )
    for need_weights in (False, True):
        out, weights = ours(query, key_value, ~padding[:, None, None, :], need_weights=need_weights)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)


def test_fused_and_explicit_paths_agree_with_causal_and_padding_masks() -> None:
    attention = make(48, 6)
    x = torch.randn(4, 9, 48)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    keep = torch.ones(4, 1, 1, 9, dtype=torch.bool)
    keep[2, ..., 6:] = False
    for mask in (None, causal, keep, causal & keep):
        fused, none = attention(x, x, mask)
        explicit, weights = attention(x, x, mask, need_weights=True)
        assert none is None
        torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        if mask is not None:
            assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_static_cache_reuses_keys_and_values() -> None:
    attention = make()
    query, memory = torch.randn(2, 3, 32), torch.randn(2, 6, 32)
    cache = attention.static_cache(memory, repeat=2)  # rows: s0, s0, s1, s1
    assert cache.key.shape == (4, 4, 6, 8)
    direct, _ = attention(query, memory)
    cached, _ = attention(query.repeat_interleave(2, 0), None, cache=cache)
    torch.testing.assert_close(cached, direct.repeat_interleave(2, 0), atol=1e-6, rtol=1e-6)


def training_pass(
    attention: MultiHeadAttention, rule: bool, bf16: bool
) -> tuple[Tensor, Tensor, set]:
    """Output, query-projection gradient and the aten ops of a training step on a CPU (under
    bf16 autocast or in fp32)."""
    torch.manual_seed(1)
    query, key_value = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    attention.zero_grad()
    kernels = contextlib.nullcontext() if rule else preferred_kernels_off()
    with profile() as profiler, kernels, torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        out, _ = attention(query, key_value, mask)
        out.float().square().sum().backward()
    ops = {event.name for event in profiler.events()}
    return out.detach().float(), attention.query_projection.weight.grad.clone(), ops


def relative_error(actual: Tensor, expected: Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


@pytest.mark.parametrize(("bf16", "tolerance"), [(True, 2e-2), (False, 1e-5)], ids=["bf16", "fp32"])
def test_training_on_cpu_uses_the_math_kernel_with_flash_attentions_results(
    bf16: bool, tolerance: float
) -> None:
    ours = make().train()  # the rule applies while training; dropout is 0: results comparable
    out_math, grad_math, ops_math = training_pass(ours, rule=True, bf16=bf16)
    out_flash, grad_flash, ops_flash = training_pass(ours, rule=False, bf16=bf16)
    flash = "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert flash in ops_flash and flash not in ops_math
    assert relative_error(out_math, out_flash) < tolerance / 2
    assert relative_error(grad_math, grad_flash) < tolerance
    query = torch.randn(3, 5, 32)
    with profile() as profiler, torch.no_grad(), torch.autocast("cpu", enabled=bf16):
        ours.eval()(query, query)  # decoding keeps torch's choice
    assert flash in {event.name for event in profiler.events()}


def casts_inside_the_math_kernel(rule: bool) -> int:
    """Tensors that SDPA's math kernel casts (aten::_to_copy, scalars left out) in a bf16
    training pass on a CPU, with the model's rule or with the math kernel as torch runs it;
    the pass must have run that kernel."""
    ours = make().train()
    torch.manual_seed(1)
    query, key_value = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    rule_off = contextlib.nullcontext() if rule else preferred_kernels_off()
    kernels = contextlib.nullcontext() if rule else sdpa_kernel([SDPBackend.MATH])
    bf16 = torch.autocast("cpu", torch.bfloat16)
    with rule_off, kernels, profile(record_shapes=True) as profiler, bf16:
        out, _ = ours(query, key_value)
        out.float().sum().backward()
    math = "aten::_scaled_dot_product_attention_math"
    events = profiler.events()
    assert math in {event.name for event in events}
    return sum(
        event.name == "aten::_to_copy" and len(event.input_shapes[0]) > 0 and within(event, math)
        for event in events
    )


def within(event: FunctionEvent, name: str) -> bool:
    """Whether a profiled operator ran inside operator `name`."""
    parent = event.cpu_parent
    while parent is not None and parent.name != name:
        parent = parent.cpu_parent
    return parent is not None


def test_bf16_training_on_cpu_keeps_the_math_kernel_in_bf16() -> None:
    allowed = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    assert casts_inside_the_math_kernel(rule=False) >= 3  # queries, keys and values to fp32
    assert casts_inside_the_math_kernel(rule=True) == 0
    assert torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() == allowed  # restored


def sdpa_backends_enabled() -> dict[str, bool]:
    backends = torch.backends.cuda
    return {
        "cudnn": backends.cudnn_sdp_enabled(),
        "flash": backends.flash_sdp_enabled(),
        "efficient": backends.mem_efficient_sdp_enabled(),
        "math": backends.math_sdp_enabled(),
    }


@pytest.mark.parametrize("grad", [True, False])  # training and decoding
def test_on_a_gpu_every_sdpa_kernel_but_cudnns_may_run(grad: bool) -> None:
    gpu_queries = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16)
    before = sdpa_backends_enabled()
    assert before["cudnn"]  # torch's default, which the rule turns off
    with torch.set_grad_enabled(grad), kernel_choice(gpu_queries):
        inside = sdpa_backends_enabled()
    assert inside == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    assert sdpa_backends_enabled() == before
    with preferred_kernels_off(), kernel_choice(gpu_queries):
        assert sdpa_backends_enabled() == before
