"""SentencePiece subword models for source and target, trained once and cached by content key."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from seq2seq.concurrency import build_lock
from seq2seq.data.config import TokenizerConfig
from seq2seq.data.directions import TAG
from seq2seq.errors import DataError
from seq2seq.io import atomic_dir

log = logging.getLogger(__name__)

# SentencePiece's max_sentence_length (left at its default, which the saved model records):
# longer lines are left out of its training
MAX_SENTENCE_BYTES = 4192

# The one place that fixes the special ids; the model and decoders read them from here.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


class Tokenizer:
    """Source and target SentencePiece models: one shared model when the vocabulary is joint."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, src_model: bytes, tgt_model: bytes) -> None:
        self.src_model, self.tgt_model = src_model, tgt_model
        self.src = spm.SentencePieceProcessor(model_proto=src_model)
        self.tgt = (
            self.src
            if tgt_model == src_model
            else spm.SentencePieceProcessor(model_proto=tgt_model)
        )
        for sp in (self.src, self.tgt):
            ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
            assert ids == (PAD_ID, UNK_ID, BOS_ID, EOS_ID), f"unexpected special ids {ids}"
        # a multilingual model's tags, in its joint vocabulary only: control symbols, or in a
        # tokenizer trained before they were, user-defined pieces, which text encodes to
        # unless each is spelled out in the ids of its characters instead
        pieces = range(self.src.vocab_size()) if self.joint else ()
        self.tag_ids = tuple(i for i in pieces if TAG.fullmatch(self.src.id_to_piece(i)))
        self.spelled_tags = {
            i: [self.src.piece_to_id(c) for c in self.src.id_to_piece(i)]
            for i in self.tag_ids
            if not self.src.is_control(i)
        }

    @property
    def joint(self) -> bool:
        return self.src_model == self.tgt_model

    @property
    def src_vocab_size(self) -> int:
        return self.src.vocab_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.vocab_size()

    @property
    def fingerprint(self) -> str:
        """Content hash of both models: a checkpoint records it to detect a vocabulary mismatch."""
        return hashlib.sha256(self.src_model + b"\0" + self.tgt_model).hexdigest()

    def encode_src(self, lines: list[str], num_threads: int = -1) -> list[list[int]]:
        """Ids of each line; `num_threads` -1: SentencePiece's choice (every core). A tag's
        text is text: never a tag's id."""
        return self.without_tags(self.src.encode(lines, num_threads=num_threads))

    def encode_tgt(self, lines: list[str], num_threads: int = -1) -> list[list[int]]:
        return self.without_tags(self.tgt.encode(lines, num_threads=num_threads))

    def without_tags(self, encoded: list[list[int]]) -> list[list[int]]:
        """`encoded` with each user-defined tag spelled out (none since tags are control
        symbols)."""
        if not self.spelled_tags:
            return encoded
        spelled = self.spelled_tags
        return [[i for piece in seq for i in spelled.get(piece, (piece,))] for seq in encoded]

    def piece_id(self, piece: str) -> int:
        """The source id of a piece the model holds whole (a tag, "<2de>")."""
        id_ = self.src.piece_to_id(piece)  # unknown: the id of <unk>
        if self.src.id_to_piece(id_) != piece:
            raise KeyError(piece)
        return id_

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return self.tgt.decode(ids)

    def sample_src(self, lines: list[str], dropout: float, seed: int) -> list[list[int]]:
        """A BPE-dropout segmentation of each line: ids that decode to the same text, each
        merge skipped with probability `dropout` (see sample_segmentations)."""
        return sample_segmentations(self.src, lines, dropout, seed)

    def sample_tgt(self, lines: list[str], dropout: float, seed: int) -> list[list[int]]:
        return sample_segmentations(self.tgt, lines, dropout, seed)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "src.model").write_bytes(self.src_model)
        (directory / "tgt.model").write_bytes(self.tgt_model)

    @classmethod
    def load(cls, directory: Path) -> Tokenizer:
        return cls((directory / "src.model").read_bytes(), (directory / "tgt.model").read_bytes())


def sample_segmentations(
    model: spm.SentencePieceProcessor, lines: list[str], dropout: float, seed: int
) -> list[list[int]]:
    """SentencePiece's subword sampling (for a BPE model, BPE-dropout with `alpha` = dropout).

    Each encoding thread's generator starts from SentencePiece's process-wide seed, which is
    set here: unseeded, every call after a tokenizer training (which sets it) would draw the
    same. One thread: several would each start from that seed and repeat each other's draws.
    The draw also depends on the process, so no seed replays it in another (tested).
    """
    spm.set_random_generator_seed(seed)
    return model.encode(lines, enable_sampling=True, alpha=dropout, num_threads=1)


def sample_sentences(sentences: Iterable[str], size: int, seed: int) -> list[str]:
    """`size` sentences drawn uniformly without replacement, kept in corpus order and the same
    for the same seed and text; all of them when there are no more than `size` (or size 0).

    Bottom-k sampling: each sentence gets a seeded random key and the `size` smallest keys are
    kept, so the text streams through in chunks and only the sample is held.
    """
    iterator = iter(sentences)
    if size == 0:
        return list(iterator)
    rng = np.random.default_rng(seed)
    sample: list[str] = []
    keys = np.empty(0)
    while chunk := list(itertools.islice(iterator, 1 << 16)):
        sample += chunk
        keys = np.concatenate([keys, rng.random(len(chunk))])
        if len(sample) > size:
            keep = np.sort(np.argpartition(keys, size)[:size])
            sample, keys = [sample[i] for i in keep], keys[keep]
    return sample


def balanced_sample(
    texts: dict[str, list[Callable[[], Iterable[str]]]], size: int, seed: int
) -> list[str]:
    """As many sentences of each language as of any other, for one SentencePiece model over
    several: each language's lines (those of its sources, chained) sampled to size / languages
    (sample_sentences; 0: all), and the smaller samples repeated, whole and then in part, up
    to the largest, so that a small language's pieces are not crowded out of the vocabulary."""
    share = max(1, size // len(texts)) if size else 0
    samples = [
        sample_sentences(itertools.chain.from_iterable(f() for f in sources), share, seed)
        for sources in texts.values()
    ]
    largest = max(len(sample) for sample in samples)
    balanced = []
    for sample in samples:
        rounds, rest = divmod(largest, len(sample))
        balanced += sample * rounds + (sample_sentences(sample, rest, seed) if rest else [])
    return balanced


def train_sentencepiece(
    lines: Iterable[str],
    cfg: TokenizerConfig,
    where: str = "the training text",
    tags: Sequence[str] = (),
) -> bytes:
    """Train on already-normalised lines; identity rule so that decode(encode(x)) == x.
    `tags` (a multilingual model's, "<2de>") become control symbols: pieces of their own that
    no text encodes to and that decode to nothing. SentencePiece's own errors come back as
    one message naming `where` and the likely cause."""
    model = io.BytesIO()
    spm.set_random_generator_seed(cfg.seed)
    try:
        _train(lines, model, cfg, tags)
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[-1].rsplit("]", 1)[-1].strip() or str(e)
        if "Vocabulary size" in str(e):
            raise DataError(
                f"{where} is too little text for tokenizer.vocab_size={cfg.vocab_size} "
                f"({reason}); lower tokenizer.vocab_size, or train on more text"
            ) from None
        if "sentences_.empty()" in str(e):
            reason = (
                "no sentence reached it: every line is empty or longer than SentencePiece's "
                f"{MAX_SENTENCE_BYTES} bytes (one sentence per line?)"
            )
        raise DataError(f"SentencePiece could not train on {where}: {reason}") from None
    return model.getvalue()


def _train(
    lines: Iterable[str], model: io.BytesIO, cfg: TokenizerConfig, tags: Sequence[str]
) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type=cfg.model_type,
        vocab_size=cfg.vocab_size,
        character_coverage=cfg.character_coverage,
        byte_fallback=cfg.byte_fallback,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        input_sentence_size=0,  # the sample is drawn before (sample_sentences)
        num_threads=cfg.num_threads,
        minloglevel=2,
        **({"control_symbols": list(tags)} if tags else {}),
    )


def _train_and_save(
    cfg: TokenizerConfig,
    inputs: dict[str, str],
    training_text: Callable[[tuple[str, ...]], list[str]],
    where: str,
    directory: Path,
    tags: Sequence[str],
) -> Tokenizer:
    start = time.perf_counter()
    if cfg.joint:
        text = training_text(("src", "tgt"))
        src_model = tgt_model = train_sentencepiece(text, cfg, where, tags)
    else:
        src_model = train_sentencepiece(training_text(("src",)), cfg, f"{where} (source side)")
        tgt_model = train_sentencepiece(training_text(("tgt",)), cfg, f"{where} (target side)")
    tokenizer = Tokenizer(src_model, tgt_model)
    with atomic_dir(directory) as tmp:
        tokenizer.save(tmp)
        (tmp / "settings.json").write_text(
            json.dumps({"settings": asdict(cfg), "inputs": inputs}, indent=2, sort_keys=True)
        )
    log.info(
        "trained tokenizer (%s, %d pieces, %s) in %.1fs -> %s",
        cfg.model_type,
        cfg.vocab_size,
        "joint" if cfg.joint else "one model per language",
        time.perf_counter() - start,
        directory,
    )
    return tokenizer


def tokenizer_key(cfg: TokenizerConfig, inputs: dict[str, Any], tags: Sequence[str] = ()) -> str:
    """Cache key from the settings, the training files' hashes and the library version."""
    payload = {"settings": asdict(cfg), "inputs": inputs, "sentencepiece": spm.__version__}
    if tags:  # absent otherwise: the keys of tokenizers trained before stay the same
        payload["control_symbols"] = list(tags)  # a new key: tags were user symbols before
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def load_or_train(
    cache_dir: Path,
    cfg: TokenizerConfig,
    inputs: dict[str, Any],
    training_text: Callable[[tuple[str, ...]], list[str]],
    where: str = "the training text",
    tags: Sequence[str] = (),
) -> tuple[Tokenizer, bool]:
    """Return the cached tokenizer for this key, or train and cache one. Also says if it trained.

    `inputs` identifies the training text (file hashes, languages, normalisation) and
    `training_text(sides)` returns the normalised sample of those sides ("src", "tgt") to train
    one model on, called only on a cache miss; errors name that text as `where`.
    `tags`: a multilingual model's, control symbols of a joint model (train_sentencepiece).
    """
    directory = cache_dir / "tokenizer" / tokenizer_key(cfg, inputs, tags)
    if (directory / "tgt.model").exists():
        return Tokenizer.load(directory), False
    with build_lock(directory):  # runs started together: one trains, the others wait
        if (directory / "tgt.model").exists():
            return Tokenizer.load(directory), False
        tokenizer = _train_and_save(cfg, inputs, training_text, where, directory, tags)
    return tokenizer, True
