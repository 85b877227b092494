"""One training run of a recipe on a named corpus, scored as docs/results.md#corpus_cpu_1h
reports it: test BLEU with sacreBLEU's 13a and intl tokenizations and chrF, the settings the
corpus-derived recipe chose, the updates the clock held, and the machine.

    python scripts/corpus_recipe.py --corpus autshumato:en-nso --recipe corpus_cpu_1h \
        --seed 1234 --json docs/bench/corpus_cpu_1h/autshumato-en-nso-1234.json
    python scripts/corpus_recipe.py --corpus multi30k:en-de:5000 --recipe multi30k_cpu_1h_tuned

Corpora: `multi30k:<src>-<tgt>` (test_2016_flickr), `multi30k:<src>-<tgt>:<pairs>` (a seeded
sample of that many training pairs, written under --work; val and test whole) and
`autshumato:en-nso`, `autshumato:en-zu` (../shared/data/autshumato_en_*: dev and test) and
`menyo:en-yo` (../shared/data/menyo20k_en_yo, the TSV files as published; the dev line with
three fields is skipped).
`--dev-trial` scores nothing on the test set: the result is the validation BLEU of the final
checkpoint's candidates, for choosing settings. Extra Hydra overrides go after `--`. Run it
alone on the machine (or two side by side, pinned one core each): the clock decides how many
updates a run gets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml
from sacrebleu.metrics import BLEU, CHRF

from seq2seq.data.corpus import read_lines
from seq2seq.io import atomic_path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SEQ2SEQ_SHARED_DATA", ROOT.parent / "shared" / "data"))
SUBSET_SEED = 0  # the same sample of a corpus for every recipe and run
SETTINGS = [  # what the rule derives (seq2seq/training/recipe.py), and the schedule
    "tokenizer.vocab_size",
    "model.d_model",
    "model.heads",
    "model.encoder_layers",
    "model.decoder_layers",
    "model.ffn_dim",
    "model.dropout",
    "model.attention_dropout",
    "model.activation_dropout",
    "model.token_replacement",
    "optim.label_smoothing",
    "model.max_len",
    "data.val_subset",
    "trainer.check_val_every_n_epoch",
    "data.filter.max_len",
    "data.max_tokens",
    "decoding.max_len_a",
    "optim.lr",
    "optim.decay",
    "optim.warmup_steps",
    "optim.warmup_ratio",
    "derive_rule",
]


def machine() -> dict[str, str]:
    """The CPU as docs/results.md names it: model name, family and model, bf16 units."""
    info: dict[str, str] = {"processor": platform.processor() or platform.machine()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    units = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return {
        "cpu": fields.get("model name", ""),
        "family": fields.get("cpu family", ""),
        "model": fields.get("model", ""),
        "bf16_units": ", ".join(units) or "none",
        "cpus": str(os.cpu_count()),
    }


def subset(src: Path, tgt: Path, pairs: int, out: Path) -> tuple[Path, Path]:
    """A seeded sample of `pairs` training pairs, in corpus order, as two plain files."""
    sources, targets = read_lines(src), read_lines(tgt)
    chosen = np.sort(np.random.default_rng(SUBSET_SEED).choice(len(sources), pairs, False))
    out.mkdir(parents=True, exist_ok=True)
    files = out / f"train.{pairs}.src", out / f"train.{pairs}.tgt"
    for path, lines in zip(files, (sources, targets), strict=True):
        with atomic_path(path) as tmp:
            tmp.write_text("".join(lines[i] + "\n" for i in chosen), encoding="utf-8")
    return files


def corpus_overrides(corpus: str, work: Path) -> tuple[list[str], str]:
    """Hydra overrides that select the corpus, and the name of its test set."""
    name, pair, *size = corpus.split(":")
    src, tgt = pair.split("-")
    if name == "autshumato":
        folder = DATA / f"autshumato_{src}_{tgt}"
        files = [
            f"data.splits.{split}.{side}={part}.{lang}.gz"
            for split, part in (("train", "train"), ("val", "dev"), ("test", "test"))
            for side, lang in (("src", src), ("tgt", tgt))
        ]
        return [
            "data=parallel_files",
            "data.name=autshumato",
            f"data.src_lang={src}",
            f"data.tgt_lang={tgt}",
            f"data.dir={folder}",
            *files,
        ], "test"
    if name == "menyo":
        return [
            "data=parallel_files",
            "data.name=menyo20k",
            f"data.src_lang={src}",
            f"data.tgt_lang={tgt}",
            f"data.dir={DATA / 'menyo20k_en_yo'}",
            *(
                f"data.splits.{split}.tsv={split_file}.tsv.gz"
                for split, split_file in (("train", "train"), ("val", "dev"), ("test", "test"))
            ),
            "data.on_malformed=skip",  # dev's line 700 has three fields
        ], "test"
    if name != "multi30k":
        raise SystemExit(
            f"--corpus {corpus}: use multi30k:<src>-<tgt>[:<pairs>], autshumato:en-nso, "
            "autshumato:en-zu or menyo:en-yo"
        )
    folder = DATA / "multi30k"
    if not size:
        return [f"paths.data_dir={DATA}", f"data.src_lang={src}", f"data.tgt_lang={tgt}"], (
            "test_2016_flickr"
        )
    pairs = int(size[0])
    train = subset(
        folder / f"train.{src}.gz", folder / f"train.{tgt}.gz", pairs, work / "subsets" / pair
    )
    return [
        "data=parallel_files",
        f"data.name=multi30k{pairs}",
        f"data.src_lang={src}",
        f"data.tgt_lang={tgt}",
        f"data.dir={folder}",
        f"data.splits.train.src={train[0]}",
        f"data.splits.train.tgt={train[1]}",
        f"data.splits.val.src=val.{src}.gz",
        f"data.splits.val.tgt=val.{tgt}.gz",
        f"data.splits.test.src=test_2016_flickr.{src}.gz",
        f"data.splits.test.tgt=test_2016_flickr.{tgt}.gz",
    ], "test"


def scores(hypotheses: list[str], references: list[str]) -> dict[str, float | str]:
    """Cased detokenized BLEU with the 13a and intl tokenizations, and chrF, with signatures."""
    result: dict[str, float | str] = {}
    for name, metric in (
        ("bleu_13a", BLEU(tokenize="13a")),
        ("bleu_intl", BLEU(tokenize="intl")),
        ("chrf", CHRF()),
    ):
        result[name] = round(metric.corpus_score(hypotheses, [references]).score, 2)
        result[f"{name}_signature"] = str(metric.get_signature())
    return result


def select(tree: dict, key: str):
    for part in key.split("."):
        tree = tree[part]
    return tree


def settings(config: dict) -> dict:
    """The run's SETTINGS; optim.warmup_steps only where it set the warm-up (no warmup_ratio)."""
    chosen = {key: select(config, key) for key in SETTINGS}
    if chosen["optim.warmup_ratio"]:
        del chosen["optim.warmup_steps"]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--recipe", default="corpus_cpu_1h", help="an experiment= preset")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "corpus_recipe")
    parser.add_argument("--json", type=Path, help="where to write the result")
    parser.add_argument("--dev-trial", action="store_true", help="validation only, no test set")
    parser.add_argument("--beside", default="nothing", help="what ran beside it, for the record")
    parser.add_argument("overrides", nargs="*", help="after --: Hydra overrides")
    args = parser.parse_args()
    selection, test_set = corpus_overrides(args.corpus, args.work)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = f"{args.corpus.replace(':', '_')}-{args.recipe}-{args.seed}-{stamp}-{os.getpid()}"
    run_dir = args.work / name
    command = [
        sys.executable,
        "-m",
        "seq2seq.train",
        f"experiment={args.recipe}",
        *selection,
        f"seed={args.seed}",
        f"hydra.run.dir={run_dir}",
        *(["evaluate_after=false"] if args.dev_trial else []),
        *args.overrides,
    ]
    subprocess.run(command, check=True, cwd=ROOT)
    summary = json.loads((run_dir / "run_summary.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    result = {
        "command": " ".join(["python", "scripts/corpus_recipe.py", *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "corpus": args.corpus,
        "recipe": args.recipe,
        "seed": args.seed,
        "run_dir": str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir),
        "beside": args.beside,
        "settings": settings(config),
        "overrides": args.overrides,
        "precision": summary["precision"],
        "train_seconds": summary["train_seconds"],
        "validation_seconds": summary["validation_seconds"],
        "updates": summary["steps"],
        "epochs": summary["epochs"],
        "final_checkpoint": summary["final_checkpoint_choice"],
    }
    if not args.dev_trial:
        test = summary["test"][test_set]
        hypotheses = read_lines(Path(test["hypotheses"]))
        result["test"] = scores(hypotheses, read_lines(Path(test["references"])))
    report(result, args.json)


def report(result: dict, path: Path | None) -> None:
    """Print the result as JSON, and write it to `path` when one is given (whole or not at all)."""
    text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
    print(text)
    if path:
        with atomic_path(path) as tmp:
            tmp.write_text(text)


if __name__ == "__main__":
    main()
