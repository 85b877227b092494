"""Multilingual training measured as docs/multilingual.md reports it: one run of
multi30k_multilingual_cpu_1h on several directions (multi30k_cpu_1h_tuned on one; --recipe for
another preset) for a given clock, each direction's test BLEU (sacreBLEU 13a and intl, chrF) and
the share of outputs in another language than asked (langid, restricted to the model's
languages), the updates the clock held, and the machine.

    python scripts/multilingual.py --directions en-de,en-fr,en-cs --minutes 60 --seed 1234 \
        --json docs/bench/multilingual/m30k-3dir-60min-1234.json
    python scripts/multilingual.py --directions en-de --minutes 20 --seed 1234
    python scripts/multilingual.py --directions en-de,en-fr,en-cs:5000 --temperature 5
    python scripts/multilingual.py --directions en-nso,en-zu --disjoint-from en-nso,en-zu \
        --recipe corpus_cpu_1h
    python scripts/multilingual.py --directions en-zu --disjoint-from en-nso,en-zu --minutes 30 \
        --recipe corpus_cpu_1h
    python scripts/multilingual.py --zero-shot de-fr,fr-de --pivot en --run <run dir>

A direction is `<src>-<tgt>` of Multi30k (test_2016_flickr), `en-nso` or `en-zu` (Autshumato: dev
and test), or `<src>-<tgt>:<pairs>`, a seeded sample of that many Multi30k training pairs (written
under --work). `--disjoint-from` removes from each trained direction's training split the pairs
whose source (spaces and byte-order mark trimmed) is among the dev or test sources of the other
directions it names, as the two sides of a comparison both must (the Autshumato corpora share
English sentences); the JSON counts them. `--zero-shot` scores an existing run's final checkpoint
on Multi30k directions it was not trained on, and with `--pivot en` also through English by the
same model (src -> en -> tgt), the reference zero-shot translation is held to. `--dev-trial`
trains and validates without scoring a test set, to choose settings. Extra Hydra overrides go
after `--`.
Needs langid (`.[bench]`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml
from corpus_recipe import DATA, ROOT, machine, report, scores, subset
from langid.langid import LanguageIdentifier, model

from seq2seq.data.corpus import read_lines
from seq2seq.io import atomic_path

AUTSHUMATO = {"en-nso", "en-zu"}  # ../shared/data/autshumato_en_*


@dataclasses.dataclass(frozen=True)
class Direction:
    """One direction's files: (source, target) per split, relative to `folder` or absolute."""

    pair: str  # "en-nso"
    name: str  # its corpus name in the run
    folder: Path
    files: dict[str, tuple[str, str]]  # train, val, test
    plain: bool  # Multi30k's own (data.directions): its files as the data config names them

    @property
    def langs(self) -> tuple[str, str]:
        src, tgt = self.pair.split("-")
        return src, tgt

    def sources(self, split: str) -> list[str]:
        return read_lines(self.folder / self.files[split][0])


def direction(text: str, work: Path) -> Direction:
    """`<src>-<tgt>` of Multi30k, `<src>-<tgt>:<pairs>` (a seeded sample of its training
    pairs), or en-nso / en-zu (Autshumato: dev and test)."""
    pair, *size = text.split(":")
    src, tgt = pair.split("-")
    if pair in AUTSHUMATO:
        parts = (("train", "train"), ("val", "dev"), ("test", "test"))
        files = {split: (f"{part}.{src}.gz", f"{part}.{tgt}.gz") for split, part in parts}
        return Direction(pair, f"autshumato_{tgt}", DATA / f"autshumato_{src}_{tgt}", files, False)
    folder = DATA / "multi30k"
    files = {
        "train": (f"train.{src}.gz", f"train.{tgt}.gz"),
        "val": (f"val.{src}.gz", f"val.{tgt}.gz"),
        "test": (f"test_2016_flickr.{src}.gz", f"test_2016_flickr.{tgt}.gz"),
    }
    if not size:
        return Direction(pair, "multi30k", folder, files, True)
    sources, targets = files["train"]
    train = subset(folder / sources, folder / targets, int(size[0]), work / pair)
    files["train"] = (str(train[0]), str(train[1]))
    return Direction(pair, f"multi30k_{pair}_{size[0]}", folder, files, False)


def source_key(line: str) -> str:
    """A source sentence as the overlap between corpora is judged: spaces and a byte-order mark
    trimmed."""
    return line.strip().lstrip("\ufeff").strip()


def without_sources(trained: Direction, held: list[Direction], work: Path) -> tuple[Direction, int]:
    """`trained` with the training pairs removed whose source is among the dev or test sources
    of the `held` directions (its own excepted): sentences one direction is scored on that the
    shared model would otherwise have read as training data of another. Returns the pairs
    removed."""
    others = [d for d in held if d.pair != trained.pair]
    if not others:
        return trained, 0
    seen = {
        source_key(line) for d in others for split in ("val", "test") for line in d.sources(split)
    }
    sources = read_lines(trained.folder / trained.files["train"][0])
    targets = read_lines(trained.folder / trained.files["train"][1])
    kept = [i for i, line in enumerate(sources) if source_key(line) not in seen]
    tag = "+".join(d.pair for d in others)
    out = work / "disjoint" / f"{trained.name}-without-{tag}"
    out.mkdir(parents=True, exist_ok=True)
    paths = out / f"train.{trained.langs[0]}", out / f"train.{trained.langs[1]}"
    for path, lines in zip(paths, (sources, targets), strict=True):
        with atomic_path(path) as tmp:
            tmp.write_text("".join(lines[i] + "\n" for i in kept), encoding="utf-8")
    files = {**trained.files, "train": (str(paths[0]), str(paths[1]))}
    return dataclasses.replace(trained, files=files, plain=False), len(sources) - len(kept)


def corpus_entry(d: Direction) -> str:
    """`+data.corpora.<name>={...}`: a further corpus of one direction, as a Hydra override."""
    splits = ",".join(
        f"{split}:{{src:'{src}',tgt:'{tgt}',tsv:null}}" for split, (src, tgt) in d.files.items()
    )
    return (
        f"+data.corpora.{d.name}={{dir:'{d.folder}',languages:null,directions:[{d.pair}],"
        f"splits:{{{splits}}},train_split:train,val_split:val,test_sets:[test],download:null,"
        "verify_checksums:false}"
    )


def main_corpus(d: Direction) -> list[str]:
    """The run's own corpus (`data`) as the files of one direction."""
    src, tgt = d.langs
    return [
        "data=parallel_files",
        f"data.name={d.name}",
        f"data.src_lang={src}",
        f"data.tgt_lang={tgt}",
        f"data.dir={d.folder}",
        "data.directions=[]",
        *(
            f"data.splits.{split}.{side}={name}"
            for split, names in d.files.items()
            for side, name in zip(("src", "tgt"), names, strict=True)
        ),
    ]


def direction_overrides(directions: list[Direction]) -> list[str]:
    """Multi30k's directions as data.directions, the others as data.corpora entries; without a
    Multi30k direction, the first is the run's own corpus."""
    plain = [d.pair for d in directions if d.plain]
    extra = [d for d in directions if not d.plain]
    if plain:
        return [
            f"paths.data_dir={DATA}",
            f"data.directions=[{','.join(plain)}]",
            *map(corpus_entry, extra),
        ]
    return [*main_corpus(extra[0]), *map(corpus_entry, extra[1:])]


IDENTIFIER = LanguageIdentifier.from_modelstring(model, norm_probs=False)
KNOWN = frozenset(IDENTIFIER.nb_classes)  # set_languages narrows nb_classes


def off_target(hypotheses: list[str], target: str, languages: list[str]) -> float | None:
    """The percentage of non-empty outputs that langid, choosing among `languages` (those of
    them it knows), does not identify as `target`; None where it does not know `target`
    (Northern Sotho is not among its 97 languages)."""
    known = [lang for lang in languages if lang in KNOWN]
    if target not in known:
        return None
    IDENTIFIER.set_languages(known)
    texts = [h for h in hypotheses if h.strip()]
    wrong = sum(IDENTIFIER.classify(h)[0] != target for h in texts)
    return round(100 * wrong / max(len(texts), 1), 2)


def direction_results(
    summary: dict, languages: list[str], target: str | None = None
) -> dict[str, dict]:
    """Each test set's scores, and its off-target rate, by its name in run_summary.json:
    `<set>.<src>-<tgt>`, or for a one-direction run `<set>` and its language `target`."""
    results = {}
    for name, test in summary.items():
        hypotheses = read_lines(Path(test["hypotheses"]))
        references = read_lines(Path(test["references"]))
        asked = target or name.rsplit(".", 1)[-1].split("-")[-1]
        results[name] = {
            **scores(hypotheses, references),
            "off_target_percent": off_target(hypotheses, asked, languages),
            **({"zero_shot": True} if test.get("zero_shot") else {}),
        }
    return results


def run_languages(run_dir: Path) -> list[str]:
    from seq2seq.data.directions import languages
    from seq2seq.upgrade import load_config

    return languages(load_config(yaml.safe_load((run_dir / "config.yaml").read_text())).data)


def own_directory(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`...: the first that this process creates, so that runs
    started in the same second beside each other do not share one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = path, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}-{n}")


def clock(minutes: float) -> str:
    """trainer.max_time (DD:HH:MM:SS) for a clock of `minutes`, to the second."""
    hours, seconds = divmod(round(minutes * 60), 3600)
    return f"00:{hours:02d}:{seconds // 60:02d}:{seconds % 60:02d}"


def overrides(args: argparse.Namespace, directions: list[Direction], run_dir: Path) -> list[str]:
    """The training run's Hydra overrides: `--recipe`, or by default the multilingual preset for
    several directions and the Multi30k recipe for one."""
    several = len(directions) > 1
    one = directions[0]
    default = "multi30k_multilingual_cpu_1h" if several else "multi30k_cpu_1h_tuned"
    corpus = (
        [f"paths.data_dir={DATA}", f"data.src_lang={one.langs[0]}", f"data.tgt_lang={one.langs[1]}"]
        if not several and one.plain
        else direction_overrides(directions)
    )
    return [
        f"experiment={args.recipe or default}",
        *corpus,
        *([f"data.mix_temperature={args.temperature}"] * several),
        f"trainer.max_time={clock(args.minutes)}",
        f"seed={args.seed}",
        f"hydra.run.dir={run_dir}",
        *(["evaluate_after=false"] if args.dev_trial else []),
        *args.overrides,
    ]


def train(args: argparse.Namespace) -> dict:
    texts = args.directions.split(",")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = "+".join(d.replace(":", "_") for d in texts)
    run_dir = own_directory(
        args.work / f"{name}-{args.minutes:g}min-T{args.temperature:g}-{args.seed}-{stamp}"
    )
    directions = [direction(text, args.work / "subsets") for text in texts]
    held = [direction(text, args.work / "subsets") for text in args.disjoint_from]
    removed = {}
    for i, d in enumerate(directions):
        directions[i], removed[d.pair] = without_sources(d, held, args.work)
    several = len(directions) > 1
    one = directions[0]
    command = overrides(args, directions, run_dir)
    subprocess.run([sys.executable, "-m", "seq2seq.train", *command], check=True, cwd=ROOT)
    summary = json.loads((run_dir / "run_summary.json").read_text())
    result = {
        "run_dir": str(run_dir),
        "directions": texts,
        "recipe": command[0].removeprefix("experiment="),
        **(
            {"disjoint_from": args.disjoint_from, "training_pairs_removed": removed} if held else {}
        ),
        "minutes": args.minutes,
        "mix_temperature": args.temperature if several else None,
        "precision": summary["precision"],
        "train_seconds": summary["train_seconds"],
        "validation_seconds": summary["validation_seconds"],
        "updates": summary["steps"],
        "epochs": summary["epochs"],
        "final_checkpoint": summary["final_checkpoint_choice"],
    }
    if not args.dev_trial:
        target = None if several else one.langs[1]
        result["test"] = direction_results(summary["test"], run_languages(run_dir), target)
    return result


def pivot(checkpoint: Path, directions: list[str], via: str, languages: list[str]) -> dict:
    """Each Multi30k test direction translated src -> `via` -> tgt by the model of `checkpoint`,
    with the decoding it was trained with, scored as direction_results scores."""
    from seq2seq.decoding.translator import Translator

    model = Translator.from_checkpoint(checkpoint)
    decoding = model.training_config.decoding
    results = {}
    for direction in directions:
        src, tgt = direction.split("-")
        lines = read_lines(DATA / "multi30k" / f"test_2016_flickr.{src}.gz")
        for lang in (via, tgt):
            asked = dataclasses.replace(decoding, target_lang=lang)
            lines = Translator(model.backend, model.tokenizer, asked).translate(lines)
        references = read_lines(DATA / "multi30k" / f"test_2016_flickr.{tgt}.gz")
        results[f"test_2016_flickr.{direction}"] = {
            **scores(lines, references),
            "off_target_percent": off_target(lines, tgt, languages),
        }
    return results


def zero_shot(args: argparse.Namespace) -> dict:
    summary = json.loads((args.run / "run_summary.json").read_text())
    final = Path(summary["final_checkpoint"])
    directions = args.zero_shot.split(",")
    command = [
        sys.executable,
        "-m",
        "seq2seq.evaluate",
        f"ckpt_path={final}",
        f"data.directions=[{','.join(directions)}]",
        f"data.dir={DATA / 'multi30k'}",
        *args.overrides,
    ]
    subprocess.run(command, check=True, cwd=ROOT)
    (scores_file,) = final.parent.glob(f"{final.stem}.*{directions[0]}*.scores.json")
    evaluated = json.loads(scores_file.read_text())["test_sets"]
    languages = run_languages(args.run)
    return {
        "run_dir": str(args.run),
        "checkpoint": str(final),
        "directions": directions,
        "test": direction_results(evaluated, languages),
        **(
            {f"pivot_{args.pivot}": pivot(final, directions, args.pivot, languages)}
            if args.pivot
            else {}
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--directions", default="en-de,en-fr,en-cs")
    parser.add_argument(
        "--minutes", type=float, default=60, help="training clock; fractions for a share of one"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--recipe",
        help="an experiment= preset (default: multi30k_multilingual_cpu_1h for several "
        "directions, multi30k_cpu_1h_tuned for one)",
    )
    parser.add_argument(
        "--disjoint-from",
        type=lambda text: text.split(","),
        default=[],
        help="directions whose dev and test sources are removed from the other directions' "
        "training splits",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--dev-trial", action="store_true", help="validation only, no test set")
    parser.add_argument("--zero-shot", help="directions to score an existing run on")
    parser.add_argument("--pivot", help="with --zero-shot: also translate through this language")
    parser.add_argument("--run", type=Path, help="the run directory, with --zero-shot")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "multilingual")
    parser.add_argument("--beside", default="nothing", help="what ran beside it, for the record")
    parser.add_argument("--json", type=Path, help="where to write the result")
    parser.add_argument("overrides", nargs="*", help="after --: Hydra overrides")
    args = parser.parse_args()
    if args.zero_shot and args.run is None:
        raise SystemExit("--zero-shot needs --run: the directory of a multilingual run")
    if args.pivot and not args.zero_shot:
        raise SystemExit("--pivot goes with --zero-shot: the directions to translate through it")
    result = {
        "command": " ".join(["python", "scripts/multilingual.py", *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "beside": args.beside,
        "seed": args.seed,
        **(zero_shot(args) if args.zero_shot else train(args)),
    }
    report(result, args.json)


if __name__ == "__main__":
    main()
