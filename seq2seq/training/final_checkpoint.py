"""The checkpoint a run ends with: the preferred candidate unless another one scores higher.

Every candidate is scored as the test sets will be: the run's decoding settings (beam search)
on the validation split, in fp32, by the same Translator that `evaluate` uses. In-training
validation (greedy, training precision) cannot decide between them: in one Multi30k run
best.ckpt led the average by 0.16 greedy validation BLEU and trailed it by 1.18 test BLEU.
Differences that small are noise on a 1,014-sentence set, so the preferred candidate
(`prefer_checkpoint`) is kept unless another one scores higher and sacreBLEU's paired bootstrap
gives p < 0.05 (`SIGNIFICANCE`); of several such, the highest-scoring replaces it.
Candidates holding the same weights (the best epoch is often the last, so best.ckpt holds the
weights of last.ckpt) are decoded once and recorded as the same. A multilingual model is scored
on the mean BLEU of its directions' validation sets, and tested on that mean
(significance.paired_bootstrap_mean: each set resampled on its own).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from seq2seq.analysis.significance import paired_bootstrap, paired_bootstrap_mean
from seq2seq.decoding.checkpoint import TrainedModel, load_trained
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator, default_device
from seq2seq.metrics import bleu

log = logging.getLogger(__name__)

SIGNIFICANCE = 0.05  # another candidate replaces the preferred one only below this p-value


@dataclass(frozen=True)
class ValidationSet:
    """What candidates are scored on: a validation split's sources and references, and for a
    multilingual model its direction's name and the language asked for."""

    sources: list[str]
    references: list[str]
    name: str = ""
    target_lang: str | None = None


@dataclass
class FinalChoice:
    """The checkpoint chosen, and what it was chosen on (run_summary.json records it)."""

    chosen: str  # averaged | best | last
    path: Path
    reason: str
    val_bleu: dict[str, float] = field(default_factory=dict)  # candidate -> BLEU
    p_values: dict[str, float] = field(default_factory=dict)  # candidate -> p, against preferred
    same_weights: dict[str, str] = field(default_factory=dict)  # candidate -> the one it equals
    # a multilingual model's: candidate -> direction -> BLEU (val_bleu holds their mean)
    val_bleu_by_direction: dict[str, dict[str, float]] = field(default_factory=dict)

    def summary(self) -> dict:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "val_bleu": self.val_bleu,
            "p_values": self.p_values,
            "same_weights": self.same_weights,
            **(
                {"val_bleu_by_direction": self.val_bleu_by_direction}
                if self.val_bleu_by_direction
                else {}
            ),
        }


def decoding_description(decoding: DecodingConfig) -> str:
    return (
        f"beam {decoding.beam_size}, length penalty {decoding.length_penalty}"
        if decoding.beam_size > 1
        else "greedy"
    )


def translate(
    trained: TrainedModel, decoding: DecodingConfig, validation: ValidationSet
) -> list[str]:
    """The model's translations, as `evaluate` computes them (fp32, these settings)."""
    decoding = dataclasses.replace(decoding, target_lang=validation.target_lang)
    translator = Translator(trained.model, trained.tokenizer, decoding, default_device())
    return translator.translate(validation.sources)


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def decode_candidates(
    candidates: dict[str, Path], decoding: DecodingConfig, sets: list[ValidationSet]
) -> tuple[dict[str, list[list[str]]], dict[str, str]]:
    """Each candidate's translations of each set, and the candidates whose weights equal an
    earlier one's (decoded once, their translations shared). Each checkpoint is read once."""
    outputs, weights, twins = {}, {}, {}
    for name, path in candidates.items():
        trained = load_trained(path)
        weights[name] = trained.model.state_dict()
        twin = next(
            (other for other in outputs if same_weights(weights[other], weights[name])), None
        )
        if twin is None:
            outputs[name] = [translate(trained, decoding, s) for s in sets]
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


def replaces(
    preferred: list[list[str]], other: list[list[str]], sets: list[ValidationSet]
) -> tuple[bool, float]:
    """Whether `other` replaces the preferred outputs (module docstring), and the p-value."""
    references = [s.references for s in sets]
    if len(sets) == 1:
        comparison = paired_bootstrap(preferred[0], other[0], references[0])
    else:
        comparison = paired_bootstrap_mean(preferred, other, references)
    return comparison.difference > 0 and comparison.p_value < SIGNIFICANCE, comparison.p_value


def choose_final(
    candidates: dict[str, Path],
    prefer: str,
    decoding: DecodingConfig,
    sets: list[ValidationSet],
) -> FinalChoice:
    """The final checkpoint among `candidates` (averaged, best, last), `prefer` kept by default,
    scored on the mean BLEU of `sets` (one, or a multilingual model's directions')."""
    if len(candidates) == 1:
        ((name, path),) = candidates.items()
        reason = (
            "one candidate: no average (average_last < 2, or fewer than 2 epochs)"
            if name == "best"
            else "one candidate: no validation ran and no average"
        )
        return FinalChoice(name, path, reason)
    measure = f"validation BLEU, {decoding_description(decoding)}, fp32"
    if len(sets) > 1:
        measure = f"mean {measure} of {len(sets)} directions"
    outputs, twins = decode_candidates(candidates, decoding, sets)
    by_set = {
        name: [bleu(texts, s.references) for texts, s in zip(each, sets, strict=True)]
        for name, each in outputs.items()
    }
    scores = {name: round(sum(values) / len(values), 2) for name, values in by_set.items()}
    by_direction = {
        name: {s.name: round(v, 2) for s, v in zip(sets, values, strict=True)}
        for name, values in by_set.items()
        if len(sets) > 1
    }
    p_values, higher = {}, []
    for name in sorted(candidates.keys() - {prefer}):
        replaced, p_values[name] = replaces(outputs[prefer], outputs[name], sets)
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
    return FinalChoice(
        chosen, candidates[chosen], f"{measure}; {verdict}", scores, p_values, twins, by_direction
    )
