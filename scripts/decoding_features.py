"""The decoding features of docs/decoding.md on two trained runs: terminology constraints,
an ensemble of the two runs, and seeded sampling, each against beam search.

    python scripts/decoding_features.py RUN_A RUN_B [--sentences 200] [--reps 3]
        [--data-dir ../shared/data] [--json FILE]

RUN_A and RUN_B are run directories of one configuration trained from two seeds (they must
share the tokenizer). Every system decodes test_2016_flickr on the same threads, timed in
interleaved repetitions (median sentences/s); run it alone.

- Ensemble: each run's averaged.ckpt and last.ckpt alone, and the two averaged.ckpt decoded
  as one ensemble, beam 5, all 1,000 sentences.
- Terminology: RUN_A's averaged.ckpt on the first `--sentences` sentences, beam 5 with and
  without constraints, and with them at a wider beam (`--wide`). The phrases, a fixed rule
  on each reference: its longest word (punctuation removed from its ends, at least 4
  letters; the first on ties), and on every second line (1-based even) also the next
  longest distinct one; so each phrase is a word of the reference as written. A line
  without such a word gets none.
- Sampling: RUN_A's averaged.ckpt, decoding=sample (seed 1) with one draw, and with five
  (an n-best list), all 1,000 sentences; and the draws at batch size 1 against 64.
"""

from __future__ import annotations

import argparse
import string
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from bench.measure import interleaved
from bench.report import environment, table, write_json

from seq2seq.config import group_config
from seq2seq.data.corpus import read_parallel, split_paths
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator
from seq2seq.evaluate import constraints_met
from seq2seq.metrics import corpus_scores

SET = "test_2016_flickr"


PUNCTUATION = string.punctuation + "„“”‚‘’«»"


def phrases_of(reference: str, line: int) -> list[str]:
    """The module docstring's rule."""
    words = [word.strip(PUNCTUATION) for word in reference.split()]
    ordered = sorted(
        dict.fromkeys(w for w in words if sum(c.isalpha() for c in w) >= 4),
        key=lambda w: (-len(w), words.index(w)),
    )
    return ordered[: 2 if line % 2 == 0 else 1]


def within_beam(translator: Translator, phrases: list[list[str]], beam: int) -> list[bool]:
    """Per line, whether the beam holds a bank per step of progress: the phrases' target
    tokens + 1 (docs/decoding.md)."""
    encode = translator.tokenizer.encode_tgt
    return [sum(map(len, encode(p))) + 1 <= beam if p else True for p in phrases]


def decoding(group: str, *overrides: str) -> DecodingConfig:
    return group_config(f"decoding/{group}", DecodingConfig, list(overrides))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs=2)
    parser.add_argument("--sentences", type=int, default=200, help="for terminology")
    parser.add_argument("--wide", type=int, default=10, help="a wider beam for terminology")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, help="where the Multi30k files are")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    a, b = (run / "checkpoints" for run in args.runs)
    beam, sample = decoding("beam"), decoding("sample", "seed=1")
    systems = {
        "A averaged": Translator.from_checkpoint(a / "averaged.ckpt", beam),
        "B averaged": Translator.from_checkpoint(b / "averaged.ckpt", beam),
        "A last": Translator.from_checkpoint(a / "last.ckpt", beam),
        "B last": Translator.from_checkpoint(b / "last.ckpt", beam),
        "ensemble A+B averaged": Translator.from_checkpoint(
            [a / "averaged.ckpt", b / "averaged.ckpt"], beam
        ),
    }
    data = systems["A averaged"].training_config.data
    if args.data_dir:
        data.dir = str(args.data_dir / Path(data.dir).name)
    sources, references = read_parallel(split_paths(data, SET))
    few = args.sentences
    constraints = [phrases_of(r, i) for i, r in enumerate(references[:few], start=1)]
    first = systems["A averaged"]
    drawn = Translator(first.backend, first.tokenizer, sample)
    drawn5 = Translator(first.backend, first.tokenizer, decoding("sample", "seed=1", "nbest=5"))
    runs: dict[str, tuple[Callable[[], list[str]], int]] = {
        name: ((lambda t=t: t.translate(sources, SET)), len(sources)) for name, t in systems.items()
    }
    runs["A averaged, sample"] = (lambda: drawn.translate(sources, SET), len(sources))
    runs["A averaged, 5 samples"] = (
        lambda: [n[0].text for n in drawn5.translate_nbest(sources, SET)],
        len(sources),
    )
    runs[f"A averaged, first {few}"] = (lambda: first.translate(sources[:few], SET), few)
    runs[f"A averaged, first {few}, constrained"] = (
        lambda: first.translate(sources[:few], SET, 1, None, constraints),
        few,
    )
    wide = Translator(first.backend, first.tokenizer, decoding("beam", f"beam_size={args.wide}"))
    runs[f"A averaged, first {few}, constrained, beam {args.wide}"] = (
        lambda: wide.translate(sources[:few], SET, 1, None, constraints),
        few,
    )
    outputs = {name: run() for name, (run, _) in runs.items()}

    def timed(run: Callable[[], list[str]], work: int) -> Callable[[], float]:
        return lambda: (run(), float(work))[1]

    phases = {name: timed(run, work) for name, (run, work) in runs.items() if "last" not in name}
    measured = interleaved(phases, args.reps, torch.device("cpu"))
    scores = {name: corpus_scores(out, references[: len(out)]) for name, out in outputs.items()}
    met = {
        name: constraints_met(out, constraints)
        for name, out in outputs.items()
        if name.startswith(f"A averaged, first {few}")
    }
    # the share met on the lines whose phrases the beam can hold
    held = {
        name: constraints_met(
            [o for o, ok in zip(outputs[name], allowed, strict=True) if ok],
            [c for c, ok in zip(constraints, allowed, strict=True) if ok],
        )
        for name, allowed in (
            (f"A averaged, first {few}, constrained", within_beam(first, constraints, 5)),
            (
                f"A averaged, first {few}, constrained, beam {args.wide}",
                within_beam(first, constraints, args.wide),
            ),
        )
    }
    lines_held = {beam: sum(within_beam(first, constraints, beam)) for beam in (5, args.wide)}
    one_by_one = Translator(
        first.backend, first.tokenizer, decoding("sample", "seed=1", "batch_size=1")
    )
    singles = one_by_one.translate(sources, SET)
    same_draws = sum(x == y for x, y in zip(singles, outputs["A averaged, sample"], strict=True))

    rows = [
        [
            name,
            str(len(out)),
            f"{scores[name]['bleu']:.2f}",
            f"{measured[name].median():,.1f}" if name in measured else "",
            f"{met[name]:.1%}" if name in met else "",
            f"{held[name]:.1%}" if name in held else "",
        ]
        for name, out in outputs.items()
    ]
    header = ["system (beam 5 unless named)", "sentences", "BLEU", "sentences/s", "phrases met"]
    header.append("met where the beam holds the phrases")
    results = {
        **environment("decoding_features.py", argv),
        "runs": [str(r) for r in args.runs],
        "phrases": constraints,
        "bleu": scores,
        "constraints_met": met,
        "constraints_met_where_the_beam_holds_them": held,
        "lines_whose_phrases_the_beam_holds": lines_held,
        "measured": {name: vars(m) for name, m in measured.items()},
        "samples_equal_at_batch_1_and_64": same_draws,
    }
    print(f"date: {results['date']}; machine: {results['machine']}; {SET}")
    print(table(header, rows))
    print(
        f"{sum(map(len, constraints))} phrases on {few} lines; the beam holds the phrases of "
        f"{lines_held[5]} lines at beam 5, {lines_held[args.wide]} at beam {args.wide}"
    )
    print(f"sampling: {same_draws} of {len(sources)} outputs equal at batch sizes 1 and 64")
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
