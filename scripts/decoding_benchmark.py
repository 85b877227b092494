"""Our beam search against CTranslate2's on one trained checkpoint, text in, text out.

    python scripts/decoding_benchmark.py CKPT [--source F] [--reference F] [--reps N]
        [--json FILE] [decoding overrides, e.g. beam_size=5 batch_size=64]

Unlike scripts/benchmark.py (random weights, lengths forced equal), this decodes the way a
user does: the checkpoint's own weights, each sentence stopping at its own EOS. Every system
translates the same source lines in batches of `decoding.batch_size` on the same threads:
ours (seq2seq.Translator), and the checkpoint converted by seq2seq.export to CTranslate2,
float32 and int8 (each Translator built before its timed pass and deleted after it: a live
one slowed ours by a quarter on an AMD EPYC; bf16 units: avx512_bf16). Repetitions are
interleaved; the report gives sentences/s (median), cased BLEU against the reference, and how
many outputs equal ours. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from bench.deployed import engine, never_output, scratch_directory
from bench.measure import Isolated, Phase, interleaved
from bench.report import environment, ratio, table, write_json

from seq2seq.checkpoint import TrainedModel, load_trained
from seq2seq.config import DecodingConfig, group_config
from seq2seq.data.corpus import normalize, read_lines
from seq2seq.export import export_model
from seq2seq.metrics import bleu
from seq2seq.translator import Translator

TEST = Path("../shared/data/multi30k")
SETTINGS = ("beam_size", "length_penalty", "batch_size")  # of decoding, in the report
Translate = Callable[[list[str]], list[str]]
Build = Callable[[], Translate]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--source", type=Path, default=TEST / "test_2016_flickr.en.gz")
    parser.add_argument("--reference", type=Path, default=TEST / "test_2016_flickr.de.gz")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write all measurements to this file")
    parser.add_argument("overrides", nargs="*", help="decoding overrides (conf/decoding)")
    return parser.parse_intermixed_args(argv)


def ctranslate2_translators(trained: TrainedModel, decoding: DecodingConfig) -> dict[str, Build]:
    """Text -> text with CTranslate2 float32 and int8, as docs/deploy.md describes, with our
    search's settings (beam, length penalty, PAD and BOS never output; its length limit is the
    model's positions, ours `max_len_a` x source + `max_len_b`); each built on demand, because
    a live ctranslate2.Translator slows the other systems (bench.measure.Isolated)."""
    directory = scratch_directory() / "model"
    export_model(trained.model, trained.tokenizer, directory)
    src, tgt, model = trained.tokenizer.src, trained.tokenizer.tgt, trained.model
    never = never_output(model, trained.tokenizer)

    def build(compute_type: str) -> Translate:
        translator = engine(directory, "cpu", compute_type)

        def translate(lines: list[str]) -> list[str]:
            pieces = [src.encode(normalize(line), out_type=str) for line in lines]
            results = translator.translate_batch(
                pieces,
                max_batch_size=decoding.batch_size,
                beam_size=decoding.beam_size,
                length_penalty=decoding.length_penalty,
                max_decoding_length=model.config.max_len,
                suppress_sequences=never,
            )
            return [tgt.decode(result.hypotheses[0]) for result in results]

        return translate

    return {f"ctranslate2 {c}": partial(build, c) for c in ("float32", "int8")}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    decoding = group_config("decoding/beam", DecodingConfig, args.overrides)
    trained = load_trained(args.checkpoint)
    sources, references = read_lines(args.source), read_lines(args.reference)
    ours = Translator(trained.model, trained.tokenizer, decoding).translate
    deployed = ctranslate2_translators(trained, decoding)
    outputs = {"ours": ours(sources)}
    outputs |= {name: build()(sources) for name, build in deployed.items()}

    def timed(translate: Translate) -> Callable[[], float]:
        def run() -> float:
            translate(sources)
            return float(len(sources))

        return run

    phases: dict[str, Phase] = {"ours": timed(ours)}
    for name, build in deployed.items():
        phases[name] = Isolated(lambda build=build: timed(build()))
    measured = interleaved(phases, args.reps, torch.device("cpu"))
    scores = {name: bleu(out, references) for name, out in outputs.items()}
    same = {
        name: sum(a == b for a, b in zip(out, outputs["ours"], strict=True))
        for name, out in outputs.items()
    }
    rows = [
        [
            name,
            f"{m.median():,.1f}",
            "" if name == "ours" else ratio(measured["ours"], m),
            f"{scores[name]:.2f}",
            str(same[name]),
        ]
        for name, m in measured.items()
    ]
    header = ["system", "sentences/s (median)", "ours / it", "BLEU", "outputs equal to ours"]
    results = {
        **environment("decoding_benchmark.py", argv),
        "checkpoint": str(args.checkpoint),
        "decoding": {k: getattr(decoding, k) for k in SETTINGS},
        "sentences": len(sources),
        "measured": {name: vars(m) for name, m in measured.items()},
        "bleu": scores,
        "same_as_ours": same,
    }
    print(f"date: {results['date']}; machine: {results['machine']}; {len(sources)} sentences")
    print(f"decoding: {results['decoding']}\n")
    print(table(header, rows))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
