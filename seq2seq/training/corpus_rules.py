"""The rules a corpus-derived recipe (derive_from_corpus) follows, by version (derive_rule):
what the raw counts and the subword lengths of the training split decide. Rule 2 grades word
dropout with the amount of text instead of a step at one size, keeps batches at most 4,096
tokens, spends a share of the clock on the warm-up however many updates the machine makes in
it, and past the largest corpus it was checked on keeps the settings of that corpus instead of
an unmeasured larger model. Rule 1, fitted on Multi30k alone,
stays selectable so that a run derived by it can be repeated and the two compared in one
sitting. Each constant's evidence is on its line; the measurements: docs/own_corpus.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

RULES = (1, 2)

# Both rules
VAL_SUBSET = 1000  # sentences each validation decodes, at most (greedy, every epoch)
WORDS_PER_PIECE = 85  # text per vocabulary entry: Multi30k's 667,000 words give its 8,000
# (Gowda and May 2020's frequency rule gives Multi30k 1,000 pieces: 7.8 val BLEU lower)
UPDATES_PER_EPOCH = 128  # batch size in tokens: about this many updates per epoch

# Rule 1
WARMUP_EPOCHS = 16  # warm-up in epochs of updates, capped at MAX_WARMUP
MAX_WARMUP = 2000  # an hour on a 2-core AVX2-only CPU holds ~4,500 Multi30k updates
# (fewer words than this, model size, dropout, word dropout); the middle row is Wu et al.
# 2021's Multi30k model
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

# Rule 2
SHALLOW_BELOW = MODEL_SIZES[0][0]  # words: rule 1's 3+3 layers below, Wu et al.'s 4+4 from here
CHECKED_WORDS = 850_000  # the largest corpus checked (Autshumato en->nso: 846,000 words)
WORD_DROPOUT = ((100_000, 0.1), (1_000_000, 0.0))  # Sennrich and Zhang 2019's 0.1, to 0 by 1M words
DROPOUT = 0.3  # Multi30k recipe: 0.95 val BLEU above 0.2; 0.4 on 10,000 pairs: 2.2 lower
ATTENTION_DROPOUT = 0.0  # 0.1 with ACTIVATION_DROPOUT 0.1 (Araabi and Monz 2020): 0.91 val lower
ACTIVATION_DROPOUT = 0.0  # (10,000-pair Multi30k sample, 20 minutes: docs/own_corpus.md)
LABEL_SMOOTHING = 0.1  # 0.2: 0.22 val BLEU lower on Multi30k, 0.4-0.8 on its 5k/10k samples
MAX_TOKENS = (2048, 4096)  # Multi30k recipe: 4,096 beat 8,192 by 0.71 val BLEU
WARMUP_RATIO = 0.25  # of the clock: Multi30k's 2,000 of 6,700-8,200 updates an hour
GREEDY_COST = 1.6  # a validated token's seconds / a trained token's (5,000-pair sample, 1 core)
VALIDATION_SHARE = 0.1  # of the clock: 5,000 pairs validated every 10th epoch, not each, +0.57


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
    val_tokens: float  # the lines one validation decodes: sum of the longer side + BOS/EOS


def round_to(value: float, step: float) -> float:
    return step * round(value / step)


def ceil_to(value: float, step: int) -> int:
    return step * math.ceil(value / step)


def graded(words: int, points: tuple[tuple[int, float], tuple[int, float]]) -> float:
    """From the first point's value at its words or fewer to the second's at its words or more,
    linear in log(words) between: no cliff at a corpus size."""
    (low, at_low), (high, at_high) = points
    share = (math.log(words) - math.log(low)) / (math.log(high) - math.log(low))
    return round(at_low + min(1.0, max(0.0, share)) * (at_high - at_low), 3)


def describe_size(size: dict[str, int]) -> str:
    return (
        f"{size['encoder_layers']}+{size['decoder_layers']} layers, width {size['d_model']}, "
        f"{size['heads']} heads, feed-forward {size['ffn_dim']}"
    )


def validation_sample(val_pairs: int) -> Setting:
    subset = VAL_SUBSET if val_pairs > 2 * VAL_SUBSET else 0
    return Setting(
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


def from_counts(words: int, val_pairs: int, rule: int) -> list[Setting]:
    """What the raw text decides: `words` on both sides of the training split."""
    by_rule = counts_rule_1 if rule == 1 else counts_rule_2
    return [vocabulary(words), *by_rule(words), validation_sample(val_pairs)]


def vocabulary(words: int) -> Setting:
    return Setting(
        "tokenizer.vocab_size",
        int(min(32_000, max(1_000, round_to(words / WORDS_PER_PIECE, 500)))),
        f"{words:,} words / {WORDS_PER_PIECE} per piece, to 500s: frequent pieces; small data, "
        "small vocabulary (Sennrich and Zhang 2019)",
    )


def counts_rule_1(words: int) -> list[Setting]:
    settings = []
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
    return settings


def counts_rule_2(words: int) -> list[Setting]:
    shallow = words < SHALLOW_BELOW
    size = MODEL_SIZES[0 if shallow else 1][1]  # rule 1's two measured sizes
    band = f"{words:,} words" + (
        f" (past the {CHECKED_WORDS:,} the rule was checked on: the settings of the largest)"
        if words > CHECKED_WORDS
        else ""
    )
    why_size = f"{band}: " + (
        f"fewer than {SHALLOW_BELOW:,}, " if shallow else f"{SHALLOW_BELOW:,} or more, "
    )
    settings = [
        Setting(f"model.{key}", value, why_size + describe_size(size))
        for key, value in {"name": "transformer_derived", **size}.items()
    ]
    (low, at_low), (high, _) = WORD_DROPOUT
    return settings + [
        Setting("model.dropout", DROPOUT, f"{band}: Wu et al. 2021, Araabi and Monz 2020"),
        Setting("model.attention_dropout", ATTENTION_DROPOUT, f"{band}: docs/own_corpus.md"),
        Setting("model.activation_dropout", ACTIVATION_DROPOUT, f"{band}: docs/own_corpus.md"),
        Setting("optim.label_smoothing", LABEL_SMOOTHING, f"{band}: docs/own_corpus.md"),
        Setting(
            "model.token_replacement",
            graded(words, WORD_DROPOUT),
            f"{band}: word dropout {at_low} at {low:,} words or fewer, to 0 at {high:,} "
            "(Sennrich and Zhang 2019), linear in log(words)",
        ),
    ]


def from_lengths(
    lengths: SubwordLengths, max_ratio: float, rule: int, budget: bool = True
) -> list[Setting]:
    """What the subword lengths decide. `max_ratio`: data.filter.max_ratio; `budget`: whether
    the run has one (trainer.max_time or max_steps) for rule 2's warm-up to be a share of;
    without one, the warm-up is rule 1's, in epochs."""
    p999 = float(np.percentile(lengths.longer_side, 99.9))
    filter_len = min(512, max(128, ceil_to(1.5 * p999, 32)))
    model_len = min(1024, max(256, ceil_to(max(filter_len, lengths.val_longest) + 2, 64)))
    ratio = float(np.percentile(lengths.ratio, 99)) if len(lengths.ratio) else 1.0
    len_a = min(max_ratio, max(1.5, math.ceil(10 * ratio) / 10))
    epoch = lengths.tokens_per_epoch
    smallest, largest = (2048, 8192) if rule == 1 else MAX_TOKENS
    max_tokens = int(min(largest, max(smallest, 2 ** round(math.log2(epoch / UPDATES_PER_EPOCH)))))
    settings = [
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
            f"to a power of 2 in [{smallest:,}, {largest:,}]: smaller batches for smaller data",
        ),
    ]
    if rule == 2:
        settings.append(validation_interval(lengths))
    if rule == 1 or not budget:
        updates = epoch / max_tokens
        warmup = int(min(MAX_WARMUP, max(500, round_to(WARMUP_EPOCHS * updates, 100))))
        return settings + [
            Setting(
                "optim.warmup_steps",
                warmup,
                f"{WARMUP_EPOCHS} epochs of ~{updates:,.0f} updates, to 100s, in "
                f"[500, {MAX_WARMUP}]",
            )
        ]
    return settings + [
        Setting(
            "optim.warmup_ratio",
            WARMUP_RATIO,
            "the warm-up's share of the clock, however many updates this machine makes in it",
        )
    ]


def validation_interval(lengths: SubwordLengths) -> Setting:
    """Validate every n epochs, so that greedy validation is at most VALIDATION_SHARE of the
    clock: on a small corpus one pass over the validation lines costs a large part of an epoch."""
    cost = GREEDY_COST * lengths.val_tokens / lengths.tokens_per_epoch  # in epochs of training
    every = max(1, math.ceil((1 - VALIDATION_SHARE) / VALIDATION_SHARE * cost))
    return Setting(
        "trainer.check_val_every_n_epoch",
        every,
        f"a greedy validation of {lengths.val_tokens:,.0f} tokens costs ~{cost:.2f} epochs of "
        f"training: at most {VALIDATION_SHARE:.0%} of the clock",
    )
