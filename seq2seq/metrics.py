"""Corpus scores with sacreBLEU (Post 2018), each reported with its signature."""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Cased, detokenized BLEU with sacreBLEU's defaults (13a tokenization)."""
    return BLEU().corpus_score(hypotheses, [references]).score


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float | str]:
    """BLEU (cased, detokenized), chrF, and lowercased BLEU for comparison with papers.

    Papers on Multi30k often report BLEU on lowercased, tokenized text; sacreBLEU with
    lowercase=True and tokenize=13a on the detokenized text is the reproducible equivalent.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    cased, chrf = BLEU(), CHRF()
    lowercased = BLEU(lowercase=True, tokenize="13a")
    scores: dict[str, float | str] = {}
    for name, metric in (("bleu", cased), ("chrf", chrf), ("bleu_lc", lowercased)):
        scores[name] = round(metric.corpus_score(hypotheses, [references]).score, 2)
        scores[f"{name}_signature"] = str(metric.get_signature())
    return scores
