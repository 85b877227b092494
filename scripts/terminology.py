"""Terminology: lexically constrained decoding on test sentences with phrases from their
references, against unconstrained beam search: BLEU, the share of phrases met, speed.

    python scripts/terminology.py --ckpt <run>/checkpoints/averaged.ckpt \
        [--sentences 200] [--beam 5] [--json FILE] [--data-dir ../shared/data]

The phrases, a fixed rule on each reference: its longest word (letters only, at least 4 of
them; the first on ties), and on every second line (1-based even) also the next longest
distinct one. A line without such a word gets none. Both runs decode the same sentences,
unconstrained first, in one process; run it alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.report import environment, write_json

from seq2seq.config import DecodingConfig, group_config
from seq2seq.data.corpus import read_parallel, split_paths
from seq2seq.decoding.translator import Translator
from seq2seq.evaluate import constraints_met
from seq2seq.metrics import corpus_scores

SET = "test_2016_flickr"


def phrases_of(reference: str, line: int) -> list[str]:
    """The module docstring's rule."""
    words = ["".join(c for c in word if c.isalpha()) for word in reference.split()]
    ordered = sorted(
        dict.fromkeys(w for w in words if len(w) >= 4), key=lambda w: (-len(w), words.index(w))
    )
    return ordered[: 2 if line % 2 == 0 else 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--data-dir", type=Path, help="where the Multi30k files are")
    args = parser.parse_args()
    decoding = group_config("decoding/beam", DecodingConfig, [f"beam_size={args.beam}"])
    translator = Translator.from_checkpoint(args.ckpt, decoding)
    data = translator.training_config.data
    if args.data_dir:
        data.dir = str(args.data_dir / Path(data.dir).name)
    sources, references = read_parallel(split_paths(data, SET))
    sources, references = sources[: args.sentences], references[: args.sentences]
    constraints = [phrases_of(r, i) for i, r in enumerate(references, start=1)]
    results = {}
    for name, phrases in (("beam", None), ("constrained", constraints)):
        start = time.perf_counter()
        hypotheses = translator.translate(sources, SET, 1, None, phrases)
        seconds = time.perf_counter() - start
        results[name] = {
            **corpus_scores(hypotheses, references),
            "constraints_met": constraints_met(hypotheses, constraints),
            "seconds": round(seconds, 2),
            "sentences_per_s": round(len(sources) / seconds, 1),
        }
        print(
            f"{name}: BLEU {results[name]['bleu']:.2f}, phrases met "
            f"{results[name]['constraints_met']:.1%}, {seconds:.1f} s"
        )
    phrase_count = sum(map(len, constraints))
    print(
        f"{len(sources)} sentences, {phrase_count} phrases; slowdown "
        f"{results['constrained']['seconds'] / results['beam']['seconds']:.2f}x"
    )
    if args.json:
        write_json(
            args.json,
            {
                "environment": environment("terminology.py", sys.argv[1:]),
                "phrases": constraints,
                "results": results,
            },
        )


if __name__ == "__main__":
    main()
