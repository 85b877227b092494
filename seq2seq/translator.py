"""Translate text with a trained model: the Python API behind evaluate and translate."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from seq2seq.checkpoint import load_trained
from seq2seq.config import DecodingConfig, group_config
from seq2seq.data.batching import collate
from seq2seq.data.corpus import normalize
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import DataError
from seq2seq.model.transformer import Transformer
from seq2seq.search import beam_search, greedy_search, max_output_len

log = logging.getLogger(__name__)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Translator:
    """Load once, translate many: `Translator.from_checkpoint(path).translate(lines)`."""

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

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, decoding: DecodingConfig | None = None, device: str = "cpu"
    ) -> Translator:
        trained = load_trained(Path(path))
        return cls(trained.model, trained.tokenizer, decoding, device)

    def translate(self, lines: list[str], where: str = "input", first_line: int = 1) -> list[str]:
        """One output per input line, in order; an empty line gives an empty line.

        A line longer than the model's positions is truncated with a warning, or raises
        (decoding.long_inputs=error); messages name it as `where`, line `first_line` + i.
        """
        ids = self.tokenizer.encode_src([normalize(line) for line in lines])
        limit = self.model.config.max_len - 1  # room for EOS
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
        outputs = [""] * len(lines)
        todo = sorted((i for i, seq in enumerate(ids) if seq), key=lambda i: len(ids[i]))
        size = self.decoding.batch_size
        for start in range(0, len(todo), size):
            chunk = todo[start : start + size]
            batch = collate([(i, np.asarray(ids[i]), np.empty(0, dtype=np.int64)) for i in chunk])
            texts = self.tokenizer.decode_tgt(self.search(batch.src))
            for i, text in zip(chunk, texts, strict=True):
                outputs[i] = text
        return outputs

    @torch.no_grad()
    def search(self, src: torch.Tensor) -> list[list[int]]:
        decoding, model = self.decoding, self.model
        src = src.to(self.device)
        max_len = max_output_len(
            src, decoding.max_len_a, decoding.max_len_b, model.config.max_len, model.pad_id
        )
        if decoding.beam_size == 1:
            return greedy_search(model, src, max_len)
        return beam_search(model, src, max_len, decoding.beam_size, decoding.length_penalty)
