"""BLEU of a system against a baseline on the same test sentences: sacreBLEU's paired bootstrap
resampling test, with the confidence interval of the difference.

sacreBLEU (`sacrebleu.significance.PairedTest`, `test_type="bs"`) gives the p-value and each
system's 95% confidence interval. It does not give the interval of the difference, so that is
taken from the same resamples: sacreBLEU draws them as `default_rng(seed).choice(n, (samples,
n))` with its seed (SACREBLEU_SEED, 12345 by default); the same draw here gives the same
resampled test sets, on which both systems' BLEU is computed from sacreBLEU's sufficient
statistics, and the interval is the 2.5th and 97.5th percentiles of their difference. That the
resamples are the same is checked: the mean of the system's resampled BLEU must equal the one
sacreBLEU reports.

A multilingual model is compared on the mean BLEU of its directions (paired_bootstrap_mean):
each direction's test set is resampled on its own, the same resamples for both systems, and
the p-value is sacreBLEU's, computed on the resampled means.

One exception to sacreBLEU's p-value: it counts resamples whose difference is strictly above
the observed one, so two identical systems (observed difference 0) get p = 1 / (samples + 1),
"significant". Identical hypotheses have nothing to test, and get p = 1.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

SAMPLES = 1000  # sacreBLEU's default number of bootstrap resamples


@dataclass
class Comparison:
    baseline: float  # corpus BLEU
    system: float
    p_value: float  # sacreBLEU's paired bootstrap (1.0 for identical hypotheses)
    baseline_ci: float  # half-width of the 95% interval around the resampled mean, sacreBLEU's
    system_ci: float
    difference_ci: tuple[float, float]  # 95% interval of system - baseline, same resamples

    @property
    def difference(self) -> float:
        return self.system - self.baseline


def resampled_bleu(
    metric: BLEU, hypotheses: list[str], references: list[str], indices: np.ndarray
) -> np.ndarray:
    """Corpus BLEU of each resampled test set (rows of `indices`), from sufficient statistics."""
    stats = np.array(metric._extract_corpus_statistics(hypotheses, [references]), dtype="float32")
    return np.array([metric._compute_score_from_stats(s.sum(0)).score for s in stats[indices]])


def paired_bootstrap(
    baseline: list[str], system: list[str], references: list[str], samples: int = SAMPLES
) -> Comparison:
    """sacreBLEU's paired bootstrap test of `system` against `baseline` (module docstring)."""
    if not len(baseline) == len(system) == len(references):
        raise ValueError(
            f"{len(baseline)} baseline, {len(system)} system and {len(references)} reference "
            "lines: a paired test needs the same test sentences"
        )
    test = PairedTest(
        [("baseline", baseline), ("system", system)],
        {"BLEU": BLEU()},
        [references],
        test_type="bs",
        n_samples=samples,
    )
    _, results = test()
    base, other = results["BLEU"]
    indices = np.random.default_rng(test._seed).choice(
        len(system), size=(samples, len(system)), replace=True
    )
    metric = BLEU()
    base_scores = resampled_bleu(metric, baseline, references, indices)
    system_scores = resampled_bleu(metric, system, references, indices)
    if not math.isclose(system_scores.mean(), other.mean, abs_tol=1e-6):
        raise RuntimeError(
            "the resamples differ from sacreBLEU's (mean resampled BLEU "
            f"{system_scores.mean():.6f} against its {other.mean:.6f}): this sacreBLEU draws "
            "them in another way; update seq2seq/analysis/significance.py"
        )
    differences = system_scores - base_scores
    low, high = np.percentile(differences, [2.5, 97.5])
    return Comparison(
        baseline=base.score,
        system=other.score,
        p_value=1.0 if system == baseline else other.p_value,
        baseline_ci=float(base.ci),
        system_ci=float(other.ci),
        difference_ci=(float(low), float(high)),
    )


@dataclass
class MeanComparison:
    baseline: float  # mean of the sets' corpus BLEU
    system: float
    p_value: float  # paired bootstrap of the mean (module docstring)

    @property
    def difference(self) -> float:
        return self.system - self.baseline


def paired_bootstrap_mean(
    baselines: list[list[str]],
    systems: list[list[str]],
    references: list[list[str]],
    samples: int = SAMPLES,
) -> MeanComparison:
    """The paired bootstrap test of `systems` against `baselines` on the mean BLEU of several
    test sets (module docstring): for one set, sacreBLEU's own draws and p-value."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")  # as sacreBLEU's PairedTest reads it
    rng = np.random.default_rng(None if seed.lower() == "none" else int(seed))
    metric = BLEU()
    observed, resampled = np.zeros(2), np.zeros((2, samples))
    for base, system, refs in zip(baselines, systems, references, strict=True):
        indices = rng.choice(len(refs), size=(samples, len(refs)), replace=True)
        for row, hypotheses in enumerate((base, system)):
            observed[row] += metric.corpus_score(hypotheses, [refs]).score / len(references)
            resampled[row] += resampled_bleu(metric, hypotheses, refs, indices) / len(references)
    differences = np.abs(resampled[1] - resampled[0])
    beyond = np.sum(differences - differences.mean() > abs(observed[1] - observed[0])).item()
    p_value = 1.0 if systems == baselines else (beyond + 1) / (samples + 1)
    return MeanComparison(float(observed[0]), float(observed[1]), p_value)
