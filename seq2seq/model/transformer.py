"""Encoder-decoder Transformer (Vaswani et al. 2017) with incremental decoding.

Pre-LN by default (Xiong et al. 2020: stable without a long warmup), post-LN as in the paper
as an option. Embeddings are scaled by sqrt(d_model) and, when the vocabulary is joint, tied
three ways: source embedding, target embedding and output projection (Press & Wolf 2017).
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.config import ModelConfig
from seq2seq.data.tokenizer import PAD_ID
from seq2seq.model.attention import MultiHeadAttention
from seq2seq.model.sites import AttentionSite, SiteCache

log = logging.getLogger(__name__)


def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
    return table  # (L, d_model)


class Embedding(nn.Module):
    """Token embedding x sqrt(d_model) plus positions, then dropout."""

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig) -> None:
        super().__init__()
        self.tokens, self.scale = tokens, math.sqrt(cfg.d_model)
        if cfg.positions == "learned":
            self.learned = nn.Embedding(cfg.max_len, cfg.d_model)
        else:
            self.register_buffer(
                "sinusoid", sinusoidal_positions(cfg.max_len, cfg.d_model), persistent=False
            )
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        table = self.learned(positions) if hasattr(self, "learned") else self.sinusoid[positions]
        return self.dropout(self.tokens(ids) * self.scale + table)  # (B, T, d)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.expand = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.contract = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.activation_dropout = nn.Dropout(cfg.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.contract(self.activation_dropout(F.relu(self.expand(x))))


class Residual(nn.Module):
    """x + dropout(sublayer(x)) with layer norm before (pre-LN) or after (post-LN)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.norm == "pre"

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        site = cfg.attention.encoder_self
        self.self_attention = MultiHeadAttention(
            cfg.d_model, site.heads or cfg.heads, cfg.attention_dropout, site.score
        )
        self.feed_forward = FeedForward(cfg)
        self.attention_block, self.feed_forward_block = Residual(cfg), Residual(cfg)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.attention_block(x, lambda h: self.self_attention(h, h, src_mask)[0])
        return self.feed_forward_block(x, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        wiring, causal = cfg.attention, not cfg.attention.allow_future_leak
        args = (cfg.d_model, cfg.heads, cfg.attention_dropout, causal)
        self.self_attention = AttentionSite(wiring.decoder_self, *args)
        self.cross_attention = AttentionSite(wiring.cross, *args)
        self.feed_forward = FeedForward(cfg)
        self.self_block, self.cross_block = Residual(cfg), Residual(cfg)
        self.feed_forward_block = Residual(cfg)

    def forward(
        self, y: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> Tensor:
        """Full pass over the target y (B, T, d) with the encoder output memory (B, S, d)."""
        y = self.self_block(y, lambda h: self.self_attention(h, memory, src_mask, need_weights))
        y = self.cross_block(y, lambda h: self.cross_attention(h, memory, src_mask, need_weights))
        return self.feed_forward_block(y, self.feed_forward)

    def step(self, y: Tensor, caches: tuple[SiteCache, SiteCache], src_mask: Tensor) -> Tensor:
        """One decoding step: y (N, 1, d)."""
        self_cache, cross_cache = caches
        y = self.self_block(y, lambda h: self.self_attention.step(h, self_cache, src_mask))
        y = self.cross_block(y, lambda h: self.cross_attention.step(h, cross_cache, src_mask))
        return self.feed_forward_block(y, self.feed_forward)


class DecoderState:
    """What incremental decoding carries from step to step, for N = sentences x beam rows."""

    def __init__(self, src_mask: Tensor, caches: list[tuple[SiteCache, SiteCache]]) -> None:
        self.src_mask = src_mask  # (N, 1, 1, S)
        self.caches = caches
        self.position = 0

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index`; each must stay within its sentence's block of beam rows."""
        for layer_caches in self.caches:
            for cache in layer_caches:
                cache.reorder(index)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool):
        super().__init__()
        cfg.check()  # e.g. a wiring that feeds the target to the encoder fails here, saying why
        self.cfg = cfg
        if cfg.attention.allow_future_leak:
            log.warning(
                "model.attention.allow_future_leak=true: the decoder sees later target tokens "
                "in training, which it cannot at inference; for demonstrating leakage only"
            )
        tgt_tokens = nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=PAD_ID)
        tie_source = cfg.tie_embeddings and joint_vocab and src_vocab == tgt_vocab
        src_tokens = (
            tgt_tokens if tie_source else nn.Embedding(src_vocab, cfg.d_model, padding_idx=PAD_ID)
        )
        self.src_embedding = Embedding(src_tokens, cfg)
        self.tgt_embedding = Embedding(tgt_tokens, cfg)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre_norm = cfg.norm == "pre"  # pre-LN needs a final norm on each stack's output
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre_norm else nn.Identity()
        self.output_projection = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.output_projection.weight = tgt_tokens.weight

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=self.cfg.d_model**-0.5)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])

    def compile_layers(self) -> None:
        """torch.compile every layer's full-sequence forward (training and validation loss).
        Incremental decoding stays eager, and state-dict keys do not change."""
        for layer in [*self.encoder_layers, *self.decoder_layers]:
            layer.compile(dynamic=True)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, d) and the source padding mask (B, 1, 1, S)."""
        src_mask = (src != PAD_ID)[:, None, None, :]
        x = self.src_embedding(src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> Tensor:
        """Teacher-forced decoder: tgt_in (B, T) -> final decoder states (B, T, d)."""
        y = self.tgt_embedding(tgt_in)
        for layer in self.decoder_layers:
            y = layer(y, memory, src_mask, need_weights)
        return self.decoder_norm(y)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_mask = self.encode(src)
        return self.output_projection(self.decode(tgt_in, memory, src_mask))

    def start_decoding(self, src: Tensor, beam: int = 1) -> DecoderState:
        """Encode once; what depends on the source alone (e.g. cross-attention keys/values)
        is computed once per sentence and repeated for its `beam` rows."""
        memory, src_mask = self.encode(src)
        caches = [
            (
                layer.self_attention.start(memory, src_mask, beam),
                layer.cross_attention.start(memory, src_mask, beam),
            )
            for layer in self.decoder_layers
        ]
        return DecoderState(src_mask.repeat_interleave(beam, dim=0), caches)

    def decode_step(self, state: DecoderState, tokens: Tensor) -> Tensor:
        """Feed the last tokens (N,) and return next-token log-probabilities (N, V)."""
        y = self.tgt_embedding(tokens[:, None], start=state.position)  # (N, 1, d)
        for layer, caches in zip(self.decoder_layers, state.caches, strict=True):
            y = layer.step(y, caches, state.src_mask)
        state.position += 1
        return self.output_projection(self.decoder_norm(y[:, 0])).log_softmax(dim=-1)
