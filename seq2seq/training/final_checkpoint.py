"""The checkpoint a run ends with: the average of its last epochs, or its best epoch.

Both candidates are scored as the test sets will be: the run's decoding settings (beam search)
on the validation split, in fp32, by the same Translator that `evaluate` uses. In-training
validation (greedy, training precision) cannot decide between them: in issue 27's run
best.ckpt led the average by 0.16 greedy validation BLEU and trailed it by 1.18 test BLEU.
Differences that small are noise on a 1,014-sentence set, so the average is kept unless the
best epoch scores higher and sacreBLEU's paired bootstrap gives p < 0.05 (`SIGNIFICANCE`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from seq2seq.analysis.significance import paired_bootstrap
from seq2seq.config import DecodingConfig
from seq2seq.decoding.checkpoint import load_trained
from seq2seq.decoding.translator import Translator, default_device
from seq2seq.metrics import bleu

log = logging.getLogger(__name__)

SIGNIFICANCE = 0.05  # the best epoch replaces the average only below this p-value


@dataclass
class FinalChoice:
    """The checkpoint chosen, and what it was chosen on (run_summary.json records it)."""

    chosen: str  # averaged | best | last
    path: Path
    reason: str
    val_bleu: dict[str, float] = field(default_factory=dict)  # candidate -> BLEU
    p_value: float | None = None  # paired bootstrap, the other candidate against the average

    def summary(self) -> dict:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "val_bleu": self.val_bleu,
            "p_value": self.p_value,
        }


def decoding_description(decoding: DecodingConfig) -> str:
    return (
        f"beam {decoding.beam_size}, length penalty {decoding.length_penalty}"
        if decoding.beam_size > 1
        else "greedy"
    )


def translate(ckpt: Path, decoding: DecodingConfig, sources: list[str]) -> list[str]:
    """The checkpoint's translations, as `evaluate` computes them (fp32, these settings)."""
    trained = load_trained(ckpt)
    return Translator(trained.model, trained.tokenizer, decoding, default_device()).translate(
        sources
    )


def prefer_average(
    averaged: list[str], other: list[str], references: list[str]
) -> tuple[bool, float]:
    """Whether the average stays (module docstring), and the bootstrap's p-value."""
    comparison = paired_bootstrap(averaged, other, references)
    keep = comparison.difference <= 0 or comparison.p_value >= SIGNIFICANCE
    return keep, comparison.p_value


def choose_final(
    candidates: dict[str, Path],
    decoding: DecodingConfig,
    sources: list[str],
    references: list[str],
) -> FinalChoice:
    """The final checkpoint among `averaged` (if any) and `best` or `last`."""
    other = "best" if "best" in candidates else "last"
    if "averaged" not in candidates:
        reason = "one candidate: no average (average_last < 2, or fewer than 2 epochs)"
        return FinalChoice(other, candidates[other], reason)
    measure = f"validation BLEU, {decoding_description(decoding)}, fp32"
    outputs = {name: translate(candidates[name], decoding, sources) for name in ("averaged", other)}
    scores = {name: round(bleu(texts, references), 2) for name, texts in outputs.items()}
    keep, p_value = prefer_average(outputs["averaged"], outputs[other], references)
    chosen = "averaged" if keep else other
    verdict = (
        f"{other} higher with p < {SIGNIFICANCE}"
        if not keep
        else f"the average unless {other} is higher with p < {SIGNIFICANCE}"
    )
    log.info(
        "%s: averaged %.2f, %s %.2f (paired bootstrap p = %.3f): %s",
        measure,
        scores["averaged"],
        other,
        scores[other],
        p_value,
        chosen,
    )
    return FinalChoice(chosen, candidates[chosen], f"{measure}; {verdict}", scores, p_value)
