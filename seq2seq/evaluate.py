"""`python -m seq2seq.evaluate ckpt_path=... [decoding.beam_size=5] [data.test_sets=[val]]`.

Scores a checkpoint with the tokenizer and data config it carries, reading only the test files
(`data.*` overrides pick others). Writes hypotheses (<ckpt>.<set>.<decoding>.hyp) next to the
checkpoint and a JSON of all scores with sacreBLEU signatures
(<ckpt>.<sets>.<decoding>.scores.json).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from seq2seq.checkpoint import TrainedModel, load_trained
from seq2seq.cli import entrypoint
from seq2seq.config import (
    DataConfig,
    DecodingConfig,
    EvaluateConfig,
    config_to_dict,
    validate_config,
)
from seq2seq.data.corpus import SplitPaths, ensure_available, read_parallel, split_paths
from seq2seq.errors import ConfigError, DataError
from seq2seq.io import atomic_path
from seq2seq.metrics import corpus_scores
from seq2seq.translator import Translator, default_device

log = logging.getLogger("seq2seq.evaluate")


def decoding_tag(d: DecodingConfig) -> str:
    return "greedy" if d.beam_size == 1 else f"beam{d.beam_size}-lp{d.length_penalty:g}"


def evaluation_data(trained: TrainedModel, overrides: dict[str, Any]) -> DataConfig:
    """The checkpoint's data config with `overrides` merged over it, checked as a whole (so that
    errors name the key as `data.<key>`)."""
    merged = OmegaConf.merge(config_to_dict(trained.config), {"data": overrides})
    data = validate_config(merged).data
    if not data.test_sets:
        raise ConfigError(
            "config key 'data.test_sets': empty; name the sets to score, e.g. data.test_sets=[val]"
        )
    return data


def evaluation_files(data: DataConfig) -> dict[str, SplitPaths]:
    """The test sets' files, which must exist: evaluate downloads nothing and reads no other."""
    missing = [
        path
        for split in (split_paths(data, name) for name in data.test_sets)
        for path in (split.src, split.tgt)
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


def evaluate_checkpoint(ckpt_path: Path, decoding: DecodingConfig, data: dict[str, Any]) -> dict:
    """Score `ckpt_path` on its data config's test sets, with `data` keys merged over that
    config (other sets or files); return and write the scores."""
    trained = load_trained(ckpt_path)
    files = evaluation_files(evaluation_data(trained, data))
    translator = Translator(trained.model, trained.tokenizer, decoding, default_device())
    tag = decoding_tag(decoding)
    results: dict = {
        "checkpoint": str(ckpt_path),
        "decoding": config_to_dict(decoding),
        "test_sets": {},
    }
    for name, split in files.items():
        sources, references = read_parallel(split)
        start = time.perf_counter()
        hypotheses = translator.translate(sources, str(split.src))
        seconds = time.perf_counter() - start
        hyp_path = ckpt_path.with_name(f"{ckpt_path.stem}.{name}.{tag}.hyp")
        with atomic_path(hyp_path) as tmp:
            tmp.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        results["test_sets"][name] = {
            **corpus_scores(hypotheses, references),
            "sentences": len(sources),
            "decoding_seconds": round(seconds, 2),
            "hypotheses": str(hyp_path),
            "references": str(split.tgt),
        }
    sets = "+".join(files)  # one file per evaluated set list: nothing clobbered
    scores_path = ckpt_path.with_name(f"{ckpt_path.stem}.{sets}.{tag}.scores.json")
    with atomic_path(scores_path) as tmp:
        tmp.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    Console(width=160).print(score_table(results))
    log.info("scores written to %s", scores_path)
    return results


def score_table(results: dict) -> Table:
    table = Table(
        title=f"{results['checkpoint']} ({decoding_tag(DecodingConfig(**results['decoding']))})"
    )
    for column in ("test set", "BLEU", "chrF", "BLEU lc", "BLEU signature", "decoding s"):
        table.add_column(column)
    for name, s in results["test_sets"].items():
        table.add_row(
            name,
            f"{s['bleu']:.2f}",
            f"{s['chrf']:.2f}",
            f"{s['bleu_lc']:.2f}",
            s["bleu_signature"],
            f"{s['decoding_seconds']:.1f}",
        )
    return table


@entrypoint(config_name="evaluate", schema=EvaluateConfig)
def main(config: EvaluateConfig) -> None:
    evaluate_checkpoint(Path(config.ckpt_path), config.decoding, config.data)


if __name__ == "__main__":
    main()
