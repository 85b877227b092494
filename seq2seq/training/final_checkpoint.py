"""The checkpoint a run ends with: the preferred candidate unless another one scores higher.

Every candidate is scored as the test sets will be: the run's decoding settings (beam search)
on the validation split, in fp32, by the same Translator that `evaluate` uses. In-training
validation (greedy, training precision) cannot decide between them: in one Multi30k run
best.ckpt led the average by 0.16 greedy validation BLEU and trailed it by 1.18 test BLEU.
Differences that small are noise on a 1,014-sentence set, so the preferred candidate
(`prefer_checkpoint`) is kept unless another one scores higher and sacreBLEU's paired bootstrap
gives p < 0.05 (`SIGNIFICANCE`); of several such, the highest-scoring replaces it.
Candidates holding the same weights (the best epoch is often the last, so best.ckpt holds the
weights of last.ckpt) are decoded once and recorded as the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from seq2seq.analysis.significance import paired_bootstrap
from seq2seq.decoding.checkpoint import TrainedModel, load_trained
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator, default_device
from seq2seq.metrics import bleu

log = logging.getLogger(__name__)

SIGNIFICANCE = 0.05  # another candidate replaces the preferred one only below this p-value


@dataclass
class FinalChoice:
    """The checkpoint chosen, and what it was chosen on (run_summary.json records it)."""

    chosen: str  # averaged | best | last
    path: Path
    reason: str
    val_bleu: dict[str, float] = field(default_factory=dict)  # candidate -> BLEU
    p_values: dict[str, float] = field(default_factory=dict)  # candidate -> p, against preferred
    same_weights: dict[str, str] = field(default_factory=dict)  # candidate -> the one it equals

    def summary(self) -> dict:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "val_bleu": self.val_bleu,
            "p_values": self.p_values,
            "same_weights": self.same_weights,
        }


def decoding_description(decoding: DecodingConfig) -> str:
    return (
        f"beam {decoding.beam_size}, length penalty {decoding.length_penalty}"
        if decoding.beam_size > 1
        else "greedy"
    )


def translate(trained: TrainedModel, decoding: DecodingConfig, sources: list[str]) -> list[str]:
    """The model's translations, as `evaluate` computes them (fp32, these settings)."""
    return Translator(trained.model, trained.tokenizer, decoding, default_device()).translate(
        sources
    )


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def decode_candidates(
    candidates: dict[str, Path], decoding: DecodingConfig, sources: list[str]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each candidate's translations, and the candidates whose weights equal an earlier one's
    (decoded once, their translations shared). Each checkpoint is read once."""
    outputs, weights, twins = {}, {}, {}
    for name, path in candidates.items():
        trained = load_trained(path)
        weights[name] = trained.model.state_dict()
        twin = next(
            (other for other in outputs if same_weights(weights[other], weights[name])), None
        )
        if twin is None:
            outputs[name] = translate(trained, decoding, sources)
        else:
            outputs[name], twins[name] = outputs[twin], twin
    return outputs, twins


def gather_candidates(
    best: Path | None, last: Path, averaged: Path | None, prefer: str
) -> dict[str, Path]:
    """The checkpoints the rule chooses among: `best` (`last` stands in when no validation ran),
    `last` when it is the preferred one, and the average when there is one."""
    candidates = {"best": best} if best is not None else {}
    if prefer == "last" or best is None:
        candidates["last"] = last
    if averaged is not None:
        candidates["averaged"] = averaged
    return candidates


def replaces(preferred: list[str], other: list[str], references: list[str]) -> tuple[bool, float]:
    """Whether `other` replaces the preferred outputs (module docstring), and the p-value."""
    comparison = paired_bootstrap(preferred, other, references)
    return comparison.difference > 0 and comparison.p_value < SIGNIFICANCE, comparison.p_value


def choose_final(
    candidates: dict[str, Path],
    prefer: str,
    decoding: DecodingConfig,
    sources: list[str],
    references: list[str],
) -> FinalChoice:
    """The final checkpoint among `candidates` (averaged, best, last), `prefer` kept by default."""
    if len(candidates) == 1:
        ((name, path),) = candidates.items()
        reason = (
            "one candidate: no average (average_last < 2, or fewer than 2 epochs)"
            if name == "best"
            else "one candidate: no validation ran and no average"
        )
        return FinalChoice(name, path, reason)
    measure = f"validation BLEU, {decoding_description(decoding)}, fp32"
    outputs, twins = decode_candidates(candidates, decoding, sources)
    scores = {name: round(bleu(texts, references), 2) for name, texts in outputs.items()}
    p_values, higher = {}, []
    for name in sorted(candidates.keys() - {prefer}):
        replaced, p_values[name] = replaces(outputs[prefer], outputs[name], references)
        if replaced:
            higher.append(name)
    chosen = max(higher, key=scores.__getitem__, default=prefer)
    others = " or ".join(sorted(p_values))
    verdict = (
        f"{chosen} higher than {prefer} with p < {SIGNIFICANCE}"
        if chosen != prefer
        else f"{prefer} unless {others} is higher with p < {SIGNIFICANCE}"
    )
    log.info(
        "%s: %s: %s",
        measure,
        ", ".join(
            f"{name} {score:.2f}"
            + (f" (p = {p_values[name]:.3f})" if name in p_values else "")
            + (f" (the weights of {twins[name]})" if name in twins else "")
            for name, score in scores.items()
        ),
        chosen,
    )
    return FinalChoice(chosen, candidates[chosen], f"{measure}; {verdict}", scores, p_values, twins)
