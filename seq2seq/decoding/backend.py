"""What a Translator decodes with: a backend turns source ids into n-best target ids and scores.

Two backends: ours (`TorchBackend`: our search on a checkpoint's Transformer) and CTranslate2's
(`CTranslate2Backend`: an export directory). A third is one new module with a class of this
shape, and one line in `load_backend` (seq2seq.decoding.translator).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
import torch

from seq2seq.config import RootConfig
from seq2seq.data.batching import collate
from seq2seq.data.tokenizer import PAD_ID, Tokenizer
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.search import Hypothesis, max_output_len


class Request(NamedTuple):
    """One input line to decode."""

    source: list[int]  # source ids, without EOS, within the model's positions
    line: int  # its 1-based line number in the input: what a sentence's samples are seeded by
    prefix: list[int] = []  # target ids the output starts with (forced); none when empty
    constraints: list[list[int]] = []  # phrases (target ids) the output must contain


class Backend(Protocol):
    name: str  # what decodes, as evaluate's scores record it
    max_len: int  # the model's positions, source EOS included
    tokenizer: Tokenizer
    training_config: RootConfig | None  # of the run that trained it, when recorded

    def decode(self, requests: list[Request], decoding: DecodingConfig) -> list[list[Hypothesis]]:
        """`decoding.nbest` hypotheses per request, best first."""
        ...


def source_batch(ids: list[list[int]]) -> torch.Tensor:
    """A batch of source ids as the model reads them: EOS appended, padded (B, S)."""
    return collate(
        [(i, np.asarray(seq), np.empty(0, dtype=np.int64)) for i, seq in enumerate(ids)]
    ).src


def output_limits(src: torch.Tensor, decoding: DecodingConfig, max_len: int) -> torch.Tensor:
    """Per sentence of `src`, the output tokens allowed before EOS (decoding.max_len_*)."""
    return max_output_len(src, decoding.max_len_a, decoding.max_len_b, max_len, PAD_ID)
