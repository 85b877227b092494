"""Minimum Bayes risk (MBR) reranking of n-best lists, scored against the beam's own first
choice: whether picking, from each sentence's candidates, the one that agrees most with the
others (Kumar and Byrne 2004) is a lever for corpus BLEU. A measurement, not a decoder: the
n-best lists come from `seq2seq.translate decoding.nbest=k`, whose lines are
`line number<TAB>score<TAB>text`, best first.

    python scripts/mbr_rerank.py --references val.de --first 5 run90.nbest run91.nbest

Each candidate's utility is its expected sentence score (sacreBLEU's sentence BLEU with
effective order, or chrF) against every candidate of the sentence as a pseudo-reference, itself
included, weighted uniformly or by the softmax of the model's scores (translate's, per token
when decoding.length_penalty is 1).
"""

import argparse
import json
import math
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF

from seq2seq.io import atomic_path
from seq2seq.metrics import corpus_scores


def read_nbest(path: Path) -> list[list[tuple[float, str]]]:
    """Each input line's (score, text) candidates, best first, in input order."""
    sentences: dict[int, list[tuple[float, str]]] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                sentence, score, text = line.rstrip("\n").split("\t")
                candidate = (float(score), text)
                key = int(sentence)
            except ValueError:
                raise SystemExit(
                    f"{path}:{number}: expected 'line<TAB>score<TAB>text' (seq2seq.translate "
                    f"with decoding.nbest > 1), got {line.rstrip()!r}"
                ) from None
            sentences.setdefault(key, []).append(candidate)
    return [sentences[key] for key in sorted(sentences)]


def weights(scores: list[float], weighted: bool) -> list[float]:
    if not weighted:
        return [1 / len(scores)] * len(scores)
    top = max(scores)
    exps = [math.exp(score - top) for score in scores]
    total = sum(exps)
    return [value / total for value in exps]


def mbr_choice(candidates: list[tuple[float, str]], utility: BLEU | CHRF, weighted: bool) -> str:
    texts = [text for _, text in candidates]
    probability = weights([score for score, _ in candidates], weighted)

    def expected(hypothesis: str) -> float:
        scores = (utility.sentence_score(hypothesis, [ref]).score for ref in texts)
        return sum(p * score for p, score in zip(probability, scores, strict=True))

    return max(texts, key=expected)  # the first of equals: the beam's order breaks ties


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("nbest", nargs="+", type=Path)
    parser.add_argument("--references", type=Path, required=True)
    parser.add_argument("--first", type=int, default=0, help="candidates kept (0: all)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    references = args.references.read_text(encoding="utf-8").splitlines()
    utilities = {"bleu": BLEU(effective_order=True), "chrf": CHRF()}
    results = {}
    for path in args.nbest:
        sentences = read_nbest(path)
        if len(sentences) != len(references):
            raise SystemExit(
                f"{path}: {len(sentences)} sentences, {args.references} has {len(references)} "
                "lines: give the references of the n-best lists' input"
            )
        if args.first:
            sentences = [candidates[: args.first] for candidates in sentences]
        picks = {"top1": [candidates[0][1] for candidates in sentences]}
        for name, utility in utilities.items():
            for weighted in (False, True):
                label = f"mbr_{name}_{'weighted' if weighted else 'uniform'}"
                picks[label] = [mbr_choice(c, utility, weighted) for c in sentences]
        row = {}
        for label, texts in picks.items():
            scores = corpus_scores(texts, references)
            row[label] = {"bleu": scores["bleu"], "chrf": scores["chrf"]}
        results[str(path)] = row
        print(path, "  ".join(f"{k} {v['bleu']:.2f}/{v['chrf']:.2f}" for k, v in row.items()))
    if args.json:
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
