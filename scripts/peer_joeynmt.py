r"""Joey NMT 2.3 as the peer of a seq2seq run: the same corpus, training clock and validation
sample, its test output scored exactly as seq2seq scores its own.

    python scripts/peer_joeynmt.py --config ours --from-run outputs/<run> --corpus multi30k \
        --minutes 60 --seed 1 --cores 0 --dev-lines 500 --beside "nothing" \
        --work-dir /tmp/joey_m30k_ours_s1 --out joey_m30k_ours_s1.json

`--config` picks one of two configurations; the result JSON holds the one used in full, and
every key that differs from the shipped file, with its reason:

- `shipped`: the Transformer Joey ships for its small benchmark corpus, IWSLT14 de-en
  (`configs/iwslt14_deen_sp.yaml`, JOEY_SOURCE), changed only where Joey's docs say a corpus
  needs it: its files, a cased joint SentencePiece vocabulary (`--vocab-size`, trained as
  Joey's `scripts/build_vocab.py --joint` trains it), the size of Joey's IWSLT14 benchmark
  Transformer (FAQ: size the model by the benchmarks' data sizes), validation as often as
  the seq2seq run's and Joey's default output length. Optimizer, schedule, dropout and batch
  stay as shipped, unless a dev trial changes them: `--warmup-share` fits the warm-up to the
  clock as for `ours`, `--set KEY=VALUE` sets any key (each recorded with its reason).
- `ours`: a seq2seq run's architecture and optimization (`--from-run`: its config.yaml) as a
  Joey config, with Joey's `warmupinversesquareroot` schedule (the shape of ours), whose
  warm-up is `--warmup-share` of the updates Joey makes in the clock at the pace it shows in a
  short probe run (or `--warmup-steps`): the toolkit is the only difference.

For both, the clock starts when Joey starts training (its `EPOCH 1` log line; loading and
tokenizing the data before it are start-up, as seq2seq's `prepare` is); after `--minutes`
Joey gets SIGINT, saves latest.ckpt and exits, and the test set is decoded from it with beam
5. Joey validates (greedy) every epoch, or every n as the `--from-run` run does
(`trainer.check_val_every_n_epoch`), on the seeded sample of `--dev-lines` dev pairs that
seq2seq's `data.val_subset` draws; its validation seconds come from its log. Batches are
Joey's token batches: Joey 2.3 has no length bucketing or sorting. Precision is fp32: Joey's
`fp16` is a float16 autocast, with no bf16 path on a CPU. `--dev-trial` scores the dev sample
instead of the test set, for the few trials allowed per corpus.

Joey runs in its own environment (`--venv`), which calls this file back to train the
SentencePiece model and to start Joey with one patch for torch 2.13 (`patch_joey`):

    python3.11 -m venv /work/venvs/joeynmt
    /work/venvs/joeynmt/bin/pip install torch==2.13.0 joeynmt==2.3.0 importlib_metadata \
        sentencepiece==0.2.0

(Joey 2.3.0 imports importlib_metadata without declaring it, and calls SentencePiece's
SetVocabulary, which sentencepiece 0.2.1 removed.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from sacrebleu.metrics import BLEU

ROOT = Path(__file__).resolve().parents[1]

JOEY_SOURCE = {
    "repository": "https://github.com/joeynmt/joeynmt",
    "tag": "v2.3",
    "commit": "c19c6c8438263d3ad01054742bf98ab1f1fa61b3",
    "version": "2.3.0",
    "config": "configs/iwslt14_deen_sp.yaml",
    "config_blob": "013945e2dd57061e152023a9f967a90dac8725a7",
    "model_size_config": "configs/iwslt14_deen_bpe.yaml",
    "model_size_config_blob": "81db0b9e728302d3c81b00510b8deb26b4df1b62",
}

# configs/iwslt14_deen_sp.yaml at the commit above in YAML's flow style, its comments left out
# (it loads equal to the file)
SHIPPED_YAML = """\
name: "iwslt14_deen_sp"
joeynmt_version: "2.3.0"
model_dir: "models/iwslt14_deen_sp"
use_cuda: True
fp16: True
random_seed: 42
data:
    train: "may-ohta/iwslt14"
    dev: "may-ohta/iwslt14"
    test: "may-ohta/iwslt14"
    dataset_type: "huggingface"
    dataset_cfg: {name: "de-en", trust_remote_code: True}
    src: {lang: "de", max_length: 512, lowercase: True, normalize: False, level: "bpe",
        voc_limit: 32000, voc_min_freq: 1, voc_file: "test/data/iwslt14/sp.vocab",
        tokenizer_type: "sentencepiece", tokenizer_cfg: {model_file: "test/data/iwslt14/sp.model",
        model_type: "unigram", character_coverage: 1.0, alpha: 0.1, pretokenizer: "moses"}}
    trg: {lang: "en", max_length: 512, lowercase: True, normalize: False, level: "bpe",
        voc_limit: 32000, voc_min_freq: 1, voc_file: "test/data/iwslt14/sp.vocab",
        tokenizer_type: "sentencepiece", tokenizer_cfg: {model_file: "test/data/iwslt14/sp.model",
        model_type: "unigram", character_coverage: 1.0, alpha: 0.1, pretokenizer: "moses"}}
    special_symbols: {unk_token: "<unk>", unk_id: 0, pad_token: "<pad>", pad_id: 1,
        bos_token: "<s>", bos_id: 2, eos_token: "</s>", eos_id: 3}
testing: {n_best: 1, beam_size: 5, beam_alpha: 1.0, batch_size: 1024, batch_type: "token",
    max_output_length: 100, eval_metrics: ["bleu"],
    sacrebleu_cfg: {tokenize: "13a", lowercase: True}}
training: {optimizer: "adamw", normalization: "tokens", adam_betas: [0.9, 0.999],
    scheduling: "warmupinversesquareroot", learning_rate_warmup: 4000, learning_rate: 0.0002,
    learning_rate_min: 0.00000001, weight_decay: 0.0, label_smoothing: 0.1,
    loss: "crossentropy", batch_size: 8192, batch_type: "token", batch_multiplier: 4,
    early_stopping_metric: "bleu", epochs: 100, validation_freq: 1000, logging_freq: 100,
    overwrite: False, shuffle: True, print_valid_sents: [0, 1, 2, 3], keep_best_ckpts: 5}
model:
    initializer: "xavier_uniform"
    bias_initializer: "zeros"
    init_gain: 1.0
    embed_initializer: "xavier_uniform"
    embed_init_gain: 1.0
    tied_embeddings: True
    tied_softmax: True
    encoder: {type: "transformer", num_layers: 6, num_heads: 8,
        embeddings: {embedding_dim: 512, scale: True, dropout: 0.}, hidden_size: 512,
        ff_size: 2048, dropout: 0.1, layer_norm: "pre", activation: "relu"}
    decoder: {type: "transformer", num_layers: 6, num_heads: 8,
        embeddings: {embedding_dim: 512, scale: True, dropout: 0.}, hidden_size: 512,
        ff_size: 2048, dropout: 0.1, layer_norm: "pre", activation: "relu"}
"""
# the size of the IWSLT14 benchmark Transformer (configs/iwslt14_deen_bpe.yaml, 19M parameters)
BENCHMARK_SIZE = {
    "embeddings.embedding_dim": 256,
    "hidden_size": 256,
    "ff_size": 1024,
    "num_heads": 4,
}
BATCHING = (
    "Joey 2.3's TokenBatchSampler (batch_type token): a shuffled order cut into batches of "
    "batch_size padded tokens; Joey 2.3 has no length bucketing or sorting"
)
PRECISION = "fp32: Joey 2.3's fp16 is a float16 autocast; it has no bf16 path on a CPU"
NO_VALIDATION = 10**9  # a validation frequency the probe never reaches (a multiple of 100)

# split names (train, dev, test) and languages of the corpora in --data-dir
CORPORA = {
    "multi30k": (("train", "val", "test_2016_flickr"), ("en", "de")),
    "autshumato_en_nso": (("train", "dev", "test"), ("en", "nso")),
    "autshumato_en_zu": (("train", "dev", "test"), ("en", "zu")),
}

# Joey reads its files with str.splitlines, which also breaks lines at these characters
SPLITLINES_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Joey's log lines: "<date> <time>,<ms> - INFO - joeynmt.<module> - <message>"
TRAINING_STARTS = re.compile(r" - joeynmt\.training - EPOCH 1$", re.M)
GENERATION = re.compile(r" - joeynmt\.prediction - Generation took ([0-9.]+)\[sec\]")
SCORING = re.compile(r" - joeynmt\.prediction - Evaluation result \(greedy\): .*, ([0-9.]+)\[sec\]")
INTERRUPT = re.compile(r"Interrupt at epoch (\d+), step (\d+)\.")


# ---------------------------------------------------------------- text for Joey's reader


def joey_line(line: str) -> str:
    """A line Joey reads back as one line: splitlines' other line breaks become spaces."""
    return SPLITLINES_BREAKS.sub(" ", line)


def training_pairs(sources: list[str], targets: list[str]) -> tuple[list[str], list[str], int]:
    """The pairs Joey can train or validate on, and how many were dropped: Joey drops a blank
    line of each side on its own (misaligning the rest), so a pair with a blank side goes."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source lines but {len(targets)} target lines")
    kept = [(s, t) for s, t in zip(sources, targets, strict=True) if s.strip() and t.strip()]
    dropped = len(sources) - len(kept)
    return [joey_line(s) for s, _ in kept], [joey_line(t) for _, t in kept], dropped


def decodable_sources(sources: list[str]) -> tuple[list[str], list[int]]:
    """The source lines Joey can decode and their indices; blank ones get an empty line."""
    kept = [i for i, line in enumerate(sources) if line.strip()]
    return [joey_line(sources[i]) for i in kept], kept


def restore_order(hypotheses: list[str], kept: list[int], lines: int) -> list[str]:
    """One hypothesis per source line: Joey's at the decodable lines, empty elsewhere."""
    if len(hypotheses) != len(kept):
        raise ValueError(f"Joey wrote {len(hypotheses)} translations for {len(kept)} lines")
    restored = [""] * lines
    for index, hypothesis in zip(kept, hypotheses, strict=True):
        restored[index] = hypothesis
    return restored


def dev_sample(dev: dict[str, list[str]], lines: int) -> dict[str, list[str]]:
    """The dev pairs Joey validates on (and a dev trial scores): all, or the seeded sample of
    `lines` pairs that seq2seq's data.val_subset decodes, so both validate at the same cost."""
    from seq2seq.data.validation_sample import sample_indices

    if lines == 0:
        return dev
    keep = sample_indices(len(next(iter(dev.values()))), lines)  # all, when it has no more
    return {lang: [text[i] for i in keep] for lang, text in dev.items()}


def prepare_text(
    raw: dict[str, dict[str, list[str]]], src: str, tgt: str, evaluated: str, data: Path
) -> tuple[dict[str, dict[str, int]], list[int]]:
    """Joey's plain-text files in `data`: train and dev pairs, and the decodable source lines
    of the `evaluated` split as `eval.<src>`; their counts, and the lines decoded."""
    prepared = {}
    for role in ("train", "dev"):
        sources, targets, dropped = training_pairs(raw[role][src], raw[role][tgt])
        write_lines(data / f"{role}.{src}", sources)
        write_lines(data / f"{role}.{tgt}", targets)
        prepared[role] = {"pairs": len(sources), "dropped_blank": dropped}
    sources, kept = decodable_sources(raw[evaluated][src])
    write_lines(data / f"eval.{src}", sources)
    lines = len(raw[evaluated][src])
    prepared[f"{evaluated}_decoded"] = {"lines": lines, "blank_sources": lines - len(kept)}
    return prepared, kept


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


# ---------------------------------------------------------------- Joey's configuration


@dataclasses.dataclass(frozen=True)
class Ours:
    """What configuration (b) takes from a seq2seq run's config.yaml."""

    source: str
    encoder_layers: int
    decoder_layers: int
    d_model: int
    heads: int
    ffn_dim: int
    dropout: float
    label_smoothing: float
    lr: float
    max_tokens: int
    vocab_size: int
    betas: list[float]
    weight_decay: float
    tie_embeddings: bool
    clip_grad_norm: float | None
    max_len: int | None
    validate_every: int  # epochs


def read_run(run_dir: Path) -> Ours:
    """Configuration (b)'s settings from `run_dir`/config.yaml (seq2seq's resolved config)."""
    path = run_dir / "config.yaml"
    c = yaml.safe_load(path.read_text(encoding="utf-8"))
    model, optim, data = c["model"], c["optim"], c["data"]
    return Ours(
        str(path),
        *(model[k] for k in ("encoder_layers", "decoder_layers", "d_model", "heads", "ffn_dim")),
        model["dropout"],
        optim["label_smoothing"],
        optim["lr"],
        data["max_tokens"],
        c["tokenizer"]["vocab_size"],
        betas=list(optim.get("betas", [0.9, 0.98])),
        weight_decay=optim.get("weight_decay", 0.0),
        tie_embeddings=model.get("tie_embeddings", True),
        clip_grad_norm=(c.get("trainer") or {}).get("gradient_clip_val"),
        max_len=(data.get("filter") or {}).get("max_len"),
        validate_every=(c.get("trainer") or {}).get("check_val_every_n_epoch", 1),
    )


REMOVE = object()  # in a change: the key goes
# a change: dotted key ("model.*.x": model.encoder.x and model.decoder.x), value, reason
Change = tuple[str, Any, str]


def apply(config: dict[str, Any], reasons: dict[str, str], changes: list[Change]) -> None:
    """Set (or, with REMOVE, delete) each dotted key, and record why."""
    for pattern, value, why in changes:
        for key in {pattern.replace("*", stack) for stack in ("encoder", "decoder")}:
            *parents, leaf = key.split(".")
            node = config
            for part in parents:
                node = node.setdefault(part, {})
            if value is REMOVE:
                node.pop(leaf, None)
            else:
                node[leaf] = value
            reasons[key] = why


def shipped_config(
    work: Path, src: str, tgt: str, vocab_size: int, seed: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """Configuration (a): the shipped file changed where Joey's docs say (module docstring);
    and the reason for each key set."""
    files = "the corpus's plain-text files instead of the Hugging Face IWSLT14 download"
    vocabulary = "the joint SentencePiece model trained for this corpus"
    size = "the IWSLT14 benchmark Transformer (FAQ: size the model by the benchmarks' data sizes)"
    changes: list[Change] = [
        ("name", work.name, "this run's name"),
        ("model_dir", str(work / "model"), "this run's directory"),
        ("use_cuda", False, "the comparison runs on a CPU"),
        ("fp16", False, PRECISION),
        ("random_seed", seed, "--seed"),
        ("data.train", str(work / "data" / "train"), files),
        ("data.dev", str(work / "data" / "dev"), files),
        ("data.test", REMOVE, "decoded after training (decode.yaml)"),
        ("data.dataset_type", "plain", files),
        ("data.dataset_cfg", REMOVE, files),
        ("testing.sacrebleu_cfg.lowercase", False, "cased dev BLEU"),
        (
            "testing.max_output_length",
            REMOVE,
            "Joey's default (1.5 x the batch's longest source): IWSLT's 100 pieces cut long "
            "sentences (FAQ: set it for the data)",
        ),
        *((f"model.*.{key}", value, size) for key, value in BENCHMARK_SIZE.items()),
    ]
    for side, lang in (("src", src), ("trg", tgt)):
        changes += [
            (f"data.{side}.lang", lang, "the corpus's language"),
            (f"data.{side}.lowercase", False, "cased BLEU (IWSLT14 is scored lowercased)"),
            (f"data.{side}.voc_limit", vocab_size, vocabulary),
            (f"data.{side}.voc_file", str(work / "spm" / "sp.vocab"), vocabulary),
            (f"data.{side}.tokenizer_cfg.model_file", str(work / "spm" / "sp.model"), vocabulary),
        ]
    config, reasons = yaml.safe_load(SHIPPED_YAML), {}
    apply(config, reasons, changes)
    return config, reasons


def ours_config(
    work: Path, src: str, tgt: str, seed: int, ours: Ours, warmup: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """Configuration (b): (a)'s data and machine keys, and the run's model and optimization
    with `warmup` updates of warm-up; and the reason for each key set."""
    config, reasons = shipped_config(work, src, tgt, ours.vocab_size, seed)
    why = f"--config ours: {ours.source}"
    changes: list[Change] = [
        ("model.encoder.num_layers", ours.encoder_layers, f"{why} model.encoder_layers"),
        ("model.decoder.num_layers", ours.decoder_layers, f"{why} model.decoder_layers"),
        ("model.*.embeddings.embedding_dim", ours.d_model, f"{why} model.d_model"),
        ("model.*.hidden_size", ours.d_model, f"{why} model.d_model"),
        ("model.*.num_heads", ours.heads, f"{why} model.heads"),
        ("model.*.ff_size", ours.ffn_dim, f"{why} model.ffn_dim"),
        ("model.*.dropout", ours.dropout, f"{why} model.dropout"),
        ("model.*.embeddings.dropout", ours.dropout, f"{why} model.dropout (after embeddings)"),
        ("model.tied_embeddings", ours.tie_embeddings, f"{why} model.tie_embeddings"),
        ("model.tied_softmax", ours.tie_embeddings, f"{why} model.tie_embeddings"),
        ("training.learning_rate", ours.lr, f"{why} optim.lr (the peak)"),
        ("training.adam_betas", ours.betas, f"{why} optim.betas"),
        ("training.weight_decay", ours.weight_decay, f"{why} optim.weight_decay"),
        ("training.label_smoothing", ours.label_smoothing, f"{why} optim.label_smoothing"),
        ("training.batch_size", ours.max_tokens, f"{why} data.max_tokens (Joey's are padded)"),
        ("training.batch_multiplier", 1, f"{why}: one batch an update"),
        (
            "training.learning_rate_warmup",
            warmup,
            "--warmup-share of the updates Joey makes in the clock at its probed pace, or "
            "--warmup-steps",
        ),
    ]
    if ours.clip_grad_norm:
        changes.append(
            ("training.clip_grad_norm", ours.clip_grad_norm, f"{why} trainer.gradient_clip_val")
        )
    if ours.max_len:
        changes += [
            (f"data.{s}.max_length", ours.max_len, f"{why} data.filter.max_len")
            for s in ("src", "trg")
        ]
    apply(config, reasons, changes)
    return config, reasons


def set_validation_freq(
    config: dict[str, Any], reasons: dict[str, str], per_epoch: int, epochs: int = 1
) -> None:
    """Validate every `epochs` epochs of `per_epoch` updates, as the seq2seq run does; Joey
    requires logging_freq to divide it."""
    freq = per_epoch * epochs
    logging = max(d for d in range(1, config["training"]["logging_freq"] + 1) if freq % d == 0)
    why = (
        f"every {epochs} epoch(s) as the seq2seq run (trainer.check_val_every_n_epoch), counted "
        "in Joey's token batches"
    )
    apply(
        config,
        reasons,
        [("training.validation_freq", freq, why), ("training.logging_freq", logging, why)],
    )


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value (lists are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_keys(config: dict[str, Any], reasons: dict[str, str]) -> list[dict[str, Any]]:
    """Every key whose value differs from the shipped file, with its reason (a removed
    section's keys take the section's)."""
    shipped, adapted = flatten(yaml.safe_load(SHIPPED_YAML)), flatten(config)
    changes = []
    for key in sorted(shipped.keys() | adapted.keys()):
        if key in shipped and key in adapted and shipped[key] == adapted[key]:
            continue
        section = key.rsplit(".", 1)[0]
        reason = reasons.get(key) or reasons.get(section)
        if reason is None:
            raise KeyError(f"no reason recorded for changing {key}")
        change = {"key": key, "shipped": shipped.get(key), "value": adapted.get(key)}
        if key not in adapted:
            change["removed"] = True
        changes.append({**change, "reason": reason})
    return changes


def updates_per_epoch(
    lengths: list[tuple[int, int]], batch_tokens: int, multiplier: int, max_len: int, seed: int
) -> int:
    """Updates in one epoch as Joey's TokenBatchSampler fills batches (a batch closes when its
    longest pair times its size reaches `batch_tokens`) over a shuffled order, without pairs
    longer than `max_len`; `multiplier` batches make an update, leftovers are dropped."""
    sizes = [max(s, t) + 1 for s, t in lengths if s <= max_len and t <= max_len]
    random.Random(seed).shuffle(sizes)
    batches, longest, count = 0, 0, 0
    for size in sizes:
        longest, count = max(longest, size), count + 1
        if longest * count >= batch_tokens:
            batches, longest, count = batches + 1, 0, 0
    batches += count > 0
    return max(1, batches // multiplier)


def fit_warmup(pace: float, seconds: float, share: float) -> dict[str, Any]:
    """Warm-up as `share` of the updates `seconds` hold at `pace` updates a second (a pace
    measured without validation: the run makes fewer, so its realized share is higher)."""
    expected = pace * seconds
    return {
        "pace_updates_per_second": round(pace, 4),
        "expected_updates": round(expected),
        "share": share,
        "warmup": max(1, round(share * expected)),
    }


# ---------------------------------------------------------------- Joey's log


def training_started(text: str) -> bool:
    """Whether Joey's log shows training begun (its first epoch)."""
    return TRAINING_STARTS.search(text) is not None


def validation_seconds(text: str) -> dict[str, Any]:
    """Joey's validations in its log and the seconds it printed for them: greedy generation
    (with the dev loss) plus scoring; writing the checkpoint after one is not included."""
    seconds = [float(s) for s in GENERATION.findall(text) + SCORING.findall(text)]
    return {"count": len(SCORING.findall(text)), "seconds": round(sum(seconds), 1)}


def interrupted_at(text: str) -> tuple[int, int] | None:
    """(epoch, update) at which Joey took SIGINT, if it did."""
    found = INTERRUPT.findall(text)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def dev_bleu(model_dir: Path) -> list[dict[str, float]]:
    """Joey's validation report: update and greedy dev BLEU."""
    report = model_dir / "validations.txt"
    rows = []
    for line in report.read_text(encoding="utf-8").splitlines() if report.is_file() else []:
        fields = dict(field.split(": ", 1) for field in line.split("\t") if ": " in field)
        rows.append({"step": int(fields["Steps"]), "dev_bleu": float(fields["bleu"])})
    return rows


# ---------------------------------------------------------------- inside Joey's venv


def patch_joey() -> None:
    """Joey 2.3's plateau schedule passes `verbose=False` to ReduceLROnPlateau, which torch
    2.13 no longer takes: it is dropped (neither configuration here uses that schedule)."""
    import inspect

    import joeynmt.builders
    from torch.optim import lr_scheduler

    if "verbose" in inspect.signature(lr_scheduler.ReduceLROnPlateau).parameters:
        return

    class ReduceLROnPlateau(lr_scheduler.ReduceLROnPlateau):
        def __init__(self, *args: Any, verbose: bool = False, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

    joeynmt.builders.ReduceLROnPlateau = ReduceLROnPlateau


def run_joey(arguments: list[str]) -> None:
    """`python -m joeynmt <arguments>`, patched."""
    patch_joey()
    from joeynmt.__main__ import main as joey_main

    sys.argv = ["joeynmt", *arguments]
    joey_main()


def build_vocab(config_path: Path, lengths_path: Path) -> None:
    """Joey's `scripts/build_vocab.py --joint` (v2.3) for a SentencePiece config: trained on
    both sides' training text as Joey pre-processes it (each side Moses-tokenized for its own
    language, as in training), with Joey's special symbols; then the pairs' lengths in pieces,
    for the validation frequency."""
    import sentencepiece as spm
    from joeynmt.config import _check_special_symbols, load_config
    from joeynmt.helpers import read_list_from_file, write_list_to_file
    from joeynmt.tokenizers import BasicTokenizer

    data = load_config(config_path)["data"]
    symbols = _check_special_symbols(data["special_symbols"])
    sides = []
    for side in (data["src"], data["trg"]):
        tokenizer = BasicTokenizer(
            level=side["level"],
            lowercase=side["lowercase"],
            normalize=side["normalize"],
            pretokenizer=side["tokenizer_cfg"]["pretokenizer"],
            lang=side["lang"],
        )
        lines = read_list_from_file(Path(f"{data['train']}.{side['lang']}"))
        sides.append([tokenizer.pre_process(line) for line in lines])
    cfg, model_file = data["src"]["tokenizer_cfg"], Path(data["src"]["tokenizer_cfg"]["model_file"])
    text = model_file.with_suffix(".train.txt")
    model_file.parent.mkdir(parents=True, exist_ok=True)
    write_list_to_file(text, sides[0] + sides[1])
    arguments = {
        "input": text,
        "model_prefix": model_file.with_suffix(""),
        "model_type": cfg["model_type"],
        "vocab_size": data["src"]["voc_limit"],
        "character_coverage": cfg["character_coverage"],
        "accept_language": f"{data['src']['lang']},{data['trg']['lang']}",
        **{f"{s}_piece": symbols[f"{s}_token"] for s in ("unk", "bos", "eos", "pad")},
        **{f"{s}_id": symbols[f"{s}_id"] for s in ("unk", "bos", "eos", "pad")},
        "vocabulary_output_piece_score": "false",
    }
    try:
        spm.SentencePieceTrainer.Train(" ".join(f"--{k}={v}" for k, v in arguments.items()))
    except RuntimeError as e:
        raise SystemExit(f"SentencePiece: {e}; pass a smaller --vocab-size") from None
    text.unlink()
    pieces = spm.SentencePieceProcessor(model_file=str(model_file))
    lengths = [[len(pieces.encode(s)), len(pieces.encode(t))] for s, t in zip(*sides, strict=True)]
    lengths_path.write_text(json.dumps(lengths), encoding="utf-8")


# ---------------------------------------------------------------- the run


def parse_cores(text: str) -> set[int]:
    """'0,1', '0-3' or '0' -> the CPU numbers."""
    try:
        ranges = [[int(n) for n in part.split("-")] for part in text.split(",")]
        return {cpu for r in ranges for cpu in range(r[0], r[-1] + 1)}
    except ValueError:
        raise SystemExit(f"--cores {text!r}: expected CPU numbers like 0,1 or 0-3") from None


def machine(cores: set[int], beside: str) -> dict[str, Any]:
    """The CPU as lscpu names it, the cores (a taskset list) and what ran beside."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    fields = {key.strip(): value.strip() for key, _, value in (x.partition(":") for x in lscpu)}
    return {
        "cpu": fields.get("Model name"),
        "cpu_family": fields.get("CPU family"),
        "cpu_model": fields.get("Model"),
        "cores": ",".join(map(str, sorted(cores))),
        "beside": beside,
    }


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def train_for(
    command: list[str], seconds: float, log: Path, env: dict[str, str], poll: float = 0.2
) -> dict[str, Any]:
    """Start Joey, start the clock when its log shows training begun, and SIGINT it after
    `seconds` (Joey saves latest.ckpt and exits). Joey gets SIGINT's default handling even
    where this script inherited it ignored (a job started with `&` by a shell script)."""
    launched, started, seen, stopped_by = time.monotonic(), None, "", "joey"
    with log.open("w", encoding="utf-8") as out, log.open(encoding="utf-8", errors="replace") as rd:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        while process.poll() is None:
            time.sleep(poll)
            if started is None:
                seen = seen[-200:] + rd.read()  # a line may arrive in pieces
                started = time.monotonic() if training_started(seen) else None
            elif time.monotonic() - started >= seconds:
                process.send_signal(signal.SIGINT)
                stopped_by = "clock"
                break
        stop = time.monotonic()
        try:
            process.wait(timeout=600)
        except subprocess.TimeoutExpired:
            process.kill()
            raise SystemExit(f"Joey did not exit within 10 minutes of SIGINT; see {log}") from None
    if process.returncode != 0 or started is None:
        raise SystemExit(f"Joey failed ({process.returncode}); end of {log}:\n{tail(log)}")
    return {
        "stopped_by": stopped_by,
        "startup_seconds": round(started - launched, 1),
        "train_seconds": round(stop - started, 1),
        "stop_seconds": round(time.monotonic() - stop, 1),
    }


class Joey:
    """Joey NMT in its venv, this file as its entry point, threads as many as the cores."""

    def __init__(self, venv: Path, cores: set[int]) -> None:
        self.python = str(venv / "bin" / "python")
        self.env = dict(
            os.environ, OMP_NUM_THREADS=str(len(cores)), MKL_NUM_THREADS=str(len(cores))
        )

    def run(self, log: Path, *arguments: str) -> float:
        """Run to completion, output to `log`; the seconds taken."""
        start = time.monotonic()
        with log.open("w", encoding="utf-8") as out:
            command = [self.python, __file__, *arguments]
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        if code.returncode != 0:
            raise SystemExit(f"{shlex.join(command)} failed; end of {log}:\n{tail(log)}")
        return time.monotonic() - start

    def versions(self) -> dict[str, str]:
        code = (
            "import json, joeynmt, torch, sentencepiece, sacrebleu; print(json.dumps({"
            "m.__name__: m.__version__ for m in (joeynmt, torch, sentencepiece, sacrebleu)}))"
        )
        done = subprocess.run([self.python, "-c", code], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"no Joey NMT in {self.python} (see --help): {done.stderr[-2000:]}")
        return json.loads(done.stdout)

    def train(self, config: dict[str, Any], directory: Path, seconds: float) -> dict[str, Any]:
        """Train from `config` (written to `directory`/train.yaml) for `seconds` of training."""
        path = directory / "train.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        command = [self.python, __file__, "--joey", "train", str(path), "--skip-test"]
        return train_for(command, seconds, directory / "train.out", self.env)


def probe_pace(joey: Joey, config: dict[str, Any], work: Path, seconds: float) -> dict[str, Any]:
    """Joey's updates a second over `seconds` of training (the same config, no validation)."""
    probe = json.loads(json.dumps(config))
    (work / "probe").mkdir()
    probe["model_dir"] = str(work / "probe" / "model")
    probe["training"]["validation_freq"] = NO_VALIDATION
    timing = joey.train(probe, work / "probe", seconds)
    stop = interrupted_at((work / "probe" / "train.out").read_text(encoding="utf-8"))
    if not stop or not stop[1]:
        raise SystemExit(f"the probe made no update in {seconds} s; see {work / 'probe'}")
    return {**timing, "updates": stop[1], "pace": stop[1] / timing["train_seconds"]}


def decode(joey: Joey, config: dict[str, Any], work: Path, beam: int) -> tuple[list[str], float]:
    """Joey's translations of `eval.<src>` (detokenized by Joey) from latest.ckpt with beam
    `beam`, and the seconds taken."""
    config = json.loads(json.dumps(config))
    config["data"]["test"] = str(work / "data" / "eval")
    del config["data"]["dev"]  # `joeynmt test` would decode it too
    config["testing"].update(load_model=str(work / "model" / "latest.ckpt"), beam_size=beam)
    path = work / "decode.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    seconds = joey.run(work / "decode.out", "--joey", "test", str(path), "-o", str(work / "hyp"))
    return (work / "hyp.test").read_text(encoding="utf-8").split("\n")[:-1], seconds


def scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """seq2seq's corpus scores (BLEU 13a, chrF, lowercased BLEU) plus BLEU with the intl
    tokenizer, each with its signature."""
    from seq2seq.metrics import corpus_scores

    result: dict[str, Any] = corpus_scores(hypotheses, references)
    intl = BLEU(tokenize="intl")
    result["bleu_intl"] = round(intl.corpus_score(hypotheses, [references]).score, 2)
    result["bleu_intl_signature"] = str(intl.get_signature())
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    from seq2seq.data.corpus import read_lines

    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cores = parse_cores(args.cores)
    os.sched_setaffinity(0, cores)  # Joey and SentencePiece inherit it
    joey = Joey(args.venv, cores)
    versions = joey.versions()
    ours = read_run(args.from_run) if args.from_run else None
    if ours and args.vocab_size:
        ours = dataclasses.replace(ours, vocab_size=args.vocab_size)
    vocab_size = ours.vocab_size if ours else args.vocab_size
    if not vocab_size:
        raise SystemExit("give --vocab-size or --from-run (its tokenizer.vocab_size)")
    (train, dev, test), (src, tgt) = CORPORA[args.corpus]
    src, tgt = args.src or src, args.tgt or tgt
    directory = args.data_dir / args.corpus
    raw = {
        role: {lang: read_lines(directory / f"{split}.{lang}.gz") for lang in (src, tgt)}
        for role, split in (("train", train), ("dev", dev), ("test", test))
    }
    raw["dev"] = dev_sample(raw["dev"], args.dev_lines)
    evaluated = "dev" if args.dev_trial else "test"
    work = args.work_dir.resolve()
    if work.exists():
        raise SystemExit(f"{work} exists (Joey does not overwrite); pass a new --work-dir")
    prepared, kept = prepare_text(raw, src, tgt, evaluated, work / "data")

    share = args.warmup_share if args.warmup_share is not None else 0.25
    fitted = args.config == "ours" or args.warmup_share is not None  # shipped: its own 4,000

    def build(warmup: int) -> tuple[dict[str, Any], dict[str, str]]:
        if args.config == "ours":
            config, reasons = ours_config(work, src, tgt, args.seed, ours, warmup)
        else:
            config, reasons = shipped_config(work, src, tgt, vocab_size, args.seed)
            if fitted:
                why = f"--warmup-share {share} of the updates Joey makes at its probed pace"
                apply(config, reasons, [("training.learning_rate_warmup", warmup, why)])
        apply(config, reasons, [(key, value, "--set: a dev trial") for key, value in args.set])
        return config, reasons

    config, reasons = build(args.warmup_steps or 1)
    (work / "vocab.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    vocab_seconds = joey.run(
        work / "build_vocab.log", "--build-vocab", str(work / "vocab.yaml"), str(work / "lengths")
    )
    lengths = json.loads((work / "lengths").read_text(encoding="utf-8"))
    training = config["training"]
    per_epoch = updates_per_epoch(
        lengths,
        training["batch_size"],
        training["batch_multiplier"],
        config["data"]["src"]["max_length"],
        args.seed,
    )
    schedule: dict[str, Any] = {"scheduling": training["scheduling"]}
    if fitted:
        if args.warmup_steps:
            schedule["warmup"] = args.warmup_steps
        else:
            probe = probe_pace(joey, config, work, args.probe_minutes * 60)
            schedule.update(fit_warmup(probe.pop("pace"), args.minutes * 60, share))
            schedule["probe"] = probe
        config, reasons = build(schedule["warmup"])
    set_validation_freq(config, reasons, per_epoch, ours.validate_every if ours else 1)

    trained = joey.train(config, work, args.minutes * 60)
    log = (work / "train.out").read_text(encoding="utf-8", errors="replace")
    updates = int((work / "model" / "latest.ckpt").resolve().stem)
    validation = validation_seconds(log)
    validation["share_of_clock"] = round(validation["seconds"] / trained["train_seconds"], 4)
    if fitted:
        schedule["warmup_share_of_updates_made"] = round(schedule["warmup"] / max(1, updates), 4)

    joey_output, decode_seconds = decode(joey, config, work, args.beam)
    hypotheses = restore_order(joey_output, kept, len(raw[evaluated][src]))
    write_lines(work / f"{evaluated}.hyp.{tgt}", hypotheses)
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": date,
        "machine": machine(cores, args.beside),
        "versions": versions,
        "precision": PRECISION,
        "batching": BATCHING,
        "corpus": {"name": args.corpus, "src": src, "tgt": tgt, "prepared": prepared},
        "dev_lines": args.dev_lines,
        "config": {
            "name": args.config,
            "shipped": JOEY_SOURCE,
            "from_run": ours.source if ours else None,
            "joey": config,
            "changed": changed_keys(config, reasons),
            "updates_per_epoch_estimate": per_epoch,
        },
        "schedule": schedule,
        "seed": args.seed,
        "minutes": args.minutes,
        "sentencepiece_seconds": round(vocab_seconds, 1),
        **trained,
        "updates": updates,
        "epochs": (interrupted_at(log) or (None,))[0],
        "validation": {**validation, "greedy_dev_bleu": dev_bleu(work / "model")},
        "evaluated_on": evaluated,
        "beam": args.beam,
        "decode_seconds": round(decode_seconds, 1),
        "hypotheses": str(work / f"{evaluated}.hyp.{tgt}"),
        "scores": scores(hypotheses, raw[evaluated][tgt]),
    }


def setting(text: str) -> tuple[str, Any]:
    """`--set training.batch_multiplier=1` -> ("training.batch_multiplier", 1)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. training.batch_size=4096")
    parsed = yaml.safe_load(value)
    if isinstance(parsed, str):  # YAML 1.1 reads 5e-4 as text
        try:
            return key, float(parsed)
        except ValueError:
            pass
    return key, parsed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", choices=("shipped", "ours"), required=True)
    p.add_argument("--from-run", type=Path, help="a seq2seq run directory (its config.yaml)")
    p.add_argument("--corpus", choices=sorted(CORPORA), required=True)
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--src", help="source language; the corpus's first by default")
    p.add_argument("--tgt", help="target language; the corpus's second by default")
    p.add_argument("--minutes", type=float, default=60.0, help="the training clock")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--cores", default="0", help="CPUs to pin to, e.g. 0,1; also the threads")
    p.add_argument("--beside", default="", help="what ran beside this run (recorded verbatim)")
    p.add_argument("--venv", type=Path, default=Path("/work/venvs/joeynmt"))
    p.add_argument("--work-dir", type=Path, required=True, help="a new directory")
    p.add_argument("--out", type=Path, help="the result JSON (default: <work-dir>/result.json)")
    p.add_argument("--vocab-size", type=int, help="joint SentencePiece pieces (default: the run's)")
    p.add_argument(
        "--warmup-share",
        type=float,
        help="the warm-up's share of the updates Joey makes (ours: 0.25 by default; shipped: "
        "its own 4,000 updates unless given)",
    )
    p.add_argument("--warmup-steps", type=int, help="ours: this warm-up, without a probe")
    p.add_argument(
        "--set",
        type=setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dev trial's change to the Joey config (dotted key, YAML value), recorded",
    )
    p.add_argument("--probe-minutes", type=float, default=3.0, help="ours: the pace probe")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--dev-lines", type=int, default=0, help="the dev sample's pairs (0: all)")
    p.add_argument("--dev-trial", action="store_true", help="score the dev sample, not test")
    return p


def main() -> None:
    if sys.argv[1:2] == ["--joey"]:  # inside Joey's venv
        run_joey(sys.argv[2:])
    elif sys.argv[1:2] == ["--build-vocab"]:  # inside Joey's venv
        build_vocab(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        args = parser().parse_args()
        if args.config == "ours" and not args.from_run:
            raise SystemExit("--config ours takes its settings from --from-run")
        result = run(args)
        out = args.out or args.work_dir / "result.json"
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(json.dumps({k: result[k] for k in ("updates", "validation", "scores")}))


if __name__ == "__main__":
    main()
