"""A recipe for any corpus (`derive_from_corpus=true`): the settings that should follow from the
training data, derived from its counts by the one rule below, logged with their reasons at start
and saved in the run's config.yaml like any other setting.

Two steps, because the vocabulary has to be chosen before SentencePiece is trained:
1. from the raw text's counts (seq2seq.data.corpus_counts): the vocabulary, the model's size,
   dropout, and how much of the validation split each validation decodes;
2. from the subword lengths of the encoded text (a sample of the training pairs, and the
   validation split): length limits, the batch size in tokens and the warm-up.
The schedule's length is the clock's (trainer.max_time), not the corpus's: how many updates an
hour holds depends on the CPU. A key given on the command line keeps its value. The rule follows
the small-data findings of Sennrich and Zhang 2019 (smaller vocabularies, aggressive dropout,
word dropout, smaller batches) and Araabi and Monz 2020 (narrow, shallow Transformers), and gives
Multi30k the settings chosen for it on validation (multi30k_cpu_1h_tuned). Evidence:
docs/results.md#corpus_cpu_1h.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from seq2seq.config import RootConfig, config_to_dict, validate_config
from seq2seq.data.corpus import SplitPaths, ensure_available, iter_parallel, normalize
from seq2seq.data.corpus_counts import CorpusCounts, load_or_count
from seq2seq.data.datamodule import load_or_train_tokenizer, writable_dir
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.validation_sample import sample_indices
from seq2seq.errors import DataError
from seq2seq.io import sha256_file

log = logging.getLogger(__name__)

LENGTH_SAMPLE = 20_000  # training pairs encoded to measure subword lengths (seeded sample)
WORDS_PER_PIECE = 85  # text per vocabulary entry: Multi30k's 667,000 words give its 8,000
UPDATES_PER_EPOCH = 128  # batch size in tokens: about this many updates per epoch
WARMUP_EPOCHS = 16  # warm-up in epochs of updates, capped at MAX_WARMUP
MAX_WARMUP = 2000  # an hour on a 2-core AVX2-only CPU holds ~4,500 Multi30k updates
VAL_SUBSET = 1000  # sentences each validation decodes, at most (greedy, every epoch)

# (fewer words than this, model size, dropout, word dropout): small data, small models, more
# regularisation; the middle row is Wu et al. 2021's Multi30k model
MODEL_SIZES = [
    (
        300_000,
        dict(d_model=128, heads=4, encoder_layers=3, decoder_layers=3, ffn_dim=256),
        0.3,
        0.1,
    ),
    (
        3_000_000,
        dict(d_model=128, heads=4, encoder_layers=4, decoder_layers=4, ffn_dim=256),
        0.3,
        0.0,
    ),
    (
        math.inf,
        dict(d_model=256, heads=4, encoder_layers=6, decoder_layers=6, ffn_dim=1024),
        0.1,
        0.0,
    ),
]


@dataclass(frozen=True)
class Setting:
    key: str  # dotted config key
    value: Any
    reason: str


@dataclass(frozen=True)
class SubwordLengths:
    """Subword lengths of the encoded text, without BOS/EOS."""

    longer_side: np.ndarray  # training sample: each pair's longer side
    ratio: np.ndarray  # training sample: target / source length, sources of 5+ tokens
    tokens_per_epoch: float  # training split: sum over pairs of the longer side + BOS/EOS
    val_longest: int  # validation split: the longest side

    @classmethod
    def measure(
        cls,
        tokenizer: Tokenizer,
        train: list[tuple[str, str]],
        train_pairs: int,
        val: list[tuple[str, str]],
    ) -> SubwordLengths:
        """`train`: a sample of `train_pairs` training pairs; `val`: the validation split."""
        src = np.array([len(x) for x in tokenizer.encode_src([normalize(s) for s, _ in train])])
        tgt = np.array([len(x) for x in tokenizer.encode_tgt([normalize(t) for _, t in train])])
        longer = np.maximum(src, tgt)
        real = (src > 0) & (tgt > 0)
        long_enough = src >= 5
        val_src = tokenizer.encode_src([normalize(s) for s, _ in val])
        val_tgt = tokenizer.encode_tgt([normalize(t) for _, t in val])
        return cls(
            longer_side=longer[real],
            ratio=tgt[long_enough] / src[long_enough],
            tokens_per_epoch=float(np.mean(longer[real] + 2)) * train_pairs,
            val_longest=max(len(x) for x in [*val_src, *val_tgt]),
        )


def round_to(value: float, step: float) -> float:
    return step * round(value / step)


def ceil_to(value: float, step: int) -> int:
    return step * math.ceil(value / step)


def from_counts(counts: CorpusCounts, val_pairs: int) -> list[Setting]:
    """Step 1: what the raw text decides."""
    words = counts.words
    vocab = int(min(32_000, max(1_000, round_to(words / WORDS_PER_PIECE, 500))))
    settings = [
        Setting(
            "tokenizer.vocab_size",
            vocab,
            f"{words:,} words / {WORDS_PER_PIECE} per piece, to 500s: frequent pieces; small "
            "data, small vocabulary (Sennrich and Zhang 2019)",
        )
    ]
    limit, size, dropout, word_dropout = next(row for row in MODEL_SIZES if words < row[0])
    band = f"{words:,} words, " + (
        f"fewer than {limit:,.0f}" if limit < math.inf else f"{MODEL_SIZES[-2][0]:,} or more"
    )
    for key, value in {"name": "transformer_derived", **size}.items():
        settings.append(Setting(f"model.{key}", value, f"{band}: {describe_size(size)}"))
    settings.append(Setting("model.dropout", dropout, f"{band} (Araabi and Monz 2020: 0.3)"))
    settings.append(
        Setting(
            "model.token_replacement",
            word_dropout,
            f"{band}: word dropout for the smallest corpora only (Sennrich and Zhang 2019)",
        )
    )
    subset = VAL_SUBSET if val_pairs > 2 * VAL_SUBSET else 0
    settings.append(
        Setting(
            "data.val_subset",
            subset,
            f"{val_pairs:,} validation pairs: "
            + (
                f"a seeded sample of {VAL_SUBSET:,} each epoch keeps validation a small share of "
                "the hour (the final checkpoint is chosen on it too, with beam 5)"
                if subset
                else f"all of them (a sample of {VAL_SUBSET:,} only above {2 * VAL_SUBSET:,})"
            ),
        )
    )
    return settings


def describe_size(size: dict[str, int]) -> str:
    return (
        f"{size['encoder_layers']}+{size['decoder_layers']} layers, width {size['d_model']}, "
        f"{size['heads']} heads, feed-forward {size['ffn_dim']}"
    )


def from_lengths(lengths: SubwordLengths, max_ratio: float) -> list[Setting]:
    """Step 2: what the subword lengths decide. `max_ratio`: data.filter.max_ratio."""
    p999 = float(np.percentile(lengths.longer_side, 99.9))
    filter_len = min(512, max(128, ceil_to(1.5 * p999, 32)))
    model_len = min(1024, max(256, ceil_to(max(filter_len, lengths.val_longest) + 2, 64)))
    ratio = float(np.percentile(lengths.ratio, 99)) if len(lengths.ratio) else 1.0
    len_a = min(max_ratio, max(1.5, math.ceil(10 * ratio) / 10))
    epoch = lengths.tokens_per_epoch
    max_tokens = int(min(8192, max(2048, 2 ** round(math.log2(epoch / UPDATES_PER_EPOCH)))))
    updates = epoch / max_tokens
    warmup = int(min(MAX_WARMUP, max(500, round_to(WARMUP_EPOCHS * updates, 100))))
    return [
        Setting(
            "data.filter.max_len",
            filter_len,
            f"1.5 x the 99.9th percentile of a training pair's longer side ({p999:.0f} "
            "tokens), to 32s, in [128, 512]",
        ),
        Setting(
            "model.max_len",
            model_len,
            f"positions for the filter's pairs and the longest validation line "
            f"({lengths.val_longest} tokens) with BOS/EOS, to 64s, in [256, 1024]",
        ),
        Setting(
            "decoding.max_len_a",
            len_a,
            f"99th percentile of target/source length ({ratio:.2f}), at least 1.5, at most "
            "data.filter.max_ratio: outputs as long as the references",
        ),
        Setting(
            "data.max_tokens",
            max_tokens,
            f"{epoch:,.0f} tokens an epoch (longer side + BOS/EOS) / {UPDATES_PER_EPOCH} updates, "
            "to a power of 2 in [2048, 8192]: smaller batches for smaller data",
        ),
        Setting(
            "optim.warmup_steps",
            warmup,
            f"{WARMUP_EPOCHS} epochs of ~{updates:,.0f} updates, to 100s, in [500, {MAX_WARMUP}]",
        ),
    ]


def vocabulary_the_text_allows(
    config: RootConfig, train: SplitPaths, digest: dict[Path, str], cache_dir: Path, fixed: set[str]
) -> tuple[Tokenizer, RootConfig, Setting | None]:
    """The tokenizer of the derived vocabulary, or of the largest SentencePiece allows for a text
    too small for it (with the setting that says so); a vocabulary set on the command line is
    left to fail with SentencePiece's message."""
    try:
        tokenizer, _ = load_or_train_tokenizer(config, train, digest, cache_dir)
        return tokenizer, config, None
    except DataError as error:
        largest = re.search(r"value <= (\d+)", str(error))
        if largest is None or "tokenizer.vocab_size" in fixed:
            raise
    derived = config.tokenizer.vocab_size
    capped = Setting(
        "tokenizer.vocab_size",
        int(largest.group(1)),
        f"the most pieces SentencePiece can make of this text (the rule gave {derived:,})",
    )
    config = apply(config, [capped], fixed)
    tokenizer, _ = load_or_train_tokenizer(config, train, digest, cache_dir)
    return tokenizer, config, capped


def length_sample(train: SplitPaths, pairs: int) -> list[tuple[str, str]]:
    """A seeded sample of LENGTH_SAMPLE training pairs (all when fewer), read in one pass."""
    if pairs <= LENGTH_SAMPLE:
        return list(iter_parallel(train))
    chosen = set(sample_indices(pairs, LENGTH_SAMPLE).tolist())  # the same in every process
    return [pair for i, pair in enumerate(iter_parallel(train)) if i in chosen]


def command_line_keys() -> set[str]:
    """The keys the command line sets (Hydra's task overrides): they keep their values."""
    if not HydraConfig.initialized():
        return set()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def apply(config: RootConfig, settings: Iterable[Setting], fixed: set[str]) -> RootConfig:
    """The config with `settings`, except keys in `fixed`; checked again like any config."""
    tree = OmegaConf.create(config_to_dict(config))
    for setting in settings:
        if setting.key not in fixed:
            OmegaConf.update(tree, setting.key, setting.value, merge=False)
    return validate_config(tree)


def report(
    counts: CorpusCounts, settings: list[Setting], config: RootConfig, fixed: set[str]
) -> str:
    """The derived settings, those with one reason on one line; command-line ones marked."""
    tree = OmegaConf.create(config_to_dict(config))
    lines = [f"derive_from_corpus: training split {counts.describe()}"]
    for reason, group in itertools.groupby(settings, key=lambda s: s.reason):
        values = []
        for setting in group:
            if setting.key in fixed:
                value = OmegaConf.select(tree, setting.key)
                values.append(f"{setting.key}={value} (command line)")
            else:
                values.append(f"{setting.key}={setting.value}")
        lines.append(f"  {' '.join(values)}: {reason}")
    return "\n".join(lines)


def derive(config: RootConfig, fixed: set[str] | None = None) -> RootConfig:
    """The config with the settings the training split decides (derive_from_corpus=true);
    `fixed`: keys that keep their values (default: those the command line sets). The same
    files give the same settings in every process of a run and on every resume."""
    if not config.derive_from_corpus:
        return config
    fixed = command_line_keys() if fixed is None else fixed
    data = config.data
    cache_dir = writable_dir(Path(config.paths.cache_dir), "paths.cache_dir")
    train, val = ensure_available(data, [data.train_split, data.val_split])
    digest = {path: sha256_file(path) for split in (train, val) for path in split.files}
    counts = load_or_count(cache_dir, train, digest)
    val_pairs = list(iter_parallel(val))
    settings = from_counts(counts, len(val_pairs))
    config = apply(config, settings, fixed)
    tokenizer, config, capped = vocabulary_the_text_allows(config, train, digest, cache_dir, fixed)
    if capped is not None:
        settings[0] = capped
    lengths = SubwordLengths.measure(
        tokenizer, length_sample(train, counts.pairs), counts.pairs, val_pairs
    )
    step2 = from_lengths(lengths, config.data.filter.max_ratio)
    config = apply(config, step2, fixed)
    log.info("%s", report(counts, settings + step2, config, fixed))
    return config
