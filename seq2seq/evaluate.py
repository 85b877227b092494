"""`python -m seq2seq.evaluate ckpt_path=... [decoding.beam_size=5] [data.test_sets=[...]]`.

Writes hypotheses (<ckpt>.<set>.<decoding>.hyp) next to the checkpoint and a JSON of all
scores with sacreBLEU signatures (<ckpt>.<sets>.<decoding>.scores.json).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from seq2seq.checkpoint import TrainedModel, load_trained
from seq2seq.cli import entrypoint
from seq2seq.config import DecodingConfig, RootConfig, config_to_dict
from seq2seq.data.corpus import read_parallel
from seq2seq.data.datamodule import prepare
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.io import atomic_path
from seq2seq.metrics import corpus_scores
from seq2seq.translator import Translator, default_device

log = logging.getLogger("seq2seq.evaluate")


def decoding_tag(d: DecodingConfig) -> str:
    return "greedy" if d.beam_size == 1 else f"beam{d.beam_size}-lp{d.length_penalty:g}"


def describe(config: RootConfig, tokenizer: Tokenizer) -> str:
    t = config.tokenizer
    return (
        f"{config.data.name} {config.data.src_lang}->{config.data.tgt_lang}, {t.model_type} "
        f"{t.vocab_size} {'joint' if t.joint else 'separate'} (fingerprint "
        f"{tokenizer.fingerprint[:12]})"
    )


def check_tokenizer(trained: TrainedModel, config: RootConfig, data_tokenizer: Tokenizer) -> None:
    if trained.tokenizer.fingerprint != data_tokenizer.fingerprint:
        raise CheckpointError(
            "the checkpoint's tokenizer does not match the data config:\n"
            f"  checkpoint:  {describe(trained.config, trained.tokenizer)}\n"
            f"  data config: {describe(config, data_tokenizer)}\n"
            "Pass the data and tokenizer overrides of the training run (see config.yaml in "
            "its run directory), e.g. the same experiment=..."
        )


def evaluate_checkpoint(config: RootConfig, ckpt_path: Path) -> dict:
    trained = load_trained(ckpt_path)
    prepared = prepare(config)
    check_tokenizer(trained, config, prepared.tokenizer)
    translator = Translator(trained.model, trained.tokenizer, config.decoding, default_device())
    tag = decoding_tag(config.decoding)
    results: dict = {
        "checkpoint": str(ckpt_path),
        "decoding": config_to_dict(config.decoding),
        "test_sets": {},
    }
    for name in config.data.test_sets:
        sources, references = read_parallel(prepared.files[name])
        start = time.perf_counter()
        hypotheses = translator.translate(sources, str(prepared.files[name].src))
        seconds = time.perf_counter() - start
        hyp_path = ckpt_path.with_name(f"{ckpt_path.stem}.{name}.{tag}.hyp")
        with atomic_path(hyp_path) as tmp:
            tmp.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        results["test_sets"][name] = {
            **corpus_scores(hypotheses, references),
            "sentences": len(sources),
            "decoding_seconds": round(seconds, 2),
            "hypotheses": str(hyp_path),
            "references": str(prepared.files[name].tgt),
        }
    sets = "+".join(config.data.test_sets)  # one file per evaluated set list: nothing clobbered
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


@entrypoint(config_name="evaluate")
def main(config: RootConfig) -> None:
    if config.ckpt_path is None:
        raise ConfigError("config key 'ckpt_path': required, e.g. ckpt_path=.../best.ckpt")
    evaluate_checkpoint(config, Path(config.ckpt_path))


if __name__ == "__main__":
    main()
