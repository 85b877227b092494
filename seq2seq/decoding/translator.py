"""Translate text with a trained model: the Python API behind evaluate and translate.

from seq2seq.decoding import Translator   # also: from seq2seq.translator import Translator
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from seq2seq.config import RootConfig, group_config
from seq2seq.data.corpus import normalize
from seq2seq.data.directions import check_target, tag
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.backend import Backend, Request
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.ctranslate2_backend import CTranslate2Backend
from seq2seq.decoding.model_path import resolve_model
from seq2seq.decoding.torch_backend import TorchBackend
from seq2seq.errors import ConfigError, DataError
from seq2seq.model.transformer import Transformer

log = logging.getLogger(__name__)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Translation(NamedTuple):
    text: str
    score: float  # log-probability with EOS / (tokens + 1) ** length_penalty (decoding.search)


class DecodedTranslation(Translation):
    """A Translation that also keeps the target ids it was decoded to (without BOS and EOS;
    what the server draws attention over), and still unpacks as (text, score)."""

    def __new__(cls, text: str, score: float, tokens: list[int] | None = None):
        translation = super().__new__(cls, text, score)
        translation.tokens = tokens or []
        return translation


def load_backend(
    paths: str | Path | Sequence[str | Path], device: str | torch.device = "cpu"
) -> Backend:
    """The backend of a checkpoint (.ckpt: ours) or run directory (its final.ckpt), of a
    directory written by seq2seq.export (CTranslate2's), or of several checkpoints decoded as
    one ensemble (ours)."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    paths = [resolve_model(path) for path in paths]
    if len(paths) == 1 and paths[0].is_dir():
        return CTranslate2Backend(paths[0], device)
    for path in paths:
        if path.is_dir():
            raise ConfigError(
                f"{path} is an export directory, and CTranslate2 decodes one model at a time: "
                "an ensemble takes checkpoints (.ckpt)"
            )
    return TorchBackend.from_checkpoints(paths, device)


class Translator:
    """Load once, translate many: `Translator.from_checkpoint(path).translate(lines)`.

    The text handling (normalisation, SentencePiece, long inputs, empty lines, batches) is
    here, the same for every backend; the backend turns source ids into target ids.
    """

    def __init__(
        self,
        model: Transformer | Backend,
        tokenizer: Tokenizer,
        decoding: DecodingConfig | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        """`model`: a Transformer (decoded by our search on `device`) or a loaded backend."""
        if isinstance(model, Transformer):
            model = TorchBackend(model, tokenizer, device)
        self.backend: Backend = model
        self.tokenizer = tokenizer
        self.decoding = decoding or group_config("decoding/beam", DecodingConfig)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | Sequence[str | Path],
        decoding: DecodingConfig | None = None,
        device: str = "cpu",
    ) -> Translator:
        """A checkpoint (.ckpt) or run directory, a directory written by seq2seq.export
        (CTranslate2), or a list of checkpoints or run directories decoded as one ensemble."""
        backend = load_backend(path, device)
        return cls(backend, backend.tokenizer, decoding)

    @property
    def training_config(self) -> RootConfig | None:
        """The configuration of the run that trained the model, when recorded."""
        return self.backend.training_config

    def tag_id(self, target_lang: str | None = None) -> int | None:
        """The id of the tag that leads every source of a multilingual model: that of
        `target_lang`, or of decoding.target_lang when it is None, which such a model needs
        (directions.check_target); None for a one-direction model. Without the training
        config, the tag of the language asked for when one is, as the vocabulary holds it.
        Looked up on every call: a changed decoding.target_lang takes effect at once."""
        target_lang = target_lang or self.decoding.target_lang
        if self.training_config is not None:
            target_lang = check_target(self.training_config.data, target_lang)
        if target_lang is None:
            return None
        try:
            return self.tokenizer.piece_id(tag(target_lang))
        except KeyError:
            raise ConfigError(
                f"config key 'decoding.target_lang': '{target_lang}', and this model's "
                f"vocabulary has no {tag(target_lang)} tag: it is not a multilingual model "
                "writing that language"
            ) from None

    def translate(
        self,
        lines: list[str],
        where: str = "input",
        first_line: int = 1,
        prefixes: list[str] | None = None,
        constraints: list[list[str]] | None = None,
        *,
        target_lang: str | None = None,
    ) -> list[str]:
        """One output per input line, in order; an empty line gives an empty line.

        A line longer than the model's positions is truncated with a warning, or raises
        (decoding.long_inputs=error); messages name it as `where`, line `first_line` + i.
        `prefixes`: per line, text its translation must start with ("" for none);
        `constraints`: per line, phrases its translation must contain ([] for none).
        `target_lang`: the language a multilingual model writes (default decoding.target_lang).
        """
        nbest = self.translate_nbest(
            lines, where, first_line, prefixes, constraints, target_lang=target_lang
        )
        return [best.text for best, *_ in nbest]

    def translate_nbest(
        self,
        lines: list[str],
        where: str = "input",
        first_line: int = 1,
        prefixes: list[str] | None = None,
        constraints: list[list[str]] | None = None,
        *,
        numbers: Sequence[int] | None = None,
        target_lang: str | None = None,
    ) -> list[list[Translation]]:
        """`decoding.nbest` translations per input line, best first, with their scores; an
        empty line gives as many empty translations, scored 0 (nothing is decoded, and its
        prefix is not output either). `numbers`: each line's number, for lines that are not
        consecutive (the server's batches of several requests), instead of `first_line` + i:
        what messages name and what seeds a line's samples. `target_lang`: as in translate.

        A prefix is normalised as the input is and encoded with the target SentencePiece
        model; the output continues its pieces, so its text starts with the prefix's (the
        prefix itself where every character is in the vocabulary). Its tokens count in the
        reported score and the length, as in a teacher-forced score of the whole output; beam
        search ranks by the continuation (seq2seq.decoding.search.beam_search).

        Constraints are phrases each output must contain (seq2seq.decoding.constraints), each
        normalised and encoded like a prefix; an output that cannot contain them all within
        the length limit and beam is the best without, with a warning naming the line and
        the phrases it misses."""
        numbers = list(numbers or range(first_line, first_line + len(lines)))
        ids = self.source_ids(lines, where, numbers, target_lang)
        targets = self.prefix_ids(prefixes, len(lines))
        phrases = self.constraint_ids(constraints, len(lines), where, numbers)
        empty = [Translation("", 0.0)] * self.decoding.nbest
        outputs = [empty] * len(lines)
        todo = sorted((i for i, seq in enumerate(ids) if seq), key=lambda i: len(ids[i]))
        size = self.decoding.batch_size
        for start in range(0, len(todo), size):
            chunk = todo[start : start + size]
            requests = [Request(ids[i], numbers[i], targets[i], phrases[i]) for i in chunk]
            decoded = self.backend.decode(requests, self.decoding)
            for i, hypotheses in zip(chunk, decoded, strict=True):
                texts = self.tokenizer.decode_tgt([h.tokens for h in hypotheses])
                outputs[i] = [
                    DecodedTranslation(t, h.score, h.tokens)
                    for t, h in zip(texts, hypotheses, strict=True)
                ]
                if constraints and constraints[i]:
                    self.warn_unmet(constraints[i], outputs[i], where, numbers[i])
        return outputs

    def prefix_ids(self, prefixes: list[str] | None, lines: int) -> list[list[int]]:
        """Target ids of each line's prefix (none: empty)."""
        if prefixes is None:
            return [[] for _ in range(lines)]
        if len(prefixes) != lines:
            raise DataError(
                f"{len(prefixes)} prefixes for {lines} input lines: give one per line, "
                "an empty one for a line without"
            )
        return self.tokenizer.encode_tgt([normalize(p) for p in prefixes])

    def constraint_ids(
        self, constraints: list[list[str]] | None, lines: int, where: str, numbers: list[int]
    ) -> list[list[list[int]]]:
        """Target ids of each line's phrases (none: empty); an empty phrase is refused."""
        if constraints is None:
            return [[] for _ in range(lines)]
        if len(constraints) != lines:
            raise DataError(
                f"constraints for {len(constraints)} lines, {lines} input lines: give one "
                "list per line, an empty one for a line without"
            )
        encoded = []
        for number, phrases in zip(numbers, constraints, strict=True):
            if any(not normalize(p).strip() for p in phrases):
                raise DataError(
                    f"constraints of {where}, line {number}: an empty phrase; every phrase "
                    "needs a word"
                )
            encoded.append(self.tokenizer.encode_tgt([normalize(p) for p in phrases]))
        return encoded

    @staticmethod
    def warn_unmet(
        phrases: list[str], translations: list[Translation], where: str, number: int
    ) -> None:
        missing = sorted({p for t in translations for p in phrases if normalize(p) not in t.text})
        if missing:
            log.warning(
                "%s, line %d: no translation within the length limit and beam holds %s; raise "
                "decoding.beam_size (at least the phrases' tokens + 1) or decoding.max_len_b",
                where,
                number,
                ", ".join(repr(p) for p in missing),
            )

    def source_ids(
        self, lines: list[str], where: str, numbers: list[int], target_lang: str | None = None
    ) -> list[list[int]]:
        """SentencePiece ids of the normalised lines (numbered `numbers`), each within the
        model's positions, led by the tag of `target_lang` for a multilingual model."""
        ids = self.tokenizer.encode_src([normalize(line) for line in lines])
        tag_id = self.tag_id(target_lang)
        tagged = tag_id is not None
        limit = self.backend.max_len - 1 - tagged  # positions, less one for EOS and the tag
        for number, seq in zip(numbers, ids, strict=True):
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
        if tagged:  # an empty line stays empty: it is not decoded
            ids = [[tag_id, *seq] if seq else seq for seq in ids]
        return ids
