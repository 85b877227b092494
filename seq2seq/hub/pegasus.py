"""Our pre-norm Transformer as transformers' PegasusForConditionalGeneration, exactly.

Pegasus is the shipped encoder-decoder built as ours is: pre-norm layers with a final norm on
each stack, sinusoidal positions from 0 with no offset, embeddings scaled by sqrt(d_model),
biases on every projection but the output, LayerNorm eps 1e-5, and source embedding, target
embedding and output projection tied. Two layouts differ: Pegasus keeps keys and values in two
projections where we fuse them, and its position table has the sines in the first half of the
model dimension and the cosines in the second, where ours interleaves them. Relabelling the
model dimension (our coordinate `perm[c]` becomes its coordinate c) maps one table onto the
other; applied to every weight that reads or writes the residual stream, layer norms included,
it leaves the network's function unchanged, so the exported model computes ours (float
summation order aside) and any consumer that rebuilds the Pegasus table from the config gets
ours too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.ctranslate2_backend import check_exportable
from seq2seq.errors import require
from seq2seq.model.attention import MultiHeadAttention
from seq2seq.model.config import Norm, Score
from seq2seq.model.transformer import Embedding, Transformer

TARGET = "transformers' Pegasus"


def check_pegasus(model: Transformer, tokenizer: Tokenizer) -> None:
    """Raise a ConfigError naming the first setting Pegasus cannot compute as we do."""
    config = model.config
    check_exportable(config, TARGET)
    require(
        config.norm == Norm.pre,
        "model.norm",
        "post cannot be exported to transformers: the shipped architecture that computes our "
        "model exactly (Pegasus) is pre-norm; train with model.norm=pre (every preset's)",
    )
    require(
        tokenizer.joint,
        "tokenizer.joint",
        "false (a vocabulary per language) cannot be exported to transformers: Pegasus and its "
        "tokenizer hold one vocabulary; train with tokenizer.joint=true",
    )
    require(
        config.tie_embeddings,
        "model.tie_embeddings",
        "false cannot be exported to transformers: Pegasus ties the source and target "
        "embeddings and the output projection; train with model.tie_embeddings=true",
    )


def residual_permutation(d_model: int) -> Tensor:
    """Our coordinate of Pegasus's coordinate c: the even ones (sines), then the odd (cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def pegasus_config(model: Transformer, vocab_size: int) -> dict[str, Any]:
    """config.json of the exported model: sizes from the checkpoint's own config, special ids
    from the tokenizer; `normalize_before`/`normalize_embedding` are read by CTranslate2's
    converter (ct2-transformers-converter), not by transformers."""
    config = model.config
    return {
        "architectures": ["PegasusForConditionalGeneration"],
        "model_type": "pegasus",
        "vocab_size": vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.heads,
        "decoder_attention_heads": config.heads,
        "encoder_ffn_dim": config.ffn_dim,
        "decoder_ffn_dim": config.ffn_dim,
        "activation_function": "relu",
        "max_position_embeddings": config.max_len,
        "scale_embedding": True,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": config.d_model**-0.5,
        "pad_token_id": model.pad_id,
        "bos_token_id": model.bos_id,
        "eos_token_id": model.eos_id,
        "decoder_start_token_id": model.bos_id,  # our decoder starts from BOS, Pegasus's from PAD
        "forced_eos_token_id": None,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "normalize_before": True,
        "normalize_embedding": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def pegasus_state(model: Transformer) -> dict[str, Tensor]:
    """Our weights under Pegasus's names, float32, the model dimension relabelled by
    `residual_permutation`. Every one of our weights is used exactly once (checked)."""
    perm = residual_permutation(model.config.d_model)
    used: set[int] = set()

    def take(tensor: Tensor) -> Tensor:
        used.add(id(tensor))
        return tensor.detach().float().cpu()

    def reads(linear: nn.Linear, prefix: str, rows: slice = slice(None), scale: float = 1.0):
        """A projection of the residual stream: its input columns relabelled."""
        return {
            f"{prefix}.weight": (take(linear.weight)[rows][:, perm] * scale).contiguous(),
            f"{prefix}.bias": (take(linear.bias)[rows] * scale).contiguous(),
        }

    def writes(linear: nn.Linear, prefix: str) -> dict[str, Tensor]:
        """A projection into the residual stream: its output rows relabelled."""
        return {
            f"{prefix}.weight": take(linear.weight)[perm].contiguous(),
            f"{prefix}.bias": take(linear.bias)[perm].contiguous(),
        }

    def norm(layer: nn.LayerNorm, prefix: str) -> dict[str, Tensor]:
        return {
            f"{prefix}.weight": take(layer.weight)[perm].contiguous(),
            f"{prefix}.bias": take(layer.bias)[perm].contiguous(),
        }

    def attention(attn: MultiHeadAttention, prefix: str) -> dict[str, Tensor]:
        d = model.config.d_model
        # Pegasus always scales by 1/sqrt(d_k); a `dot` score has none: folded into the queries
        scale = attn.d_k**0.5 if attn.score == Score.dot else 1.0
        kv = attn.key_value_projection
        return {
            **reads(attn.query_projection, f"{prefix}.q_proj", scale=scale),
            **reads(kv, f"{prefix}.k_proj", slice(0, d)),
            **reads(kv, f"{prefix}.v_proj", slice(d, 2 * d)),
            **writes(attn.output_projection, f"{prefix}.out_proj"),
        }

    def positions(embedding: Embedding) -> Tensor:
        table = embedding.learned.weight if hasattr(embedding, "learned") else embedding.sinusoid
        return take(table)[:, perm].contiguous()

    def feed_forward(layer: nn.Module, prefix: str) -> dict[str, Tensor]:
        return {
            **norm(layer.feed_forward_block.norm, f"{prefix}.final_layer_norm"),
            **reads(layer.feed_forward.expand, f"{prefix}.fc1"),
            **writes(layer.feed_forward.contract, f"{prefix}.fc2"),
        }

    # tied (check_pegasus): the source embedding and output projection are this parameter
    tokens = take(model.tgt_embedding.tokens.weight)[:, perm].contiguous()
    state = {
        "model.shared.weight": tokens,
        "model.encoder.embed_tokens.weight": tokens,
        "model.decoder.embed_tokens.weight": tokens,
        "lm_head.weight": tokens,
        "final_logits_bias": torch.zeros(1, tokens.shape[0]),
        "model.encoder.embed_positions.weight": positions(model.src_embedding),
        "model.decoder.embed_positions.weight": positions(model.tgt_embedding),
        **norm(model.encoder_norm, "model.encoder.layer_norm"),
        **norm(model.decoder_norm, "model.decoder.layer_norm"),
    }
    for i, layer in enumerate(model.encoder_layers):
        prefix = f"model.encoder.layers.{i}"
        state |= norm(layer.attention_block.norm, f"{prefix}.self_attn_layer_norm")
        state |= attention(layer.self_attention.attention, f"{prefix}.self_attn")
        state |= feed_forward(layer, prefix)
    for i, layer in enumerate(model.decoder_layers):
        prefix = f"model.decoder.layers.{i}"
        state |= norm(layer.self_block.norm, f"{prefix}.self_attn_layer_norm")
        state |= attention(layer.self_attention.attention, f"{prefix}.self_attn")
        state |= norm(layer.cross_block.norm, f"{prefix}.encoder_attn_layer_norm")
        state |= attention(layer.cross_attention.attention, f"{prefix}.encoder_attn")
        state |= feed_forward(layer, prefix)
    unused = [name for name, p in model.named_parameters() if id(p) not in used]
    assert not unused, f"weights not exported: {unused}"
    return state
