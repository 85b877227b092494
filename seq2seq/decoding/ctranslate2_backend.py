"""The CTranslate2 backend: the model directory `python -m seq2seq.export` writes, and
translating with it (docs/deploy.md).

Writing. Built through CTranslate2's Python spec API, one of our modules to one of its specs: the
same weights, the same sinusoidal table (ours, passed explicitly: CTranslate2's built-in one
differs) and the SentencePiece pieces as the vocabulary. Only what CTranslate2 computes exactly
as we do is exported; any other wiring is refused with the setting named. The converted model
appends the source EOS itself (`add_source_eos`), so a caller passes the SentencePiece pieces of
a line, `sp.encode(line, out_type=str)`, at most `model.max_len - 1` of them, and decodes the
output pieces with `sp.decode(pieces)`.

Reading. `Translator.from_checkpoint(directory)`, `seq2seq.translate` and `seq2seq.evaluate` take
such a directory wherever they take a checkpoint: the text handling is Translator's, the search
CTranslate2's, set up to give our search's hypotheses and scores:

- PAD and BOS suppressed, EOS allowed from the first step: CTranslate2 renormalises each step's
  distribution over the tokens it may output, as our search does (seq2seq.decoding.search);
- the length normalisation is the same (CTranslate2 counts EOS in the length, as we do);
- the length limit is one per batch (the longest allowed in it, from `decoding.max_len_*`),
  where ours is per sentence, and a hypothesis that reaches it ends there without EOS, where
  ours ends with a forced EOS: only sentences that reach their limit can differ.
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
import torch
from torch import Tensor, nn

from seq2seq.config import RootConfig
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.backend import Request, output_limits, source_batch
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.search import Hypothesis
from seq2seq.errors import CheckpointError, ConfigError, Seq2SeqError, install_hint, require
from seq2seq.io import atomic_dir
from seq2seq.model.attention import MultiHeadAttention
from seq2seq.model.config import ModelConfig, Norm, Score, Stream
from seq2seq.model.transformer import DecoderLayer, Embedding, EncoderLayer, Transformer
from seq2seq.upgrade import load_config

log = logging.getLogger(__name__)

METADATA = "seq2seq_export.json"  # beside CTranslate2's files: where the model came from


def import_ctranslate2(error: type[Seq2SeqError], what: str) -> ModuleType:
    """The ctranslate2 package, an optional extra; without it, `error` says how to install it."""
    try:
        return importlib.import_module("ctranslate2")
    except ImportError:
        raise error(f"{what} needs the ctranslate2 package: {install_hint('deploy')}") from None


# (query, key_value) of each site in the one wiring CTranslate2 has
STANDARD_STREAMS = {
    "encoder_self": (Stream.source, Stream.source),
    "decoder_self": (Stream.target, Stream.target),
    "cross": (Stream.target, Stream.source),
}


def check_exportable(config: ModelConfig, target: str = "CTranslate2") -> None:
    """Raise a ConfigError naming the first setting that `target` (an inference engine or
    architecture with one standard Transformer wiring) cannot compute as we do."""
    attention = config.attention
    for site, streams in STANDARD_STREAMS.items():
        wiring = getattr(attention, site)
        key = f"model.attention.{site}"
        require(
            (wiring.query, wiring.key_value) == streams,
            key,
            f"query={wiring.query} key_value={wiring.key_value} cannot be exported: {target} "
            f"has only the standard wiring (query={streams[0]} key_value={streams[1]})",
        )
        require(
            wiring.score != Score.additive,
            f"{key}.score",
            f"additive attention cannot be exported: {target} has dot-product scores only",
        )
        require(
            wiring.heads in (None, config.heads),
            f"{key}.heads",
            f"{wiring.heads} heads cannot be exported: {target} has one head count for "
            f"every attention (model.heads={config.heads})",
        )
    require(
        not attention.allow_future_leak,
        "model.attention.allow_future_leak",
        f"a decoder trained without the causal mask cannot be exported: {target}'s is causal",
    )
    require(
        not attention.layers,
        "model.attention.layers",
        f"per-layer wiring cannot be exported: {target} wires every layer alike",
    )
    for stack in ("encoder", "decoder"):
        for name in (f.name for f in fields(getattr(config.block, stack))):
            for layer in range(getattr(config, f"{stack}_layers")):
                sublayer = config.sublayer(stack, name, layer)
                require(
                    sublayer.runs and sublayer.residual,
                    f"model.block.{stack}.{name}",
                    f"layer {layer}'s {name} is skipped or has no residual connection, which "
                    f"cannot be exported: every {target} layer runs each sublayer with its "
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
    specs = import_ctranslate2(ConfigError, "exporting to CTranslate2").specs
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


def refuse_nonempty(directory: Path, overwrite: bool) -> None:
    """An export replaces a non-empty directory only when asked (export.overwrite)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"export.dir {directory} is a file: name a directory")
    if directory.exists() and any(directory.iterdir()) and not overwrite:
        raise ConfigError(
            f"export.dir {directory} already exists and is not empty: choose another "
            "directory, or replace it with export.overwrite=true"
        )


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
    specs = import_ctranslate2(ConfigError, "exporting to CTranslate2").specs
    accepted = specs.model_spec.ACCEPTED_MODEL_TYPES
    require(
        quantization is None or quantization in accepted,
        "export.quantization",
        f"{quantization!r} is not one of CTranslate2's types: none, {', '.join(accepted)}",
    )
    refuse_nonempty(directory, overwrite)
    directory = Path(directory)
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


# what seq2seq.export writes: CTranslate2's model and vocabulary, ours beside them
FILES = ("model.bin", "config.json", "src.model", "tgt.model", METADATA)


def read_metadata(directory: Path) -> dict[str, Any]:
    """seq2seq_export.json of an export directory, checked for the files beside it."""
    missing = [name for name in FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{directory} is not a model exported by seq2seq.export (missing: "
            f"{', '.join(missing)}): set ckpt_path to a .ckpt file, or to a directory written by "
            "python -m seq2seq.export ckpt_path=<ckpt> export.dir=<dir>"
        )
    path = directory / METADATA
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f", line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise CheckpointError(
            f"{path}{where}: not valid JSON ({e}); export the model again with "
            "python -m seq2seq.export ... export.overwrite=true"
        ) from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("max_len"), int):
        raise CheckpointError(
            f"{path}: no 'max_len' (the model's positions); export the model again with "
            "python -m seq2seq.export ... export.overwrite=true"
        )
    return metadata


def training_config(directory: Path, metadata: dict[str, Any]) -> RootConfig | None:
    """The training run's configuration, when the export recorded one."""
    if "config" not in metadata:
        return None
    try:
        return load_config(metadata["config"])
    except Seq2SeqError as e:
        raise CheckpointError(f"{directory / METADATA}, 'config': {e}") from None


def suppressed(tokenizer: Tokenizer) -> list[list[str]]:
    """PAD, BOS and a multilingual model's tags as CTranslate2's `suppress_sequences`: our
    search never outputs them."""
    tgt = tokenizer.tgt
    return [[tgt.id_to_piece(i)] for i in (tokenizer.pad_id, tokenizer.bos_id, *tokenizer.tag_ids)]


def load_engine(directory: Path, device: torch.device, compute_type: str = "default"):
    """A ctranslate2.Translator on torch's intra-op threads, one worker; weights computed in
    `compute_type` ("default": the type they were exported in)."""
    ctranslate2 = import_ctranslate2(
        CheckpointError, f"{directory} is a CTranslate2 model: translating with it"
    )
    try:
        translator = ctranslate2.Translator(
            str(directory),
            device=device.type,
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=torch.get_num_threads(),
        )
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"cannot load the CTranslate2 model in {directory}: {str(e).splitlines()[0]}. The "
            "export is damaged or from another CTranslate2 version: export the checkpoint again "
            "with python -m seq2seq.export ... export.overwrite=true"
        ) from None
    if device.type == "cuda":
        check_cuda_libraries(translator, ctranslate2.__version__)
    return translator


def check_cuda_libraries(translator: Any, version: str) -> None:
    """CTranslate2 loads cuBLAS at its first GPU search, not with the model: a one-token search
    finds a missing library here rather than in the middle of a file."""
    try:
        translator.translate_batch([["<unk>"]], max_decoding_length=1)
    except RuntimeError as e:
        raise CheckpointError(
            f"CTranslate2 {version} cannot translate on this GPU: {str(e).splitlines()[0]}. "
            "Install the CUDA libraries its wheel was built for (CTranslate2 4.x: CUDA 12), "
            "or translate on the CPU: CUDA_VISIBLE_DEVICES= python -m seq2seq.translate ..."
        ) from None


def load_tokenizer(directory: Path) -> Tokenizer:
    try:
        return Tokenizer.load(directory)
    except (RuntimeError, AssertionError) as e:
        raise CheckpointError(
            f"cannot read the SentencePiece models src.model / tgt.model in {directory}: "
            f"{str(e).splitlines()[0] if str(e) else 'unexpected special ids'}; export the "
            "model again with python -m seq2seq.export ... export.overwrite=true"
        ) from None


class CTranslate2Backend:
    """CTranslate2's search on a directory written by seq2seq.export (module docstring)."""

    def __init__(self, directory: Path, device: str | torch.device = "cpu") -> None:
        directory = Path(directory)
        self.metadata = read_metadata(directory)
        self.training_config = training_config(directory, self.metadata)
        self.tokenizer = load_tokenizer(directory)
        self.max_len = self.metadata["max_len"]
        self.engine = load_engine(directory, torch.device(device))
        self.name = f"ctranslate2 {self.metadata.get('quantization', '')}".strip()
        self.never_output = suppressed(self.tokenizer)
        self.warned_about_seeds = False

    def decode(self, requests: list[Request], decoding: DecodingConfig) -> list[list[Hypothesis]]:
        if any(r.constraints for r in requests):
            raise ConfigError(
                "constraints: CTranslate2 has no lexically constrained decoding; translate with "
                "the checkpoint (ckpt_path=<run>/checkpoints/<name>.ckpt) instead of the export "
                "directory"
            )
        prefixed = [i for i, r in enumerate(requests) if r.prefix]
        if prefixed and len(prefixed) < len(requests):
            # with target_prefix, CTranslate2 lets only the best candidate end at the step
            # after the prefix, an empty one too (step 0): lines without a prefix are decoded
            # apart, so that a line's output does not depend on what else is in its batch
            plain = [i for i, r in enumerate(requests) if not r.prefix]
            decoded: list[list[Hypothesis]] = [[] for _ in requests]
            for group in (prefixed, plain):
                found = self.decode([requests[i] for i in group], decoding)
                for i, hypotheses in zip(group, found, strict=True):
                    decoded[i] = hypotheses
            return decoded
        ids = [r.source for r in requests]
        src, tgt = self.tokenizer.src, self.tokenizer.tgt
        # one limit for the batch: its longest source's (the limit grows with the length), or
        # its longest prefix's (ours outputs a longer prefix whole)
        longest = source_batch([max(ids, key=len)])
        limit = int(output_limits(longest, decoding, self.max_len)[0])
        limit = max(limit, *(len(r.prefix) for r in requests))
        prefixes = [[tgt.id_to_piece(i) for i in r.prefix] for r in requests] if prefixed else None
        # CTranslate2 returns at most beam_size hypotheses, also when sampling: there each
        # source goes in nbest times, one sample per copy
        copies = decoding.nbest if decoding.search == "sample" else 1
        results = self.engine.translate_batch(
            [[src.id_to_piece(i) for i in seq] for seq in ids for _ in range(copies)],
            target_prefix=prefixes and [prefix for prefix in prefixes for _ in range(copies)],
            num_hypotheses=decoding.nbest // copies,
            length_penalty=decoding.length_penalty,
            max_input_length=0,  # source_ids has truncated (or refused) long lines
            max_decoding_length=limit + 1,  # EOS included
            min_decoding_length=0,
            suppress_sequences=self.never_output,
            return_scores=True,
            **self.search_options(decoding),
        )
        hypotheses = [
            [
                Hypothesis([tgt.piece_to_id(piece) for piece in pieces], score)
                for pieces, score in zip(result.hypotheses, result.scores, strict=True)
            ]
            for result in results
        ]
        if prefixes:
            hypotheses = self.with_prefix_scores(ids, requests, hypotheses, decoding)
        if copies == 1:
            return hypotheses
        return [
            sorted(
                (h for copy in hypotheses[i : i + copies] for h in copy),
                key=lambda h: h.score,
                reverse=True,
            )
            for i in range(0, len(hypotheses), copies)
        ]

    def with_prefix_scores(
        self,
        ids: list[list[int]],
        requests: list[Request],
        hypotheses: list[list[Hypothesis]],
        decoding: DecodingConfig,
    ) -> list[list[Hypothesis]]:
        """CTranslate2 leaves a target prefix's log-probabilities out of a hypothesis's score
        (its length still counts them); ours scores the whole output, so they are added back,
        as `score_batch` gives them (the prefix's tokens only: `max_input_length=0`)."""
        src, tgt = self.tokenizer.src, self.tokenizer.tgt
        copies = len(hypotheses) // len(requests)
        scored = self.engine.score_batch(
            [[src.id_to_piece(i) for i in seq] for seq in ids],
            [[tgt.id_to_piece(i) for i in r.prefix] for r in requests],
            max_input_length=0,
        )
        prefix_log_probs = [
            sum(result.log_probs[: len(r.prefix)])
            for result, r in zip(scored, requests, strict=True)
        ]
        return [
            [
                Hypothesis(
                    h.tokens,
                    h.score
                    + prefix_log_probs[i // copies]
                    / (len(h.tokens) + 1) ** decoding.length_penalty,
                )
                for h in hypotheses[i]
            ]
            for i in range(len(hypotheses))
        ]

    def search_options(self, decoding: DecodingConfig) -> dict[str, Any]:
        """Beam search, or sampling. CTranslate2's random generator is one for the process
        (`ctranslate2.set_random_seed`), seeded here for each batch: the same seed, input and
        decoding.batch_size give the same samples, but a sentence's samples change with the
        batch it is in, where our search seeds each sentence from its line."""
        if decoding.search != "sample":
            return {"beam_size": decoding.beam_size}
        if not self.warned_about_seeds:
            log.warning(
                "CTranslate2 samples from one random generator for the whole process: a "
                "sentence's samples depend on its batch, not on (decoding.seed, line) alone; "
                "decode with the checkpoint for samples reproducible sentence by sentence"
            )
            self.warned_about_seeds = True
        import_ctranslate2(ConfigError, "sampling").set_random_seed(decoding.seed)
        return {
            "beam_size": 1,
            "sampling_topk": decoding.top_k,  # 0: the whole distribution, as ours
            "sampling_topp": decoding.top_p,
            "sampling_temperature": decoding.temperature,
        }
