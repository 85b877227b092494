"""The two systems under test, built from one config: ours and a MarianMTModel of its shape.

`build_ours` is the only place that constructs our model: when its constructor changes, this
is the line to follow.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.config import RootConfig
from seq2seq.data.batching import Batch
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from seq2seq.model.transformer import Transformer
from seq2seq.training.module import TranslationModule


@dataclass
class System:
    """A model and its training loss (mean per target token), as its users would compute it."""

    model: nn.Module
    loss: Callable[[Batch], Tensor]


def build_ours(config: RootConfig, tokenizer: Tokenizer, device: torch.device) -> System:
    """Our model and loss, exactly as `seq2seq.train` trains them."""
    module = TranslationModule(config, tokenizer).to(device)
    return System(module, lambda batch: module.loss(batch)[0])


def transformer(ours: System) -> Transformer:
    """Our Transformer inside its LightningModule: what the searches decode with."""
    return ours.model.model


def compiled_copy(ours: System) -> System:
    """A copy of our model with torch.compile'd layers (`compile=true` in seq2seq.train)."""
    module = copy.deepcopy(ours.model)
    module.model.compile_layers()
    return System(module, lambda batch: module.loss(batch)[0])


def graphed_copy(ours: System, config: RootConfig) -> System:
    """A copy of our model whose training loss runs through CUDA graphs, one per batch shape
    (`cuda_graphs` in seq2seq.train); the warm-up pass captures them."""
    from seq2seq.training.cuda_graphs import GraphedLoss

    module = copy.deepcopy(ours.model)
    graphed = GraphedLoss(
        module.model, config.optim.label_smoothing, module.r_drop, max_shapes=1024
    )
    return System(module, lambda batch: graphed(batch, lambda: None) / batch.tgt_tokens)


def marian_like(config: RootConfig, vocab: int) -> nn.Module:
    """MarianMTModel of our model's shape: same widths, depths, heads, vocabulary, ties."""
    from transformers import MarianConfig, MarianMTModel

    model = config.model
    return MarianMTModel(
        MarianConfig(
            vocab_size=vocab,
            decoder_vocab_size=vocab,
            d_model=model.d_model,
            encoder_layers=model.encoder_layers,
            decoder_layers=model.decoder_layers,
            encoder_attention_heads=model.heads,
            decoder_attention_heads=model.heads,
            encoder_ffn_dim=model.ffn_dim,
            decoder_ffn_dim=model.ffn_dim,
            activation_function="relu",
            dropout=model.dropout,
            attention_dropout=model.attention_dropout,
            activation_dropout=model.activation_dropout,
            max_position_embeddings=model.max_len,
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
            tie_word_embeddings=model.tie_embeddings,
            pad_token_id=PAD_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            decoder_start_token_id=BOS_ID,
            forced_eos_token_id=None,
        )
    )


def build_marian(
    config: RootConfig, tokenizer: Tokenizer, device: torch.device
) -> tuple[System | None, str]:
    """Marian and its loss, or None and why not (the report says so instead of failing).

    The loss is label-smoothed F.cross_entropy over Marian's logits, what a Hugging Face user
    would write.
    """
    try:
        marian = marian_like(config, tokenizer.tgt_vocab_size).to(device)
    except ImportError:
        return None, "transformers is not installed: pip install -e '.[bench]'"
    if not (tokenizer.joint and tokenizer.src_vocab_size == tokenizer.tgt_vocab_size):
        return None, "Marian comparison needs a joint vocabulary"
    smoothing = config.optim.label_smoothing

    def loss(batch: Batch) -> Tensor:
        logits = marian(
            input_ids=batch.src,
            attention_mask=batch.src != PAD_ID,
            decoder_input_ids=batch.tgt_in,
        ).logits
        return F.cross_entropy(
            logits.flatten(0, 1),
            batch.tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=smoothing,
        )

    return System(marian, loss), ""


def parameters(system: System | None) -> int | None:
    return sum(p.numel() for p in system.model.parameters()) if system else None
