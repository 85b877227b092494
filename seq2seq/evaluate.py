"""`python -m seq2seq.evaluate ckpt_path=... [decoding.beam_size=5] [data.test_sets=[val]]`: BLEU
and chrF of a checkpoint on its test sets.

Scores a checkpoint, a run directory (its checkpoints/final.ckpt), or a directory written by
seq2seq.export (decoded by CTranslate2), with the tokenizer and data config it carries, reading
only the test files (`data.*` overrides pick others). Writes hypotheses
(<ckpt>.<set>.<decoding>.hyp next to a checkpoint, <set>.<decoding>.hyp inside an export
directory) and a JSON of all scores with sacreBLEU signatures
(<ckpt>.<sets>.<decoding>.scores.json, or <sets>.<decoding>.scores.json). With
`decoding.nbest` > 1 the best hypothesis of each sentence is scored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from seq2seq.cli import entrypoint
from seq2seq.config import RootConfig, config_to_dict, validate_config
from seq2seq.data.config import DataConfig
from seq2seq.data.corpus import (
    SplitPaths,
    ensure_available,
    normalize,
    phrase_lists,
    read_parallel,
    split_paths,
)
from seq2seq.data.directions import directions, zero_shot
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.model_path import resolve_model
from seq2seq.decoding.translator import Translator, default_device
from seq2seq.errors import CheckpointError, ConfigError, DataError
from seq2seq.io import atomic_path
from seq2seq.metrics import corpus_scores

log = logging.getLogger("seq2seq.evaluate")


@dataclass
class EvaluateConfig:
    """What `evaluate` reads (conf/evaluate.yaml): the model, data config and tokenizer come
    from the checkpoint; `data` holds keys merged over the checkpoint's data config."""

    ckpt_path: str
    checkpoints: list[str]  # more checkpoints, decoded with ckpt_path as one ensemble
    prefixes: str | None  # a file aligned with the (one) test set's sources: output prefixes
    constraints: str | None  # likewise: phrases each output must contain, tab-separated
    decoding: DecodingConfig
    data: dict[str, Any]  # e.g. {"test_sets": ["val"]} or {"dir": "/elsewhere/multi30k"}

    def check(self) -> None:
        self.decoding.check()


def decoding_tag(d: DecodingConfig) -> str:
    """What decoded, in the names of evaluate's files: runs of other decodings never overwrite
    each other's."""
    if d.search == "sample":
        truncation = f"t{d.temperature:g}-k{d.top_k}-p{d.top_p:g}"
        return f"sample{d.nbest}-{truncation}-lp{d.length_penalty:g}-seed{d.seed}"
    return "greedy" if d.beam_size == 1 else f"beam{d.beam_size}-lp{d.length_penalty:g}"


def evaluation_data(training: RootConfig, overrides: dict[str, Any]) -> DataConfig:
    """The checkpoint's data config with `overrides` merged over it, checked as a whole (so that
    errors name the key as `data.<key>`)."""
    merged = OmegaConf.merge(config_to_dict(training), {"data": overrides})
    data = validate_config(merged).data
    if not data.test_sets:
        raise ConfigError(
            "config key 'data.test_sets': empty; name the sets to score, e.g. data.test_sets=[val]"
        )
    return data


@dataclass(frozen=True)
class EvaluationSet:
    """A test set's files, and the language a multilingual model is asked for on it."""

    files: SplitPaths
    target_lang: str | None = None
    zero_shot: bool = False  # a direction the model was not trained on


def evaluation_sets(data: DataConfig, training: DataConfig) -> dict[str, EvaluationSet]:
    """The test sets of each direction of `data`, by name: `<set>` for a one-direction model,
    which is refused other directions, `<set>.<src>-<tgt>` for a multilingual one (trained on
    `training`), whose directions need not be among those trained (zero-shot)."""
    multilingual = training.multilingual
    asked = directions(data)
    if not multilingual and [d.name for d in asked] != [f"{training.src_lang}-{training.tgt_lang}"]:
        raise ConfigError(
            f"config key 'data.directions': {', '.join(d.name for d in asked)}, and this model "
            f"translates {training.src_lang}->{training.tgt_lang} only; leave data.directions "
            "unset"
        )
    sets = {}
    for direction in asked:
        files = evaluation_files(direction.data)
        for name, split in files.items():
            key = f"{name}.{direction.name}" if multilingual else name
            sets[key] = EvaluationSet(
                split,
                direction.tgt if multilingual else None,
                multilingual and zero_shot(training, direction.src, direction.tgt),
            )
    return sets


def evaluation_files(data: DataConfig) -> dict[str, SplitPaths]:
    """The test sets' files, which must exist: evaluate downloads nothing and reads no other."""
    missing = [
        path
        for split in (split_paths(data, name) for name in data.test_sets)
        for path in split.files
        if not path.exists()
    ]
    if missing:
        listing = "\n".join(f"  {p}" for p in missing)
        raise DataError(
            f"test file(s) not found:\n{listing}\nCheck data.dir (now '{data.dir}'; the "
            "checkpoint's own is relative to where training ran): point at the directory "
            f"holding them, e.g. data.dir=/path/to/{Path(data.dir).name}, or name other files "
            "with data.splits.<set>.src=... data.splits.<set>.tgt=..."
        )
    # all present, so nothing is fetched: this checks for directories and known checksums
    return {split.name: split for split in ensure_available(data, list(data.test_sets))}


def output_path(ckpt_path: Path, name: str) -> Path:
    """Where evaluate writes `name`: inside an export directory, else beside the checkpoint
    with its name in front."""
    if ckpt_path.is_dir():
        return ckpt_path / name
    return ckpt_path.with_name(f"{ckpt_path.stem}.{name}")


def ensemble_tag(paths: list[Path]) -> str:
    """An ensemble in evaluate's file names: its size and a digest of its members' paths."""
    members = "\n".join(str(p.resolve()) for p in paths)
    return f"ensemble{len(paths)}-{hashlib.sha256(members.encode()).hexdigest()[:8]}"


def aligned_file(path: Path, lines: int, setting: str) -> list[str]:
    """A file with one line per source line of the test set (`setting`=FILE)."""
    if not path.is_file():
        raise DataError(f"{setting}={path} is not a file; give one line per test sentence")
    content = path.read_text(encoding="utf-8").splitlines()
    if len(content) != lines:
        raise DataError(
            f"{setting}={path} has {len(content)} lines and the test set {lines}: give one "
            "line per test sentence (an empty line for none)"
        )
    return content


def file_tag(kind: str, path: Path) -> str:
    return f"{kind}-{hashlib.sha256(path.read_bytes()).hexdigest()[:8]}"


def constraints_met(hypotheses: list[str], constraints: list[list[str]]) -> float:
    """The share of phrases that their line's hypothesis contains."""
    pairs = [(h, p) for h, phrases in zip(hypotheses, constraints, strict=True) for p in phrases]
    return sum(normalize(p) in h for h, p in pairs) / max(len(pairs), 1)


def evaluate_checkpoint(
    ckpt_path: Path,
    decoding: DecodingConfig,
    data: dict[str, Any],
    ensemble: Sequence[Path] = (),
    prefixes: Path | None = None,
    constraints: Path | None = None,
) -> dict:
    """Score `ckpt_path` (a checkpoint, run directory or export directory), or it and the
    checkpoints of `ensemble` decoded as one, on its data config's test sets, with `data` keys
    merged over that config (other sets or files); return and write the scores. `prefixes`
    and `constraints` (files of one line per sentence) need a single test set."""
    ckpt_path, ensemble = resolve_model(ckpt_path), [resolve_model(p) for p in ensemble]
    members = [ckpt_path, *ensemble]
    translator = Translator.from_checkpoint(members, decoding, default_device())
    training = translator.training_config
    if training is None:
        raise CheckpointError(
            f"{ckpt_path} records no training configuration, so evaluate does not know its "
            "test sets: export it with python -m seq2seq.export ckpt_path=<ckpt> export.dir=..."
        )
    files = evaluation_sets(evaluation_data(training, data), training.data)
    tag = decoding_tag(decoding)
    if ensemble:
        tag = f"{ensemble_tag(members)}.{tag}"
    if (prefixes or constraints) and len(files) != 1:
        raise ConfigError(
            f"config key 'prefixes'/'constraints': files for one test set, and data.test_sets "
            f"has {len(files)}; pick one, e.g. data.test_sets=[{next(iter(files))}]"
        )
    for kind, path in (("prefix", prefixes), ("constraints", constraints)):
        if path is not None:
            tag = f"{tag}+{file_tag(kind, path)}"
    results: dict = {
        "checkpoint": str(ckpt_path),
        "ensemble": [str(p) for p in members] if ensemble else None,
        "backend": translator.backend.name,
        "decoding": config_to_dict(decoding),
        "test_sets": {},
    }
    for name, test_set in files.items():
        split = test_set.files
        if test_set.target_lang is not None:  # the same backend, another tag
            asked = dataclasses.replace(decoding, target_lang=test_set.target_lang)
            translator = Translator(translator.backend, translator.tokenizer, asked)
        sources, references = read_parallel(split)
        forced = prefixes and aligned_file(prefixes, len(sources), "prefixes")
        phrases = constraints and phrase_lists(
            aligned_file(constraints, len(sources), "constraints"), str(constraints), 1
        )
        start = time.perf_counter()
        hypotheses = translator.translate(sources, str(split.src), 1, forced, phrases)
        seconds = time.perf_counter() - start
        hyp_path = output_path(ckpt_path, f"{name}.{tag}.hyp")
        with atomic_path(hyp_path) as tmp:
            tmp.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        references_path = split.tgt
        if split.tsv:  # the target column, for whoever reads the scores (seq2seq.report)
            references_path = output_path(ckpt_path, f"{name}.ref")
            with atomic_path(references_path) as tmp:
                tmp.write_text("".join(r + "\n" for r in references), encoding="utf-8")
        met = {"constraints_met": constraints_met(hypotheses, phrases)} if phrases else {}
        results["test_sets"][name] = {
            **corpus_scores(hypotheses, references),
            **met,
            **({"zero_shot": True} if test_set.zero_shot else {}),
            "sentences": len(sources),
            "decoding_seconds": round(seconds, 2),
            "hypotheses": str(hyp_path),
            "references": str(references_path),
        }
    sets = "+".join(files)  # one file per evaluated set list: nothing clobbered
    scores_path = output_path(ckpt_path, f"{sets}.{tag}.scores.json")
    with atomic_path(scores_path) as tmp:
        tmp.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    Console(width=160).print(score_table(results, tag))
    log.info("scores written to %s", scores_path)
    return results


def score_table(results: dict, tag: str) -> Table:
    table = Table(title=f"{results['checkpoint']} ({tag})")
    for column in ("test set", "BLEU", "chrF", "BLEU lc", "BLEU signature", "decoding s"):
        table.add_column(column)
    for name, s in results["test_sets"].items():
        table.add_row(
            name + (" (zero-shot)" if s.get("zero_shot") else ""),
            f"{s['bleu']:.2f}",
            f"{s['chrf']:.2f}",
            f"{s['bleu_lc']:.2f}",
            s["bleu_signature"],
            f"{s['decoding_seconds']:.1f}",
        )
    return table


@entrypoint(config_name="evaluate", schema=EvaluateConfig)
def main(config: EvaluateConfig) -> None:
    others = [Path(p) for p in config.checkpoints]
    prefixes, constraints = (Path(p) if p else None for p in (config.prefixes, config.constraints))
    evaluate_checkpoint(
        Path(config.ckpt_path), config.decoding, config.data, others, prefixes, constraints
    )


if __name__ == "__main__":
    main()
