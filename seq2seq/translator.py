"""Translate text with a trained model: the Python API behind evaluate and translate."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from seq2seq.checkpoint import load_trained
from seq2seq.config import DecodingConfig, RootConfig, group_config
from seq2seq.data.batching import collate
from seq2seq.data.corpus import normalize
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import DataError
from seq2seq.model.transformer import Transformer
from seq2seq.search import Hypothesis, beam_search, greedy_search, max_output_len

log = logging.getLogger(__name__)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Translation(NamedTuple):
    text: str
    score: float  # log-probability with EOS / (tokens + 1) ** length_penalty (seq2seq.search)


class Translator:
    """Load once, translate many: `Translator.from_checkpoint(path).translate(lines)`.

    Text handling (normalisation, SentencePiece, long inputs, empty lines, batches) is here;
    `decode` turns source ids into n-best target ids with our search. CTranslate2Translator
    (seq2seq.deployed) decodes with an exported model instead.
    """

    backend = "seq2seq"  # what decodes: in evaluate's scores

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        decoding: DecodingConfig | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.decoding = decoding or group_config("decoding/beam", DecodingConfig)
        self.device = torch.device(device)
        self.max_len = model.config.max_len  # positions, source EOS included

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, decoding: DecodingConfig | None = None, device: str = "cpu"
    ) -> Translator:
        """A checkpoint (.ckpt), or a directory written by seq2seq.export (CTranslate2)."""
        return load_translator(Path(path), decoding, device)[0]

    def translate(self, lines: list[str], where: str = "input", first_line: int = 1) -> list[str]:
        """One output per input line, in order; an empty line gives an empty line.

        A line longer than the model's positions is truncated with a warning, or raises
        (decoding.long_inputs=error); messages name it as `where`, line `first_line` + i.
        """
        return [best.text for best, *_ in self.translate_nbest(lines, where, first_line)]

    def translate_nbest(
        self, lines: list[str], where: str = "input", first_line: int = 1
    ) -> list[list[Translation]]:
        """`decoding.nbest` translations per input line, best first, with their scores; an
        empty line gives as many empty translations, scored 0 (nothing is decoded)."""
        ids = self.source_ids(lines, where, first_line)
        empty = [Translation("", 0.0)] * self.decoding.nbest
        outputs = [empty] * len(lines)
        todo = sorted((i for i, seq in enumerate(ids) if seq), key=lambda i: len(ids[i]))
        size = self.decoding.batch_size
        for start in range(0, len(todo), size):
            chunk = todo[start : start + size]
            for i, hypotheses in zip(chunk, self.decode([ids[i] for i in chunk]), strict=True):
                texts = self.tokenizer.decode_tgt([h.tokens for h in hypotheses])
                outputs[i] = [
                    Translation(t, h.score) for t, h in zip(texts, hypotheses, strict=True)
                ]
        return outputs

    def source_ids(self, lines: list[str], where: str, first_line: int) -> list[list[int]]:
        """SentencePiece ids of the normalised lines, each within the model's positions."""
        ids = self.tokenizer.encode_src([normalize(line) for line in lines])
        limit = self.max_len - 1  # room for EOS
        for number, seq in enumerate(ids, start=first_line):
            if len(seq) <= limit:
                continue
            if self.decoding.long_inputs == "error":
                raise DataError(
                    f"{where}, line {number}: {len(seq)} source tokens, more than the model's "
                    f"{limit} (model.max_len - 1); split the line, or set "
                    "decoding.long_inputs=truncate"
                )
            log.warning(
                "%s, line %d: %d source tokens, truncated to %d", where, number, len(seq), limit
            )
            del seq[limit:]
        return ids

    def source_batch(self, ids: list[list[int]]) -> torch.Tensor:
        """A batch of source ids as the model reads them: EOS appended, padded (B, S)."""
        return collate(
            [(i, np.asarray(seq), np.empty(0, dtype=np.int64)) for i, seq in enumerate(ids)]
        ).src

    def output_limits(self, src: torch.Tensor) -> torch.Tensor:
        """Per sentence of `src`, the output tokens allowed before EOS (decoding.max_len_*)."""
        d = self.decoding
        return max_output_len(src, d.max_len_a, d.max_len_b, self.max_len, self.tokenizer.pad_id)

    def decode(self, ids: list[list[int]]) -> list[list[Hypothesis]]:
        """Source ids (without EOS) -> the n-best target ids and scores of each."""
        return self.search(self.source_batch(ids))

    @torch.no_grad()
    def search(self, src: torch.Tensor) -> list[list[Hypothesis]]:
        decoding, model = self.decoding, self.model
        src = src.to(self.device)
        max_len = self.output_limits(src)
        if decoding.beam_size == 1:
            return greedy_search(model, src, max_len, decoding.length_penalty)
        return beam_search(
            model, src, max_len, decoding.beam_size, decoding.length_penalty, decoding.nbest
        )


def load_translator(
    path: Path, decoding: DecodingConfig | None, device: str
) -> tuple[Translator, RootConfig | None]:
    """The translator of a checkpoint or an export directory, and the training configuration
    it carries (None for an export made without one)."""
    if path.is_dir():
        from seq2seq.deployed import CTranslate2Translator  # ctranslate2 is an optional extra

        translator = CTranslate2Translator(path, decoding, device)
        return translator, translator.training_config
    trained = load_trained(path)
    return Translator(trained.model, trained.tokenizer, decoding, device), trained.config
