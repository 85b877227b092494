"""Our search against CTranslate2's on one trained checkpoint, text in, text out.

    python scripts/decoding_benchmark.py CKPT [--source F] [--reference F] [--reps N]
        [--transformers] [--json FILE] [decoding overrides, e.g. beam_size=5 batch_size=64]

Unlike scripts/benchmark.py (random weights, lengths forced equal), this decodes the way a
user does: the checkpoint's own weights, each sentence stopping at its own EOS. Every system
translates the same source lines through `Translator.translate`, in batches of
`decoding.batch_size` on the same threads: ours (the checkpoint), and the checkpoint exported
by seq2seq.export as CTranslate2 float32 and int8 directories (seq2seq.decoding; each built
before its timed pass and deleted after it: a live ctranslate2.Translator slowed ours by a
quarter on an AMD EPYC; bf16 units: avx512_bf16). Repetitions are interleaved; the report
gives sentences/s (median), cased BLEU against the reference, how many outputs equal ours and
the size of the weights on disk (ours: the float32 state_dict as torch.save writes it;
CTranslate2: model.bin). With --transformers, also the directory `export.format=hf` writes, through
transformers' Auto classes and `generate` with its generation_config.json (the beam settings passed
only where the decoding asked differs from it), in batches of the same size sorted by length as
ours are; the lines it translates differently are listed in the JSON. A multilingual model:
decoding's target_lang=<lang> (its tag leads each line for transformers). Timings are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from bench.deployed import scratch_directory
from bench.measure import Isolated, Phase, interleaved
from bench.report import environment, ratio, table, write_json

from seq2seq.config import group_config
from seq2seq.data.corpus import read_lines
from seq2seq.decoding.checkpoint import TrainedModel, load_trained
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.ctranslate2_backend import export_model
from seq2seq.decoding.translator import Translator
from seq2seq.hub.directory import export_transformers, search_settings
from seq2seq.metrics import bleu

TEST = Path("../shared/data/multi30k")
SETTINGS = ("beam_size", "length_penalty", "batch_size")  # of decoding, in the report
QUANTIZATIONS = {"ctranslate2 float32": None, "ctranslate2 int8": "int8"}
Translate = Callable[[list[str]], list[str]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--source", type=Path, default=TEST / "test_2016_flickr.en.gz")
    parser.add_argument("--reference", type=Path, default=TEST / "test_2016_flickr.de.gz")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--transformers", action="store_true", help="also the export.format=hf directory"
    )
    parser.add_argument("--json", type=Path, help="also write all measurements to this file")
    parser.add_argument("overrides", nargs="*", help="decoding overrides (conf/decoding)")
    return parser.parse_intermixed_args(argv)


def exports(trained: TrainedModel) -> dict[str, Path]:
    """The checkpoint as seq2seq.export writes it, once per quantization, in a scratch
    directory removed at exit."""
    scratch = scratch_directory()
    return {
        name: export_model(trained.model, trained.tokenizer, scratch / name.split()[-1], q)
        for name, q in QUANTIZATIONS.items()
    }


def transformers_translate(directory: Path, decoding: DecodingConfig) -> Translate:
    """The exported transformers directory as a user runs it: Auto classes, tokenizer, generate."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    asked = search_settings(decoding)
    exported = model.generation_config
    same = all(getattr(exported, key, None) == value for key, value in asked.items())
    beams = {} if same else asked  # only what the exported generation_config.json lacks
    lead = f"<2{decoding.target_lang}> " if decoding.target_lang else ""

    def translate(lines: list[str]) -> list[str]:
        order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
        outputs = [""] * len(lines)
        for start in range(0, len(order), decoding.batch_size):
            chosen = order[start : start + decoding.batch_size]
            batch = tokenizer(
                [lead + lines[i] for i in chosen],
                return_tensors="pt",
                padding=True,
                truncation=True,
            )
            with torch.inference_mode():
                ids = model.generate(**batch, **beams)
            for i, text in zip(
                chosen, tokenizer.batch_decode(ids, skip_special_tokens=True), strict=True
            ):
                outputs[i] = text
        return outputs

    return translate


def weights_megabytes(trained: TrainedModel, directories: dict[str, Path]) -> dict[str, float]:
    ours = scratch_directory() / "ours.pt"
    torch.save(trained.model.state_dict(), ours)
    sizes = {"ours": ours.stat().st_size}
    sizes |= {
        name: sum(f.stat().st_size for f in d.glob("model.*")) for name, d in directories.items()
    }
    return {name: size / 1e6 for name, size in sizes.items()}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    decoding = group_config("decoding/beam", DecodingConfig, args.overrides)
    trained = load_trained(args.checkpoint)
    sources, references = read_lines(args.source), read_lines(args.reference)
    ours = Translator(trained.model, trained.tokenizer, decoding).translate
    directories = exports(trained)
    if args.transformers:
        directories["transformers"] = export_transformers(
            trained.model,
            trained.tokenizer,
            trained.config,
            scratch_directory() / "hf",
            {"summary": None, "run_dir": None, "license": "other", "data_license": None},
            {},
        )
    sizes = weights_megabytes(trained, directories)

    def deployed(directory: Path) -> Callable[[], Translate]:
        return lambda: Translator.from_checkpoint(directory, decoding).translate

    builds = {name: deployed(directory) for name, directory in directories.items()}
    if args.transformers:
        builds["transformers"] = lambda: transformers_translate(
            directories["transformers"], decoding
        )
    outputs = {"ours": ours(sources)}
    outputs |= {name: build()(sources) for name, build in builds.items()}

    def timed(translate: Translate) -> Callable[[], float]:
        def run() -> float:
            translate(sources)
            return float(len(sources))

        return run

    phases: dict[str, Phase] = {"ours": timed(ours)}
    for name, build in builds.items():
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
            f"{sizes[name]:.1f}",
        ]
        for name, m in measured.items()
    ]
    header = ["system", "sentences/s (median)", "ours / it", "BLEU", "outputs equal to ours"]
    header.append("weights on disk (MB)")
    results = {
        **environment("decoding_benchmark.py", argv),
        "checkpoint": str(args.checkpoint),
        "decoding": {k: getattr(decoding, k) for k in SETTINGS},
        "sentences": len(sources),
        "measured": {name: vars(m) for name, m in measured.items()},
        "bleu": scores,
        "same_as_ours": same,
        "weights_megabytes": sizes,
        **(
            {
                "transformers_differs": [
                    {"line": i + 1, "source": sources[i], "ours": a, "transformers": b}
                    for i, (a, b) in enumerate(
                        zip(outputs["ours"], outputs["transformers"], strict=True)
                    )
                    if a != b
                ]
            }
            if args.transformers
            else {}
        ),
    }
    print(f"date: {results['date']}; machine: {results['machine']}; {len(sources)} sentences")
    print(f"decoding: {results['decoding']}\n")
    print(table(header, rows))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
