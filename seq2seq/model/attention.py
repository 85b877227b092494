"""Multi-head attention (Vaswani et al. 2017, section 3.2), one module for all three kinds.

Which sequence feeds the queries and which feeds the keys/values is an argument of `forward`:
encoder self-attention passes the source twice, decoder self-attention the target twice, and
cross-attention the target as `query` and the encoder output as `key_value`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KVCache:
    """Keys and values of one attention module during incremental decoding.

    `static` entries (cross-attention over the encoder output) are computed once per sentence;
    the others (self-attention) grow by one position per step.
    """

    def __init__(self, static: bool) -> None:
        self.static = static
        self.key: Tensor | None = None  # (B, h, T, d_k)
        self.value: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` of the batch (beam search reorders hypotheses each step)."""
        if self.key is not None and not self.static:
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        assert d_model % heads == 0, "d_model must be divisible by heads"
        self.heads, self.d_k, self.dropout = heads, d_model // heads, dropout
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * d_model)
        self.output = nn.Linear(d_model, d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape  # (B, T, d_model) -> (B, h, T, d_k)
        return x.view(b, t, self.heads, self.d_k).transpose(1, 2)

    def static_cache(self, key_value: Tensor, repeat: int = 1) -> KVCache:
        """Keys and values of a fixed sequence, computed once and repeated `repeat` times."""
        k, v = (self._split_heads(x) for x in self.key_value(key_value).chunk(2, dim=-1))
        cache = KVCache(static=True)
        cache.key, cache.value = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
        return cache

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `query` (B, Tq, d) over `key_value` (B, Tk, d).

        `mask` is boolean, broadcastable to (B, h, Tq, Tk), True where attention is allowed.
        Returns the output (B, Tq, d) and, if `need_weights`, the weights (B, h, Tq, Tk).
        With a static `cache`, `key_value` is not read: its keys and values are in the cache.
        """
        q = self._split_heads(self.query(query))  # (B, h, Tq, d_k)
        if cache is not None and cache.static:
            k, v = cache.key, cache.value
        else:
            k, v = (self._split_heads(x) for x in self.key_value(key_value).chunk(2, dim=-1))
            if cache is not None:  # incremental self-attention: append this step's keys/values
                if cache.key is not None:
                    k = torch.cat([cache.key, k], dim=2)
                    v = torch.cat([cache.value, v], dim=2)
                cache.key, cache.value = k, v
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, h, Tq, Tk)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(dim=-1)
            out = F.dropout(weights, dropout, self.training) @ v  # (B, h, Tq, d_k)
        else:
            weights = None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.heads * self.d_k)  # (B, Tq, d_model)
        return self.output(out), weights
