"""A decoder attention site with configurable wiring (docs/attention.md).

A site updates the decoder's target stream. Its queries come from the target or the source
(the encoder output), its keys/values likewise. An attention's output is aligned with its
queries, so when the queries come from the source, the results at the source positions are
averaged (padding excluded) and added at every target position; with keys/values from the
target, target position t receives the average computed over target positions <= t only.
No wiring lets position t see a later target token unless `causal` is off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seq2seq.config import AttentionSiteConfig
from seq2seq.model.attention import KVCache, MultiHeadAttention


def masked_mean(results: Tensor, keep: Tensor) -> Tensor:
    """Mean over the source positions where keep (B, 1, 1, S) is True.

    (B, h, S, d_k) -> (B, h, 1, d_k): one vector for every target position;
    (B, h, T, S, d_k) -> (B, h, T, d_k): one vector per target prefix.
    """
    keep = keep.transpose(-1, -2).to(results.dtype)  # (B, 1, S, 1)
    if results.dim() == 5:
        keep = keep[:, :, None]  # (B, 1, 1, S, 1)
        return (results * keep).sum(-2) / keep.sum(-2)
    return (results * keep).sum(-2, keepdim=True) / keep.sum(-2, keepdim=True)


@dataclass
class SiteCache:
    """What a site keeps between decoding steps; only `keys` grows and is reordered."""

    keys: KVCache | None = None  # keys/values: target (growing) or source (static)
    source_queries: Tensor | None = None  # (N, h, S, d_k) when queries come from the source
    summary: Tensor | None = None  # (N, 1, d) when queries and keys/values are the source

    def reorder(self, index: Tensor) -> None:
        if self.keys is not None:
            self.keys.reorder(index)


class AttentionSite(nn.Module):
    def __init__(
        self, cfg: AttentionSiteConfig, d_model: int, heads: int, dropout: float, causal: bool
    ) -> None:
        super().__init__()
        self.query_stream, self.key_value_stream = cfg.query, cfg.key_value
        self.attention = MultiHeadAttention(d_model, cfg.heads or heads, dropout, cfg.score)
        self.causal = causal
        self.weights: Tensor | None = None  # the last attention weights, when asked for

    def _causal_mask(self, length: int, device: torch.device) -> Tensor | None:
        if not self.causal:
            return None
        return torch.ones(length, length, dtype=torch.bool, device=device).tril()

    def forward(
        self, target: Tensor, source: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> Tensor:
        """Full pass. target (B, T, d), source (B, S, d) -> (B, T, d) or (B, 1, d) to add."""
        a = self.attention
        from_target = self.key_value_stream == "target"
        key_value = target if from_target else source
        if self.query_stream == "target":
            mask = self._causal_mask(target.shape[1], target.device) if from_target else src_mask
            out, self.weights = a(target, key_value, mask, need_weights=need_weights)
            return out
        q = a.queries(source)
        k, v = a.keys_values(key_value)
        if from_target and self.causal:  # position t: results over the target prefix <= t
            results, self.weights = a.attend_prefixes(q, k, v, need_weights)  # (B,h,T,S,d_k)
        else:  # one vector for every target position
            mask = None if from_target else src_mask
            results, self.weights = a.attend(q, k, v, mask, need_weights)  # (B, h, S, d_k)
        return a.merge(masked_mean(results, src_mask))

    def start(self, source: Tensor, src_mask: Tensor, repeat: int) -> SiteCache:
        """Incremental decoding: compute what depends on the source alone, once per sentence."""
        a = self.attention
        if self.key_value_stream == "source" and self.query_stream == "source":
            summary = self(source[:, :0], source, src_mask)  # needs no target: (B, 1, d)
            return SiteCache(summary=summary.repeat_interleave(repeat, 0))
        if self.key_value_stream == "source":
            return SiteCache(keys=a.static_cache(source, repeat))
        queries = None
        if self.query_stream == "source":
            queries = a.queries(source).repeat_interleave(repeat, 0)
        return SiteCache(keys=KVCache(static=False), source_queries=queries)

    def step(self, target: Tensor, cache: SiteCache, src_mask: Tensor) -> Tensor:
        """One decoding step: target (N, 1, d) -> (N, 1, d); src_mask (N, 1, 1, S)."""
        a = self.attention
        if cache.summary is not None:
            return cache.summary
        if cache.source_queries is None:  # queries from the target
            mask = src_mask if self.key_value_stream == "source" else None
            out, self.weights = a(target, None if cache.keys.static else target, mask, cache.keys)
            return out
        k, v = cache.keys.extend(*a.keys_values(target))  # source queries over the prefix
        results, self.weights = a.attend(cache.source_queries, k, v, None)  # (N, h, S, d_k)
        return a.merge(masked_mean(results, src_mask))
