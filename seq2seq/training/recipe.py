"""A recipe for any corpus (`derive_from_corpus=true`): the settings that should follow from the
training data, derived from its counts by the rule `derive_rule` names
(seq2seq.training.corpus_rules), logged with their reasons at start and saved in the run's
config.yaml like any other setting. A multilingual run's training data is all its directions'
together: their words summed, their joint vocabulary, their lengths pooled.

Two steps, because the vocabulary has to be chosen before SentencePiece is trained:
1. from the raw text's counts (seq2seq.data.corpus_counts): the vocabulary, the model's size,
   regularisation, and how much of the validation split each validation decodes;
2. from the subword lengths of the encoded text (a sample of the training pairs, and the
   validation split): length limits, the batch size in tokens, the warm-up and how often to
   validate.
The schedule's length is the clock's (trainer.max_time), not the corpus's: how many updates an
hour holds depends on the CPU. A key given on the command line keeps its value.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from seq2seq.config import RootConfig, config_to_dict, validate_config
from seq2seq.data.corpus import SplitPaths, ensure_available, iter_parallel, normalize
from seq2seq.data.corpus_counts import CorpusCounts, load_or_count
from seq2seq.data.datamodule import load_or_train_run_tokenizer, writable_dir
from seq2seq.data.directions import Direction, directions
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.validation_sample import sample_indices
from seq2seq.errors import DataError, require
from seq2seq.io import sha256_file
from seq2seq.training.corpus_rules import RULES, Setting, SubwordLengths, from_counts, from_lengths

log = logging.getLogger(__name__)

LENGTH_SAMPLE = 20_000  # training pairs encoded to measure subword lengths (seeded sample)


def measure_lengths(
    tokenizer: Tokenizer,
    train: list[tuple[str, str]],
    train_pairs: int,
    val: list[tuple[str, str]],
    validated: int,
    tagged: bool = False,
) -> SubwordLengths:
    """`train`: a sample of `train_pairs` training pairs; `val`: the validation split, of which
    each validation decodes `validated` lines; `tagged`: sources lead with a multilingual run's
    tag, one more position."""
    src = np.array([len(x) for x in tokenizer.encode_src([normalize(s) for s, _ in train])])
    tgt = np.array([len(x) for x in tokenizer.encode_tgt([normalize(t) for _, t in train])])
    real = (src > 0) & (tgt > 0)
    long_enough = src >= 5
    ratio = tgt[long_enough] / src[long_enough]  # of the text, tag or not
    longer = np.maximum(src + tagged, tgt)
    val_src = [len(x) + tagged for x in tokenizer.encode_src([normalize(s) for s, _ in val])]
    val_tgt = [len(x) for x in tokenizer.encode_tgt([normalize(t) for _, t in val])]
    val_longer = np.maximum(val_src, val_tgt)
    return SubwordLengths(
        longer_side=longer[real],
        ratio=ratio,
        tokens_per_epoch=float(np.mean(longer[real] + 2)) * train_pairs,
        val_longest=int(val_longer.max()),
        val_tokens=float(np.mean(val_longer + 2)) * validated,
    )


def pooled(parts: list[SubwordLengths]) -> SubwordLengths:
    """The lengths of several directions as one training split: a multilingual run's epoch holds
    all their pairs and each validation decodes each direction's lines."""
    return SubwordLengths(
        longer_side=np.concatenate([p.longer_side for p in parts]),
        ratio=np.concatenate([p.ratio for p in parts]),
        tokens_per_epoch=sum(p.tokens_per_epoch for p in parts),
        val_longest=max(p.val_longest for p in parts),
        val_tokens=sum(p.val_tokens for p in parts),
    )


def vocabulary_the_text_allows(
    config: RootConfig,
    trains: list[tuple[Direction, SplitPaths]],
    digest: dict[Path, str],
    cache_dir: Path,
    fixed: set[str],
) -> tuple[Tokenizer, RootConfig, Setting | None]:
    """The tokenizer of the derived vocabulary, or of the largest SentencePiece allows for a text
    too small for it (with the setting that says so); a vocabulary set on the command line is
    left to fail with SentencePiece's message."""
    try:
        tokenizer, _ = load_or_train_run_tokenizer(config, trains, digest, cache_dir)
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
    tokenizer, _ = load_or_train_run_tokenizer(config, trains, digest, cache_dir)
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


def describe_counts(counts: dict[str, CorpusCounts]) -> str:
    """The training split's counts, or each direction's of a multilingual run."""
    if len(counts) == 1:
        return f"training split {next(iter(counts.values())).describe()}"
    words = sum(c.words for c in counts.values())
    each = "; ".join(f"{name}: {c.describe()}" for name, c in counts.items())
    return f"training splits of {len(counts)} directions, {words:,} words in all; {each}"


def report(
    counts: dict[str, CorpusCounts],
    rule: int,
    settings: list[Setting],
    config: RootConfig,
    fixed: set[str],
) -> str:
    """The derived settings, those with one reason on one line; command-line ones marked."""
    tree = OmegaConf.create(config_to_dict(config))
    lines = [f"derive_from_corpus (rule {rule}): {describe_counts(counts)}"]
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
    rule = config.derive_rule
    require(
        rule in RULES, "derive_rule", f"{rule} is no rule; use one of {', '.join(map(str, RULES))}"
    )
    fixed = command_line_keys() if fixed is None else fixed
    cache_dir = writable_dir(Path(config.paths.cache_dir), "paths.cache_dir")
    runs = directions(config.data)
    found = [ensure_available(d.data, [d.data.train_split, d.data.val_split]) for d in runs]
    digest = {path: sha256_file(path) for splits in found for s in splits for path in s.files}
    trains = [(d, train) for d, (train, _) in zip(runs, found, strict=True)]
    counts = {d.name: load_or_count(cache_dir, train, digest) for d, train in trains}
    vals = [list(iter_parallel(val)) for _, val in found]
    words = sum(c.words for c in counts.values())
    settings = from_counts(words, max(map(len, vals)), rule)
    config = apply(config, settings, fixed)
    tokenizer, config, capped = vocabulary_the_text_allows(config, trains, digest, cache_dir, fixed)
    if capped is not None:
        settings[0] = capped
    tagged = config.data.multilingual
    lengths = pooled(
        [
            measure_lengths(
                tokenizer,
                length_sample(train, counts[d.name].pairs),
                counts[d.name].pairs,
                val,
                min(config.data.val_subset or len(val), len(val)),
                tagged,
            )
            for (d, train), val in zip(trains, vals, strict=True)
        ]
    )
    step2 = from_lengths(lengths, config.data.filter.max_ratio, rule, config.has_budget)
    config = apply(config, step2, fixed)
    log.info("%s", report(counts, rule, settings + step2, config, fixed))
    return config
