"""Encoder-decoder Transformer (Vaswani et al. 2017) with incremental decoding.

Pre-LN by default (Xiong et al. 2020: stable without a long warmup), post-LN as in the paper
as an option. Embeddings are scaled by sqrt(d_model) and, when the vocabulary is joint, tied
three ways: source embedding, target embedding and output projection (Press & Wolf 2017).
Every attention is an `AttentionSite` (sites.py) wired by `model.attention` (docs/attention.md).
The special token ids come from the tokenizer, at construction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.model.config import ModelConfig, Norm, Positions, Stream
from seq2seq.model.dropout import Dropout
from seq2seq.model.loss import label_smoothed_cross_entropy
from seq2seq.model.sites import AttentionSite, SiteCache

log = logging.getLogger(__name__)


def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
    return table  # (L, d_model)


def replace_tokens(ids: Tensor, p: float, first_ordinary: int, vocab: int) -> Tensor:
    """Each ordinary token replaced, with probability p, by one drawn uniformly from the
    ordinary tokens (Takase and Kiyono 2021's Rep(Uni)); padding, BOS and EOS stay."""
    chosen = (torch.rand(ids.shape, device=ids.device) < p) & (ids >= first_ordinary)
    drawn = torch.randint(first_ordinary, vocab, ids.shape, device=ids.device)
    return torch.where(chosen, drawn, ids)


class Embedding(nn.Module):
    """Token embedding x sqrt(d_model) plus positions, then dropout. In training, input tokens
    are first replaced at random (`model.token_replacement`); ids from `first_ordinary` up are
    ordinary tokens, those below it special."""

    def __init__(self, tokens: nn.Embedding, config: ModelConfig, first_ordinary: int) -> None:
        super().__init__()
        self.tokens, self.scale = tokens, math.sqrt(config.d_model)
        self.replacement, self.first_ordinary = config.token_replacement, first_ordinary
        if config.positions == Positions.learned:
            self.learned = nn.Embedding(config.max_len, config.d_model)
        else:
            table = sinusoidal_positions(config.max_len, config.d_model)
            self.register_buffer("sinusoid", table, persistent=False)
        self.dropout = Dropout(config.dropout)

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        if self.training and self.replacement > 0:
            vocab = self.tokens.num_embeddings
            ids = replace_tokens(ids, self.replacement, self.first_ordinary, vocab)
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        table = self.learned(positions) if hasattr(self, "learned") else self.sinusoid[positions]
        return self.dropout(self.tokens(ids) * self.scale + table)  # (B, T, d)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.expand = nn.Linear(config.d_model, config.ffn_dim)
        self.contract = nn.Linear(config.ffn_dim, config.d_model)
        self.activation_dropout = Dropout(config.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.contract(self.activation_dropout(F.relu(self.expand(x))))


class Residual(nn.Module):
    """x + dropout(sublayer(x)) with layer norm before (pre-LN) or after (post-LN):
    the sublayer reads `sublayer_input(x)`, and `forward(x, its output)` adds it to x. Without
    `residual` (model.block), the output replaces x instead: dropout(sublayer(x))."""

    def __init__(self, config: ModelConfig, residual: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = Dropout(config.dropout)
        self.pre_norm = config.norm == Norm.pre
        self.residual = residual

    def sublayer_input(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre_norm else x

    def forward(self, x: Tensor, sublayer_output: Tensor) -> Tensor:
        x = x + self.dropout(sublayer_output) if self.residual else self.dropout(sublayer_output)
        return x if self.pre_norm else self.norm(x)


def sublayer(
    config: ModelConfig, stack: str, name: str, layer: int, build: Callable[[], nn.Module]
) -> tuple[nn.Module | None, Residual | None]:
    """Sublayer `name` of layer `layer` of `stack` as model.block says: built, with its
    Residual, or (None, None) where it is skipped (no parameters)."""
    settings = config.sublayer(stack, name, layer)
    if not settings.runs:
        return None, None
    return build(), Residual(config, settings.residual)


# the attention site that each attention sublayer of model.block is
SITE_OF = {
    ("encoder", "self_attention"): "encoder_self",
    ("decoder", "self_attention"): "decoder_self",
    ("decoder", "cross_attention"): "cross",
}


def attention_sublayer(
    config: ModelConfig, stack: str, name: str, layer: int
) -> tuple[AttentionSite | None, Residual | None]:
    """An attention sublayer, wired as `model.attention` says for this layer, updating its
    stack's stream: the source in the encoder, the target in the decoder."""
    site = SITE_OF[stack, name]
    count = getattr(config, f"{stack}_layers")
    return sublayer(
        config,
        stack,
        name,
        layer,
        lambda: AttentionSite(
            config.attention.site(site, layer, count),
            Stream.source if stack == "encoder" else Stream.target,
            config.d_model,
            config.heads,
            config.attention_dropout,
            causal=not config.attention.allow_future_leak,
        ),
    )


class EncoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        attention, attention_block = attention_sublayer(config, "encoder", "self_attention", layer)
        feed_forward, feed_forward_block = sublayer(
            config, "encoder", "feed_forward", layer, lambda: FeedForward(config)
        )
        # registered in this order: an optimizer's state in a checkpoint follows it
        self.self_attention, self.feed_forward = attention, feed_forward
        self.attention_block, self.feed_forward_block = attention_block, feed_forward_block

    def forward(
        self, x: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, S, d): the source states; src_mask (B, 1, 1, S). Returns the new states and,
        if `need_weights`, the self-attention weights (B, h, S, S) (None where skipped)."""
        weights = None
        if self.self_attention is not None:
            h = self.attention_block.sublayer_input(x)
            attended, weights = self.self_attention(h, None, src_mask, need_weights)
            x = self.attention_block(x, attended)
        if self.feed_forward is not None:
            h = self.feed_forward_block.sublayer_input(x)
            x = self.feed_forward_block(x, self.feed_forward(h))
        return x, weights


LayerWeights = dict[str, Tensor | None]  # a decoder layer's weights by site: decoder_self, cross


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self_attention, self_block = attention_sublayer(config, "decoder", "self_attention", layer)
        cross_attention, cross_block = attention_sublayer(
            config, "decoder", "cross_attention", layer
        )
        feed_forward, feed_forward_block = sublayer(
            config, "decoder", "feed_forward", layer, lambda: FeedForward(config)
        )
        # registered in this order: an optimizer's state in a checkpoint follows it
        self.self_attention, self.cross_attention = self_attention, cross_attention
        self.feed_forward = feed_forward
        self.self_block, self.cross_block = self_block, cross_block
        self.feed_forward_block = feed_forward_block

    def forward(
        self, y: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, LayerWeights]:
        """Full pass over the target y (B, T, d) with the encoder output memory (B, S, d)."""
        weights: LayerWeights = {"decoder_self": None, "cross": None}
        for name, site, block in (
            ("decoder_self", self.self_attention, self.self_block),
            ("cross", self.cross_attention, self.cross_block),
        ):
            if site is not None:
                attended, weights[name] = site(
                    block.sublayer_input(y), memory, src_mask, need_weights
                )
                y = block(y, attended)
        if self.feed_forward is not None:
            h = self.feed_forward_block.sublayer_input(y)
            y = self.feed_forward_block(y, self.feed_forward(h))
        return y, weights

    def step(
        self, y: Tensor, caches: tuple[SiteCache | None, SiteCache | None], src_mask: Tensor
    ) -> Tensor:
        """One decoding step: y (N, 1, d)."""
        for site, block, cache in (
            (self.self_attention, self.self_block, caches[0]),
            (self.cross_attention, self.cross_block, caches[1]),
        ):
            if site is not None:
                y = block(y, site.step(block.sublayer_input(y), cache, src_mask))
        if self.feed_forward is not None:
            h = self.feed_forward_block.sublayer_input(y)
            y = self.feed_forward_block(y, self.feed_forward(h))
        return y


class DecoderState:
    """What incremental decoding carries from step to step, for N = sentences x beam rows."""

    def __init__(
        self, src_mask: Tensor, caches: list[tuple[SiteCache | None, SiteCache | None]]
    ) -> None:
        self.src_mask = src_mask  # (N, 1, 1, S)
        self.caches = caches
        self.position = 0

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index`, each within its sentence's block of beam rows. Fewer rows than
        before drop whole sentences (those done), with what depends on their source."""
        sentences_dropped = len(index) != len(self.src_mask)
        if sentences_dropped:
            self.src_mask = self.src_mask.index_select(0, index)
        for layer_caches in self.caches:
            for cache in layer_caches:
                if cache is not None:  # None: a skipped site (model.block)
                    cache.reorder(index, sentences_dropped)


class Vocabulary(Protocol):
    """What the model needs of a tokenizer (seq2seq.data.tokenizer.Tokenizer has it): sizes,
    whether source and target share one vocabulary, and the special token ids."""

    src_vocab_size: int
    tgt_vocab_size: int
    joint: bool
    pad_id: int
    bos_id: int
    eos_id: int
    tag_ids: tuple[int, ...]  # a multilingual model's target-language tags


class Transformer(nn.Module):
    @classmethod
    def for_vocabulary(cls, config: ModelConfig, vocabulary: Vocabulary) -> Transformer:
        """The model for a tokenizer's vocabulary: how training and checkpoints build it."""
        return cls(
            config,
            vocabulary.src_vocab_size,
            vocabulary.tgt_vocab_size,
            vocabulary.joint,
            pad_id=vocabulary.pad_id,
            bos_id=vocabulary.bos_id,
            eos_id=vocabulary.eos_id,
            tag_ids=vocabulary.tag_ids,
        )

    def __init__(
        self,
        config: ModelConfig,
        src_vocab: int,
        tgt_vocab: int,
        joint_vocab: bool,
        *,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        tag_ids: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        config.check()  # e.g. a wiring that feeds the target to the encoder fails here, saying why
        self.config = config
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id  # search reads them too
        self.never_ids = (pad_id, bos_id, *tag_ids)  # ids search never outputs
        if config.attention.allow_future_leak:
            log.warning(
                "model.attention.allow_future_leak=true: the decoder sees later target tokens "
                "in training, which it cannot at inference; for demonstrating leakage only"
            )
        tgt_tokens = nn.Embedding(tgt_vocab, config.d_model, padding_idx=pad_id)
        tie_source = config.tie_embeddings and joint_vocab and src_vocab == tgt_vocab
        src_tokens = (
            tgt_tokens
            if tie_source
            else nn.Embedding(src_vocab, config.d_model, padding_idx=pad_id)
        )
        first_ordinary = max(pad_id, bos_id, eos_id) + 1
        self.src_embedding = Embedding(src_tokens, config, first_ordinary)
        self.tgt_embedding = Embedding(tgt_tokens, config, first_ordinary)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(config, layer) for layer in range(config.encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(config, layer) for layer in range(config.decoder_layers)
        )
        if not self.reads_source():
            log.warning(
                "model.attention / model.block: no running decoder attention takes its queries "
                "or keys/values from the source, so the output cannot depend on the input (a "
                "target language model); fine for an ablation, not for translation"
            )
        pre_norm = config.norm == Norm.pre  # pre-LN needs a final norm on each stack's output
        self.encoder_norm = nn.LayerNorm(config.d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(config.d_model) if pre_norm else nn.Identity()
        self.output_projection = nn.Linear(config.d_model, tgt_vocab, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.output_projection.weight = tgt_tokens.weight

    def vocabulary_parameters(self) -> int:
        """Parameters in the token embeddings and the output projection, a tied tensor once:
        the share of the model that grows with the vocabulary."""
        weights = (
            self.src_embedding.tokens.weight,
            self.tgt_embedding.tokens.weight,
            self.output_projection.weight,
        )
        return sum({id(w): w.numel() for w in weights}.values())

    def reads_source(self) -> bool:
        """Whether any running decoder attention reads the source: the output's only path
        from the input."""
        sites = [
            site
            for layer in self.decoder_layers
            for site in (layer.self_attention, layer.cross_attention)
            if site is not None
        ]
        return any(Stream.source in (site.query_stream, site.key_value_stream) for site in sites)

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=self.config.d_model**-0.5)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])

    def compile_layers(self) -> None:
        """torch.compile every layer's full-sequence forward (training and validation loss).
        Incremental decoding stays eager, and state-dict keys do not change."""
        for layer in [*self.encoder_layers, *self.decoder_layers]:
            layer.compile(dynamic=True)

    def encode(
        self, src: Tensor, weights: list[Tensor | None] | None = None
    ) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, d) and the source padding mask (B, 1, 1, S). Given a
        list `weights`, each layer's self-attention weights (B, h, S, S) are appended to it
        (None for a layer that skips it)."""
        src_mask = (src != self.pad_id)[:, None, None, :]
        x = self.src_embedding(src)
        for layer in self.encoder_layers:
            x, layer_weights = layer(x, src_mask, weights is not None)
            if weights is not None:
                weights.append(layer_weights)
        return self.encoder_norm(x), src_mask

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[LayerWeights] | None]:
        """Teacher-forced decoder: tgt_in (B, T) -> final decoder states (B, T, d), and with
        `need_weights` each layer's attention weights by site (AttentionSite.forward)."""
        y = self.tgt_embedding(tgt_in)
        weights = []
        for layer in self.decoder_layers:
            y, layer_weights = layer(y, memory, src_mask, need_weights)
            weights.append(layer_weights)
        return self.decoder_norm(y), weights if need_weights else None

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_mask = self.encode(src)
        states, _ = self.decode(tgt_in, memory, src_mask)
        return self.output_projection(states)

    def loss(
        self,
        src: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor,
        label_smoothing: float,
        static_shapes: bool = False,
        r_drop: float | None = None,
    ) -> Tensor:
        """Summed label-smoothed cross-entropy of the next tokens tgt_out (B, T), padding
        ignored. The output projection is fused into the loss (seq2seq/model/loss.py): the (B, T, V)
        logits never exist whole. `static_shapes` scores every position, padding weighted 0,
        rather than selecting the scored ones: no shape depends on the data (a CUDA graph
        needs that), for the cost of the padding's rows. With `r_drop` (alpha) the batch runs
        twice as one of 2B pairs, each copy with its own dropout masks: R-Drop's loss."""
        if r_drop is not None:
            src, tgt_in = src.repeat(2, 1), tgt_in.repeat(2, 1)
        memory, src_mask = self.encode(src)
        states, _ = self.decode(tgt_in, memory, src_mask)  # (B or 2B, T, d)
        weight = self.output_projection.weight
        if static_shapes:
            return label_smoothed_cross_entropy(
                states.flatten(0, 1),  # (B * T or 2B * T, d)
                weight,
                tgt_out.flatten(),
                label_smoothing,
                ignore_index=self.pad_id,
                r_drop=r_drop,
            )
        scored = tgt_out != self.pad_id
        return label_smoothed_cross_entropy(
            states[scored if r_drop is None else scored.repeat(2, 1)],
            weight,
            tgt_out[scored],
            label_smoothing,
            r_drop=r_drop,
        )

    def start_decoding(self, src: Tensor, beam: int = 1) -> DecoderState:
        """Encode once; what depends on the source alone (e.g. cross-attention keys/values)
        is computed once per sentence and repeated for its `beam` rows."""
        memory, src_mask = self.encode(src)
        caches = [
            tuple(
                None if site is None else site.start(memory, src_mask, beam)
                for site in (layer.self_attention, layer.cross_attention)
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
