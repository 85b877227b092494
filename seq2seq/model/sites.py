"""An attention site with configurable wiring (docs/attention.md): every attention goes here.

A site updates its home stream: the source in the encoder, the target in the decoder. Its
queries and its keys/values each come from the home stream or the other one (`_stream`). An
attention's output is aligned with its queries, so queries from the home stream give one vector
per home position; queries from the other stream (the source, in the decoder) give results at
the source positions, which are averaged (padding excluded) and added at every target position.
Keys/values from the source are limited by the source padding mask, keys/values from the target
by the causal mask (`_key_value_mask`): no wiring lets target position t see a later target
token unless `causal` is off. The config check keeps the target out of the encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seq2seq.model.attention import KVCache, MultiHeadAttention
from seq2seq.model.config import AttentionSiteConfig, Stream


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
    """What a decoder site keeps between decoding steps; only `key_value` grows."""

    key_value: KVCache | None = None  # keys/values: target (growing) or source (static)
    source_queries: Tensor | None = None  # (N, h, S, d_k) when queries come from the source
    summary: Tensor | None = None  # (N, 1, d) when queries and keys/values are the source

    def reorder(self, index: Tensor, sentences_dropped: bool) -> None:
        if self.key_value is not None:
            self.key_value.reorder(index, sentences_dropped)
        if sentences_dropped and self.source_queries is not None:
            self.source_queries = self.source_queries.index_select(0, index)
        if sentences_dropped and self.summary is not None:
            self.summary = self.summary.index_select(0, index)


class AttentionSite(nn.Module):
    """One MultiHeadAttention wired to its streams. `causal` limits target keys/values to
    positions <= t (off only with model.attention.allow_future_leak)."""

    def __init__(
        self,
        config: AttentionSiteConfig,
        home: Stream,
        d_model: int,
        heads: int,
        dropout: float,
        causal: bool,
    ) -> None:
        super().__init__()
        self.query_stream, self.key_value_stream, self.home = config.query, config.key_value, home
        self.attention = MultiHeadAttention(d_model, config.heads or heads, dropout, config.score)
        self.causal = causal

    def _stream(self, stream: Stream, x: Tensor, memory: Tensor | None) -> Tensor:
        """The states of `stream`: the home stream's x, or the encoder output (the source, seen
        from the decoder)."""
        return x if stream == self.home else memory

    def _key_value_mask(self, x: Tensor, src_mask: Tensor) -> Tensor | None:
        """Source keys/values: the padding mask (B, 1, 1, S); target keys/values: the causal
        mask (T, T), position t sees positions <= t; none without `causal`."""
        if self.key_value_stream == Stream.source:
            return src_mask
        if not self.causal:
            return None
        length = x.shape[1]
        return torch.ones(length, length, dtype=torch.bool, device=x.device).tril()

    def forward(
        self, x: Tensor, memory: Tensor | None, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Full pass over the home stream x (B, L, d); memory (B, S, d) is the encoder output in
        the decoder, None in the encoder. Returns the update of x, (B, L, d) or (B, 1, d) to add
        at every position, and the weights if `need_weights`: (B, h, Q, K), or (B, h, T, S, T)
        for source queries over target prefixes."""
        queries = self._stream(self.query_stream, x, memory)
        key_value = self._stream(self.key_value_stream, x, memory)
        if self.query_stream == self.home:  # one result per home position
            mask = self._key_value_mask(x, src_mask)
            return self.attention(queries, key_value, mask, need_weights=need_weights)
        # queries from the other stream (the source, in the decoder): a summary of the source
        q = self.attention.queries(queries)
        k, v = self.attention.keys_values(key_value)
        if self.key_value_stream == Stream.target and self.causal:
            # target position t: the results over the target prefix <= t
            results, weights = self.attention.attend_prefixes(q, k, v, need_weights)
        else:  # one vector for every target position
            mask = self._key_value_mask(x, src_mask)
            results, weights = self.attention.attend(q, k, v, mask, need_weights)
        # results (B, h, S, d_k), or (B, h, T, S, d_k) over target prefixes
        return self.attention.merge(masked_mean(results, src_mask)), weights

    def start(self, memory: Tensor, src_mask: Tensor, repeat: int) -> SiteCache:
        """Incremental decoding: compute what depends on the source alone, once per sentence."""
        from_source = self.key_value_stream == Stream.source
        if from_source and self.query_stream == Stream.source:
            summary, _ = self(memory[:, :0], memory, src_mask)  # needs no target: (B, 1, d)
            return SiteCache(summary=summary.repeat_interleave(repeat, 0))
        if from_source:
            return SiteCache(key_value=self.attention.static_cache(memory, repeat))
        queries = None
        if self.query_stream == Stream.source:
            queries = self.attention.queries(memory).repeat_interleave(repeat, 0)
        return SiteCache(key_value=KVCache(static=False), source_queries=queries)

    def step(self, y: Tensor, cache: SiteCache, src_mask: Tensor) -> Tensor:
        """One decoding step: target y (N, 1, d) -> (N, 1, d); src_mask (N, 1, 1, S)."""
        if cache.summary is not None:
            return cache.summary
        if cache.source_queries is None:  # queries from the target
            mask = src_mask if self.key_value_stream == Stream.source else None
            key_value = None if cache.key_value.static else y
            return self.attention(y, key_value, mask, cache.key_value)[0]
        keys, values = cache.key_value.extend(*self.attention.keys_values(y))  # target prefix
        results, _ = self.attention.attend(cache.source_queries, keys, values, None)
        return self.attention.merge(masked_mean(results, src_mask))  # over source queries
