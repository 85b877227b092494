"""Multi-head attention (Vaswani et al. 2017, section 3.2), one module for every site.

Which sequence feeds the queries and which feeds the keys/values is an argument of `forward`
(seq2seq/model/sites.py chooses them from the site's config): encoder self-attention passes the
source twice, decoder self-attention the target twice, and standard cross-attention the target
as `query` and the encoder output (memory) as `key_value`. The score function is a setting:
scaled dot product (the paper), unscaled dot product, or additive (Bahdanau et al. 2015).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from seq2seq.model.config import Score
from seq2seq.model.dropout import dropout

# SDPA kernels where torch's own choice was measured slower (docs/performance.md). On a CPU,
# while training: the flash kernel's backward dominates our bf16 step, and the math kernel
# trains faster, in fp32 too at d_k 32 (Wu et al.'s model; no slower at transformer_small's 64);
# decoding keeps torch's choice. On a CUDA GPU, always: cuDNN's kernel, torch's
# first choice on an H100, builds a graph for every new shape, and every batch and decoding step
# brings new lengths; without it the first epoch trained about 7x faster.
TRAINING_KERNELS: dict[tuple[str, torch.dtype], list[SDPBackend]] = {
    ("cpu", torch.bfloat16): [SDPBackend.MATH],
    ("cpu", torch.float32): [SDPBackend.MATH],
}
CUDA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_preferred_on = True


@contextlib.contextmanager
def preferred_kernels_off() -> Iterator[None]:
    """Let torch choose every kernel: what scripts/precision_probe.py compares the rules with."""
    global _preferred_on
    before, _preferred_on = _preferred_on, False
    try:
        yield
    finally:
        _preferred_on = before


@contextlib.contextmanager
def training_kernels(backends: list[SDPBackend]) -> Iterator[None]:
    """SDPA restricted to `backends`, its math kernel computing bf16 inputs in bf16. By default
    that kernel computes them in fp32: three casts up and one down per call, as many back in
    the backward, and fp32 matrix products. In the bf16 training step on a CPU the casts were
    the largest share that is not the model's arithmetic; in bf16 the attention is as near
    fp32 as torch's flash kernel (tests/test_attention.py) and the step 1.04x as fast on an AMD
    EPYC; bf16 units: avx512_bf16 (docs/performance.md). torch's setting is global and named for
    CUDA; the math kernel reads it on every device, and fp32 inputs are not affected by it."""
    allowed = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        with sdpa_kernel(backends):
            yield
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(allowed)


def kernel_choice(q: Tensor) -> contextlib.AbstractContextManager:
    """The SDPA kernels for these queries: CUDA_KERNELS on a GPU, TRAINING_KERNELS while
    training (bf16 ones computed in bf16), else torch's choice."""
    if not _preferred_on:
        return contextlib.nullcontext()
    if q.device.type == "cuda":
        return sdpa_kernel(CUDA_KERNELS)
    backends = TRAINING_KERNELS.get((q.device.type, q.dtype))
    if backends is None or not torch.is_grad_enabled():
        return contextlib.nullcontext()
    return training_kernels(backends)


class KVCache:
    """Keys and values of one attention module during incremental decoding.

    `static` entries (a source sequence) are computed once per sentence; the others (target
    prefixes) grow by one position per step.
    """

    def __init__(self, static: bool) -> None:
        self.static = static
        self.key: Tensor | None = None  # (B, h, T, d_k)
        self.value: Tensor | None = None

    def extend(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's keys and values (B, h, 1, d_k); return all of them so far."""
        if self.key is not None:
            key = torch.cat([self.key, key], dim=2)
            value = torch.cat([self.value, value], dim=2)
        self.key, self.value = key, value
        return key, value

    def reorder(self, index: Tensor, sentences_dropped: bool) -> None:
        """Keep rows `index` of the batch: beam search reorders hypotheses each step. Static
        rows are equal within a sentence's beam rows, so they change only when whole sentences
        are dropped."""
        if self.key is not None and (sentences_dropped or not self.static):
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """Project queries, keys and values, attend per head, merge the heads and project back."""

    def __init__(
        self, d_model: int, heads: int, dropout: float = 0.0, score: Score = Score.scaled_dot
    ) -> None:
        super().__init__()
        assert d_model % heads == 0, "d_model must be divisible by heads"
        self.heads, self.d_k, self.dropout, self.score = heads, d_model // heads, dropout, score
        self.query_projection = nn.Linear(d_model, d_model)
        self.key_value_projection = nn.Linear(d_model, 2 * d_model)  # keys and values at once
        self.output_projection = nn.Linear(d_model, d_model)
        if score == Score.additive:  # v in v^T tanh(q + k), per head; q and k are the projections
            self.energy = nn.Parameter(torch.randn(heads, self.d_k) * self.d_k**-0.5)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape  # (B, T, d_model) -> (B, h, T, d_k)
        return x.view(b, t, self.heads, self.d_k).transpose(1, 2)

    def queries(self, x: Tensor) -> Tensor:
        return self._split_heads(self.query_projection(x))  # (B, h, T, d_k)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.key_value_projection(x).chunk(2, dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def merge(self, heads: Tensor) -> Tensor:
        """(B, h, T, d_k) -> output projection of the concatenated heads (B, T, d_model)."""
        b, _, t, _ = heads.shape
        return self.output_projection(heads.transpose(1, 2).reshape(b, t, self.heads * self.d_k))

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Attention logits (B, h, Tq, Tk)."""
        if self.score == Score.additive:
            hidden = torch.tanh(q[:, :, :, None] + k[:, :, None])  # (B, h, Tq, Tk, d_k)
            return torch.einsum("bhqkd,hd->bhqk", hidden, self.energy)
        scale = 1.0 / math.sqrt(self.d_k) if self.score == Score.scaled_dot else 1.0
        return q @ k.transpose(-2, -1) * scale

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(score(q, k)) v per head: (B, h, Tq, d_k), and the weights if asked for.

        `mask` is boolean, broadcastable to (B, h, Tq, Tk), True where attention is allowed.
        """
        if not need_weights and self.score != Score.additive:  # torch's fused kernel
            scale = None if self.score == Score.scaled_dot else 1.0
            p = self.dropout if self.training else 0.0
            with kernel_choice(q):
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=p, scale=scale
                )
            return out, None
        scores = self.scores(q, k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        return dropout(weights, self.dropout, self.training) @ v, weights

    def attend_prefixes(
        self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Queries q (B, h, Tq, d_k) over every prefix k[..., :t+1, :] of a target sequence.

        Returns (B, h, T, Tq, d_k): row t holds the results over target positions <= t.
        """
        t = k.shape[2]
        prefix = torch.ones(t, t, dtype=torch.bool, device=k.device).tril()  # [t, j]: j <= t
        scores = self.scores(q, k)[:, :, None]  # (B, h, 1, Tq, T)
        scores = scores.masked_fill(~prefix[:, None, :], float("-inf"))  # (B, h, T, Tq, T)
        weights = scores.softmax(dim=-1)
        out = dropout(weights, self.dropout, self.training) @ v[:, :, None]
        return out, weights if need_weights else None

    def static_cache(self, key_value: Tensor, repeat: int = 1) -> KVCache:
        """Keys and values of a fixed sequence, computed once and repeated `repeat` times."""
        k, v = self.keys_values(key_value)
        cache = KVCache(static=True)
        cache.key, cache.value = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
        return cache

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `query` (B, Tq, d) over `key_value` (B, Tk, d): output (B, Tq, d).

        With a static `cache`, `key_value` is not read: its keys and values are in the cache.
        Returns the weights (B, h, Tq, Tk) too if `need_weights`.
        """
        q = self.queries(query)
        if cache is not None and cache.static:
            k, v = cache.key, cache.value
        else:
            k, v = self.keys_values(key_value)
            if cache is not None:  # incremental: append this step's keys and values
                k, v = cache.extend(k, v)
        out, weights = self.attend(q, k, v, mask, need_weights)
        return self.merge(out), weights
