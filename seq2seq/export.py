"""Conversion of a trained model to a CTranslate2 model directory (docs/deploy.md).

    python -m seq2seq.export ckpt_path=... export.dir=model_ct2 [export.quantization=int8]

Built through CTranslate2's Python spec API, one of our modules to one of its specs: the same
weights, the same sinusoidal table (ours, passed explicitly: CTranslate2's built-in one differs)
and the SentencePiece pieces as the vocabulary. Only what CTranslate2 computes exactly as we do
is exported; any other wiring is refused with the setting named.

The converted model appends the source EOS itself (`add_source_eos`), so a caller passes the
SentencePiece pieces of a line, `sp.encode(line, out_type=str)`, at most `model.max_len - 1` of
them, and decodes the output pieces with `sp.decode(pieces)`.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import sentencepiece as spm
from torch import Tensor, nn

from seq2seq.checkpoint import load_trained
from seq2seq.cli import entrypoint
from seq2seq.config import ExportConfig, config_to_dict
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import ConfigError, require
from seq2seq.io import atomic_dir
from seq2seq.model.attention import MultiHeadAttention
from seq2seq.model.config import ModelConfig, Norm, Score, Stream
from seq2seq.model.transformer import DecoderLayer, Embedding, EncoderLayer, Transformer

log = logging.getLogger("seq2seq.export")

# (query, key_value) of each site in the one wiring CTranslate2 has
STANDARD_STREAMS = {
    "encoder_self": (Stream.source, Stream.source),
    "decoder_self": (Stream.target, Stream.target),
    "cross": (Stream.target, Stream.source),
}


def _ctranslate2() -> ModuleType:
    try:
        return importlib.import_module("ctranslate2")
    except ImportError:
        raise ConfigError(
            "exporting to CTranslate2 needs the ctranslate2 package: pip install -e '.[deploy]'"
        ) from None


def check_exportable(config: ModelConfig) -> None:
    """Raise a ConfigError naming the first setting that CTranslate2 cannot compute as we do."""
    attention = config.attention
    for site, streams in STANDARD_STREAMS.items():
        wiring = getattr(attention, site)
        key = f"model.attention.{site}"
        require(
            (wiring.query, wiring.key_value) == streams,
            key,
            f"query={wiring.query} key_value={wiring.key_value} cannot be exported: CTranslate2 "
            f"has only the standard wiring (query={streams[0]} key_value={streams[1]})",
        )
        require(
            wiring.score != Score.additive,
            f"{key}.score",
            "additive attention cannot be exported: CTranslate2 has dot-product scores only",
        )
        require(
            wiring.heads in (None, config.heads),
            f"{key}.heads",
            f"{wiring.heads} heads cannot be exported: CTranslate2 has one head count for "
            f"every attention (model.heads={config.heads})",
        )
    require(
        not attention.allow_future_leak,
        "model.attention.allow_future_leak",
        "a decoder trained without the causal mask cannot be exported: CTranslate2's is causal",
    )
    require(
        not attention.layers,
        "model.attention.layers",
        "per-layer wiring cannot be exported: CTranslate2 wires every layer alike",
    )
    for stack in ("encoder", "decoder"):
        for name in (f.name for f in fields(getattr(config.block, stack))):
            for layer in range(getattr(config, f"{stack}_layers")):
                sublayer = config.sublayer(stack, name, layer)
                require(
                    sublayer.runs and sublayer.residual,
                    f"model.block.{stack}.{name}",
                    f"layer {layer}'s {name} is skipped or has no residual connection, which "
                    "cannot be exported: every CTranslate2 layer runs each sublayer with its "
                    "residual",
                )


def _array(weight: Tensor) -> np.ndarray:
    """A float32 copy on the CPU: the model itself stays where and as it is (a float32 CPU
    tensor's .numpy() shares its memory, which CTranslate2's quantization writes into)."""
    return weight.detach().float().cpu().numpy().copy()


def _linear(spec, *layers: nn.Linear) -> None:
    """`layers` fused along the output dimension (one layer: copied as it is)."""
    spec.weight = np.concatenate([_array(layer.weight) for layer in layers])
    spec.bias = np.concatenate([_array(layer.bias) for layer in layers])


def _layer_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _attention(spec, attention: MultiHeadAttention, norm: nn.LayerNorm, fused: bool) -> None:
    """Self-attention (`fused`): linear[0] is Q, K, V in one; cross-attention: linear[0] is Q,
    linear[1] K and V. Our key_value_projection already holds K then V, CTranslate2's order."""
    _layer_norm(spec.layer_norm, norm)
    if fused:
        _linear(spec.linear[0], attention.query_projection, attention.key_value_projection)
    else:
        _linear(spec.linear[0], attention.query_projection)
        _linear(spec.linear[1], attention.key_value_projection)
    _linear(spec.linear[-1], attention.output_projection)
    if attention.score == Score.dot:  # no 1/sqrt(d_k): CTranslate2's scale replaced by 1
        spec.queries_scale = np.float32(1.0)


def _feed_forward(spec, layer: EncoderLayer | DecoderLayer) -> None:
    _layer_norm(spec.layer_norm, layer.feed_forward_block.norm)
    _linear(spec.linear_0, layer.feed_forward.expand)
    _linear(spec.linear_1, layer.feed_forward.contract)


def _embeddings(stack, tokens, embedding: Embedding) -> None:
    """The token table `tokens` of the encoder or decoder spec `stack`, scaled by sqrt(d_model)
    as ours, and our position table (sinusoidal or learned) added from position 0."""
    tokens.weight = _array(embedding.tokens.weight)
    positions: Tensor = (
        embedding.learned.weight if hasattr(embedding, "learned") else embedding.sinusoid
    )
    stack.position_encodings.encodings = _array(positions)
    stack.scale_embeddings = True


def _pieces(sp: spm.SentencePieceProcessor) -> list[str]:
    return [sp.id_to_piece(i) for i in range(sp.vocab_size())]


def transformer_spec(model: Transformer, tokenizer: Tokenizer):
    """The `ctranslate2.specs.TransformerSpec` of our model, with its vocabularies and special
    tokens. Raises ConfigError for a model CTranslate2 cannot compute exactly."""
    specs = _ctranslate2().specs
    config = model.config
    check_exportable(config)
    pre_norm = config.norm == Norm.pre
    spec = specs.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers), config.heads, pre_norm=pre_norm
    )
    encoder, decoder = spec.encoder, spec.decoder
    _embeddings(encoder, encoder.embeddings[0], model.src_embedding)
    _embeddings(decoder, decoder.embeddings, model.tgt_embedding)
    decoder.projection.weight = _array(model.output_projection.weight)
    if pre_norm:
        _layer_norm(encoder.layer_norm, model.encoder_norm)
        _layer_norm(decoder.layer_norm, model.decoder_norm)
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        norm = layer.attention_block.norm
        _attention(layer_spec.self_attention, layer.self_attention.attention, norm, fused=True)
        _feed_forward(layer_spec.ffn, layer)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        norm = layer.self_block.norm
        _attention(layer_spec.self_attention, layer.self_attention.attention, norm, fused=True)
        norm = layer.cross_block.norm
        _attention(layer_spec.attention, layer.cross_attention.attention, norm, fused=False)
        _feed_forward(layer_spec.ffn, layer)

    spec.register_source_vocabulary(_pieces(tokenizer.src))
    spec.register_target_vocabulary(_pieces(tokenizer.tgt))
    pieces = _pieces(tokenizer.tgt)
    spec.config.unk_token = pieces[tokenizer.unk_id]
    spec.config.bos_token = pieces[tokenizer.bos_id]
    spec.config.eos_token = pieces[tokenizer.eos_id]
    spec.config.decoder_start_token = pieces[model.bos_id]  # our decoder starts from BOS
    spec.config.add_source_eos = True  # our encoder input is the pieces + EOS
    spec.config.layer_norm_epsilon = model.encoder_layers[0].attention_block.norm.eps
    return spec


METADATA = "seq2seq_export.json"  # beside CTranslate2's files: where the model came from


def export_model(
    model: Transformer,
    tokenizer: Tokenizer,
    directory: Path,
    quantization: str | None = None,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `model` as a CTranslate2 model directory, weights stored as `quantization` (None:
    float32; "int8", "int8_float32", "int16", "bfloat16", ...: CTranslate2's types), with the
    SentencePiece models (src.model, tgt.model) and `metadata` as seq2seq_export.json. The
    directory appears only complete (written beside it, then renamed); a non-empty one is
    replaced only with `overwrite`."""
    accepted = _ctranslate2().specs.model_spec.ACCEPTED_MODEL_TYPES
    require(
        quantization is None or quantization in accepted,
        "export.quantization",
        f"{quantization!r} is not one of CTranslate2's types: none, {', '.join(accepted)}",
    )
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"export.dir {directory} is a file: name a directory")
    if directory.exists() and any(directory.iterdir()) and not overwrite:
        raise ConfigError(
            f"export.dir {directory} already exists and is not empty: choose another "
            "directory, or replace it with export.overwrite=true"
        )
    spec = transformer_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    with atomic_dir(directory, replace=True) as tmp:
        spec.save(str(tmp))
        tokenizer.save(tmp)
        record = {
            "quantization": quantization or "float32",
            "max_len": model.config.max_len,  # positions, source EOS included
            **(metadata or {}),
        }
        (tmp / METADATA).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return directory


def best_val_bleu(checkpoint: Path) -> float | None:
    """The best validation BLEU of the run a checkpoint comes from: its run_summary.json, when
    the checkpoint still sits in that run's checkpoints/ directory."""
    summary = checkpoint.parent.parent / "run_summary.json"
    if checkpoint.parent.name != "checkpoints" or not summary.is_file():
        return None
    return json.loads(summary.read_text()).get("best_val_bleu")


def export_checkpoint(
    checkpoint: Path, directory: Path, quantization: str | None = None, overwrite: bool = False
) -> Path:
    """A seq2seq checkpoint (.ckpt) as a CTranslate2 model directory (see `export_model`)."""
    checkpoint = Path(checkpoint).resolve()
    trained = load_trained(checkpoint)
    metadata = {
        "checkpoint": str(checkpoint),
        "best_val_bleu": best_val_bleu(checkpoint),
        "config": config_to_dict(trained.config),
    }
    return export_model(
        trained.model, trained.tokenizer, directory, quantization, metadata, overwrite
    )


@entrypoint(config_name="export", schema=ExportConfig)
def main(config: ExportConfig) -> None:
    settings = config.export
    quantization = None if settings.quantization == "none" else settings.quantization
    directory = export_checkpoint(
        Path(config.ckpt_path), Path(settings.dir), quantization, settings.overwrite
    )
    log.info("exported %s to %s (%s)", config.ckpt_path, directory, quantization or "float32")


if __name__ == "__main__":
    main()
