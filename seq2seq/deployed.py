"""Translating with a directory written by `python -m seq2seq.export` (docs/deploy.md).

`Translator.from_checkpoint(directory)`, `seq2seq.translate` and `seq2seq.evaluate` take such
a directory wherever they take a checkpoint: the text handling is Translator's, the search
CTranslate2's, set up to give our search's hypotheses and scores:

- PAD and BOS suppressed, EOS allowed from the first step: CTranslate2 renormalises each step's
  distribution over the tokens it may output, as our search does (seq2seq.search);
- the length normalisation is the same (CTranslate2 counts EOS in the length, as we do);
- the length limit is one per batch (the longest allowed in it, from `decoding.max_len_*`),
  where ours is per sentence, and a hypothesis that reaches it ends there without EOS, where
  ours ends with a forced EOS: only sentences that reach their limit can differ.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from seq2seq.checkpoint import upgrade_config
from seq2seq.config import DecodingConfig, RootConfig, group_config, validate_config
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import CheckpointError, Seq2SeqError
from seq2seq.export import METADATA
from seq2seq.search import Hypothesis
from seq2seq.translator import Translator

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
        return validate_config(OmegaConf.create(upgrade_config(metadata["config"])))
    except Seq2SeqError as e:
        raise CheckpointError(f"{directory / METADATA}, 'config': {e}") from None


def suppressed(tokenizer: Tokenizer) -> list[list[str]]:
    """PAD and BOS as CTranslate2's `suppress_sequences`: our search never outputs them."""
    tgt = tokenizer.tgt
    return [[tgt.id_to_piece(i)] for i in (tokenizer.pad_id, tokenizer.bos_id)]


def load_engine(directory: Path, device: torch.device, compute_type: str = "default"):
    """A ctranslate2.Translator on torch's intra-op threads, one worker; weights computed in
    `compute_type` ("default": the type they were exported in)."""
    try:
        ctranslate2 = importlib.import_module("ctranslate2")
    except ImportError:
        raise CheckpointError(
            f"{directory} is a CTranslate2 model: translating with it needs the ctranslate2 "
            "package: pip install -e '.[deploy]'"
        ) from None
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


class CTranslate2Translator(Translator):
    """A Translator whose search is CTranslate2's, on a directory written by seq2seq.export.
    There is no torch model: it sets the attributes that Translator's text handling reads
    (tokenizer, decoding, device, max_len) and replaces `decode`."""

    def __init__(
        self, directory: Path, decoding: DecodingConfig | None = None, device: str = "cpu"
    ) -> None:
        directory = Path(directory)
        self.metadata = read_metadata(directory)
        self.training_config = training_config(directory, self.metadata)
        self.tokenizer = load_tokenizer(directory)
        self.decoding = decoding or group_config("decoding/beam", DecodingConfig)
        self.device = torch.device(device)
        self.max_len = self.metadata["max_len"]
        self.engine = load_engine(directory, self.device)
        self.backend = f"ctranslate2 {self.metadata.get('quantization', '')}".strip()
        self.never_output = suppressed(self.tokenizer)

    def decode(self, ids: list[list[int]]) -> list[list[Hypothesis]]:
        decoding, src, tgt = self.decoding, self.tokenizer.src, self.tokenizer.tgt
        # one limit for the batch: its longest source's (the limit grows with the length)
        limit = int(self.output_limits(self.source_batch([max(ids, key=len)]))[0])
        results = self.engine.translate_batch(
            [[src.id_to_piece(i) for i in seq] for seq in ids],
            beam_size=decoding.beam_size,
            num_hypotheses=decoding.nbest,
            length_penalty=decoding.length_penalty,
            max_input_length=0,  # source_ids has truncated (or refused) long lines
            max_decoding_length=limit + 1,  # EOS included
            min_decoding_length=0,
            suppress_sequences=self.never_output,
            return_scores=True,
        )
        return [
            [
                Hypothesis([tgt.piece_to_id(piece) for piece in pieces], score)
                for pieces, score in zip(result.hypotheses, result.scores, strict=True)
            ]
            for result in results
        ]
