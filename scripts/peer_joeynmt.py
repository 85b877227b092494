r"""Joey NMT 2.3 as the peer of a seq2seq recipe: trained on the same corpus for the same wall
clock, its test output scored exactly as seq2seq scores its own (cased, detokenized sacreBLEU).

    python scripts/peer_joeynmt.py --corpus multi30k --src en --tgt de --minutes 60 --seed 1 \
        --cores 0 --work-dir /tmp/joey_m30k_ende_s1 --out joey_m30k_ende_s1.json

The starting point is the Transformer Joey NMT ships for its smallest real corpus (IWSLT14
de-en, about 160,000 pairs, with SentencePiece): `configs/iwslt14_deen_sp.yaml` of
joeynmt/joeynmt at tag v2.3 (commit c19c6c8438263d3ad01054742bf98ab1f1fa61b3, the 2.3.0
release; blob 013945e2). It is adapted only where Joey's documentation says a corpus needs it
(every change, with its reason, lands in the result JSON under `config.changed`):

- data: plain files, the corpus's languages, a joint SentencePiece model of `--vocab-size`
  pieces trained as Joey's `scripts/build_vocab.py --joint` trains it (on Joey's own
  pre-processed text), cased (the comparison is cased BLEU; IWSLT14 is scored lowercased);
- model size: from the benchmark closest in data size (FAQ: "check the benchmarks and their
  model and data sizes"): the 19M-parameter IWSLT14 Transformer of `configs/iwslt14_deen_bpe.yaml`
  (blob 81db0b9e); `--model-size` also takes the shipped size (`iwslt14_deen_sp`) and the
  smallest Transformer Joey ships (`transformer_small`, configs/transformer_small.yaml, blob
  bd7bddc7);
- `validation_freq`: once per epoch (FAQ: "validate at least once per epoch"), counted from the
  corpus's SentencePiece lengths as Joey's token batches fill;
- `max_output_length`: Joey's default (1.5 times the longest source of the batch) instead of
  IWSLT's 100 pieces, which would cut long sentences (FAQ: set it for the data);
- the machine: CPU, no fp16.

Optimizer, schedule, dropout and batch stay as shipped; `--set key=value` changes any key for
a dev trial, and the JSON names it. `--dev-lines N` validates on the seeded sample of N dev
pairs that seq2seq's `data.val_subset=N` decodes, so both toolkits validate at the same cost;
`--dev-trial` scores those pairs instead of the test set. Joey has no time limit: at
`--minutes` it gets SIGINT, which it handles by saving the current weights (`latest.ckpt`) and
exiting; the test set is then decoded from those weights (or its `best.ckpt`, `--checkpoint
best`) with beam 5.

Runs in two interpreters: this project's (orchestration and scoring) and Joey's own virtual
environment (`--venv`: SentencePiece training on Joey's pre-processing, training, decoding),
which calls this file back with `--build-vocab`. Joey pins an old protobuf, hence its own
environment; seq2seq is imported only where the orchestration uses it, as Joey's has none.
Joey 2.3.0 imports importlib_metadata without declaring it, and calls SentencePiece's
SetVocabulary, which sentencepiece 0.2.1 removed:

    python3.11 -m venv /work/venvs/joeynmt
    /work/venvs/joeynmt/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu \
        torch joeynmt==2.3.0 importlib_metadata sentencepiece==0.2.0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from sacrebleu.metrics import BLEU

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
DEFAULT_VENV = Path("/work/venvs/joeynmt")

JOEY_SOURCE = {
    "repository": "https://github.com/joeynmt/joeynmt",
    "tag": "v2.3",
    "commit": "c19c6c8438263d3ad01054742bf98ab1f1fa61b3",
    "version": "2.3.0",
    "config": "configs/iwslt14_deen_sp.yaml",
    "config_blob": "013945e2dd57061e152023a9f967a90dac8725a7",
    "model_size_config": "configs/iwslt14_deen_bpe.yaml",
    "model_size_config_blob": "81db0b9e728302d3c81b00510b8deb26b4df1b62",
    "small_model_size_config": "configs/transformer_small.yaml",
    "small_model_size_config_blob": "bd7bddc7694ad32dbc91ae60b4682096ab62dc37",
}

# configs/iwslt14_deen_sp.yaml at the commit above, its comments left out
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
    dataset_cfg:
        name: "de-en"
        trust_remote_code: True
    src:
        lang: "de"
        max_length: 512
        lowercase: True
        normalize: False
        level: "bpe"
        voc_limit: 32000
        voc_min_freq: 1
        voc_file: "test/data/iwslt14/sp.vocab"
        tokenizer_type: "sentencepiece"
        tokenizer_cfg:
            model_file: "test/data/iwslt14/sp.model"
            model_type: "unigram"
            character_coverage: 1.0
            alpha: 0.1
            pretokenizer: "moses"
    trg:
        lang: "en"
        max_length: 512
        lowercase: True
        normalize: False
        level: "bpe"
        voc_limit: 32000
        voc_min_freq: 1
        voc_file: "test/data/iwslt14/sp.vocab"
        tokenizer_type: "sentencepiece"
        tokenizer_cfg:
            model_file: "test/data/iwslt14/sp.model"
            model_type: "unigram"
            character_coverage: 1.0
            alpha: 0.1
            pretokenizer: "moses"
    special_symbols:
        unk_token: "<unk>"
        unk_id: 0
        pad_token: "<pad>"
        pad_id: 1
        bos_token: "<s>"
        bos_id: 2
        eos_token: "</s>"
        eos_id: 3

testing:
    n_best: 1
    beam_size: 5
    beam_alpha: 1.0
    batch_size: 1024
    batch_type: "token"
    max_output_length: 100
    eval_metrics: ["bleu"]
    sacrebleu_cfg:
        tokenize: "13a"
        lowercase: True

training:
    optimizer: "adamw"
    normalization: "tokens"
    adam_betas: [0.9, 0.999]
    scheduling: "warmupinversesquareroot"
    learning_rate_warmup: 4000
    learning_rate: 0.0002
    learning_rate_min: 0.00000001
    weight_decay: 0.0
    label_smoothing: 0.1
    loss: "crossentropy"
    batch_size: 8192
    batch_type: "token"
    batch_multiplier: 4
    early_stopping_metric: "bleu"
    epochs: 100
    validation_freq: 1000
    logging_freq: 100
    overwrite: False
    shuffle: True
    print_valid_sents: [0, 1, 2, 3]
    keep_best_ckpts: 5

model:
    initializer: "xavier_uniform"
    bias_initializer: "zeros"
    init_gain: 1.0
    embed_initializer: "xavier_uniform"
    embed_init_gain: 1.0
    tied_embeddings: True
    tied_softmax: True
    encoder:
        type: "transformer"
        num_layers: 6
        num_heads: 8
        embeddings:
            embedding_dim: 512
            scale: True
            dropout: 0.
        hidden_size: 512
        ff_size: 2048
        dropout: 0.1
        layer_norm: "pre"
        activation: "relu"
    decoder:
        type: "transformer"
        num_layers: 6
        num_heads: 8
        embeddings:
            embedding_dim: 512
            scale: True
            dropout: 0.
        hidden_size: 512
        ff_size: 2048
        dropout: 0.1
        layer_norm: "pre"
        activation: "relu"
"""

# (width, feed-forward width, heads, layers) of the Transformers Joey ships for IWSLT14
MODEL_SIZES = {
    "iwslt14_deen_bpe": (256, 1024, 4, 6),  # its benchmark Transformer, 19M parameters
    "iwslt14_deen_sp": (512, 2048, 8, 6),  # the shipped size
    "transformer_small": (64, 128, 4, 3),  # the smallest Transformer Joey ships
}
DEFAULT_MODEL_SIZE = "iwslt14_deen_bpe"

REASONS = {
    "name": "names this run",
    "model_dir": "this run's work directory",
    "use_cuda": "the comparison runs on a CPU",
    "fp16": "the comparison runs on a CPU (Joey's fp16 is CUDA-only)",
    "random_seed": "--seed",
    "data.train": "the corpus's prepared plain-text files",
    "data.dev": "the corpus's prepared plain-text files",
    "data.test": "decoded after training from its own config (decode.yaml), not loaded here",
    "data.dataset_type": "plain text files instead of the Hugging Face IWSLT14 download",
    "data.dataset_cfg": "belongs to the Hugging Face download",
    "lang": "the corpus's language",
    "lowercase": "the comparison is cased BLEU (IWSLT14 is scored lowercased)",
    "voc_limit": "--vocab-size: the joint SentencePiece vocabulary for this corpus",
    "voc_file": "the joint SentencePiece vocabulary trained for this corpus",
    "model_file": "the joint SentencePiece model trained for this corpus",
    "testing.max_output_length": (
        "Joey's default (1.5 x the longest source of the batch): IWSLT's 100 pieces would cut "
        "long sentences (FAQ: set it for the data)"
    ),
    "testing.sacrebleu_cfg.lowercase": "Joey's dev BLEU cased, as the comparison's",
    "training.validation_freq": (
        "once per epoch (FAQ: 'validate at least once per epoch'), counted from this corpus's "
        "SentencePiece lengths"
    ),
    "training.logging_freq": "Joey requires it to divide validation_freq",
    "model_size": (
        "--model-size: Joey's FAQ sizes a model by the benchmarks and their data sizes (the "
        "IWSLT14 Transformer by default)"
    ),
}
SIZE_KEYS = ("embedding_dim", "hidden_size", "ff_size", "num_heads", "num_layers")

# Joey reads its files with str.splitlines, which also breaks lines at these characters
SPLITLINES_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


@dataclass(frozen=True)
class Corpus:
    splits: tuple[str, str, str]  # train, dev, test
    pair: tuple[str, str]


CORPORA = {
    "multi30k": Corpus(("train", "val", "test_2016_flickr"), ("en", "de")),
    "autshumato_en_nso": Corpus(("train", "dev", "test"), ("en", "nso")),
}


# ---------------------------------------------------------------- text for Joey's reader


def joey_line(line: str) -> str:
    """A line Joey reads back as one line: splitlines' other line breaks become spaces."""
    return SPLITLINES_BREAKS.sub(" ", line)


def training_pairs(sources: list[str], targets: list[str]) -> tuple[list[str], list[str], int]:
    """The pairs Joey can train or validate on, and how many were dropped: Joey drops a blank
    line of each side on its own (misaligning the rest) and refuses whitespace-only lines, so
    a pair with a blank side goes."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source lines but {len(targets)} target lines")
    kept = [(s, t) for s, t in zip(sources, targets, strict=True) if s.strip() and t.strip()]
    return (
        [joey_line(s) for s, _ in kept],
        [joey_line(t) for _, t in kept],
        len(sources) - len(kept),
    )


def decodable_sources(sources: list[str]) -> tuple[list[str], list[int]]:
    """The source lines Joey can decode and their line indices: the others (blank) get an
    empty translation (restore_order)."""
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


# ---------------------------------------------------------------- Joey's configuration


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value (lists are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`key=value` (value as YAML) from --set."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {pair!r}: expected key=value, e.g. training.batch_size=4096")
        overrides[key] = yaml.safe_load(value)
    return overrides


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    node = config
    *parents, leaf = key.split(".")
    for i, part in enumerate(parents):
        if not isinstance(node.get(part), dict):
            raise SystemExit(
                f"--set {key}: Joey's config has no section {'.'.join(parents[: i + 1])}; "
                "see configs/iwslt14_deen_sp.yaml for its keys"
            )
        node = node[part]
    node[leaf] = value


@dataclass(frozen=True)
class Paths:
    """Where a run's Joey files live."""

    work: Path

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def model(self) -> Path:
        return self.work / "model"

    @property
    def spm_model(self) -> Path:
        return self.work / "spm" / "sp.model"

    @property
    def spm_vocab(self) -> Path:
        return self.work / "spm" / "sp.vocab"

    @property
    def train_config(self) -> Path:
        return self.work / "train.yaml"

    @property
    def decode_config(self) -> Path:
        return self.work / "decode.yaml"


def adapt_config(
    paths: Paths,
    src: str,
    tgt: str,
    vocab_size: int,
    seed: int,
    model_size: str,
    validation_freq: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The shipped configuration adapted to a corpus and a CPU (module docstring); the
    validation frequency stays as shipped until the corpus's lengths give it."""
    config = yaml.safe_load(SHIPPED_YAML)
    config["name"] = f"peer_{paths.work.name}"
    config["model_dir"] = str(paths.model)
    config["use_cuda"] = False
    config["fp16"] = False
    config["random_seed"] = seed
    data = config["data"]
    data["train"] = str(paths.data / "train")
    data["dev"] = str(paths.data / "dev")
    del data["test"], data["dataset_cfg"]
    data["dataset_type"] = "plain"
    for side, lang in (("src", src), ("trg", tgt)):
        data[side]["lang"] = lang
        data[side]["lowercase"] = False
        data[side]["voc_limit"] = vocab_size
        data[side]["voc_file"] = str(paths.spm_vocab)
        data[side]["tokenizer_cfg"]["model_file"] = str(paths.spm_model)
    del config["testing"]["max_output_length"]
    config["testing"]["sacrebleu_cfg"]["lowercase"] = False
    width, ff_width, heads, layers = MODEL_SIZES[model_size]
    for part in ("encoder", "decoder"):
        stack = config["model"][part]
        stack["embeddings"]["embedding_dim"] = stack["hidden_size"] = width
        stack["ff_size"] = ff_width
        stack["num_heads"] = heads
        stack["num_layers"] = layers
    training = config["training"]
    if validation_freq is not None:
        training["validation_freq"] = validation_freq
        training["logging_freq"] = max(
            d for d in range(1, training["logging_freq"] + 1) if validation_freq % d == 0
        )
    for key, value in (overrides or {}).items():
        set_key(config, key, value)
    return config


def reason(key: str, overrides: dict[str, Any]) -> str:
    if key in overrides:
        return "--set on the command line"
    last = key.rsplit(".", 1)[-1]
    if last in SIZE_KEYS:
        return REASONS["model_size"]
    for candidate in (key, key.rsplit(".", 1)[0], last):
        if candidate in REASONS:
            return REASONS[candidate]
    raise KeyError(f"no reason recorded for changing {key}")


def changed_keys(config: dict[str, Any], overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """Every key whose value differs from the shipped file (removed: value None, removed
    True), with its reason."""
    shipped, adapted = flatten(yaml.safe_load(SHIPPED_YAML)), flatten(config)
    changes = []
    for key in sorted(shipped.keys() | adapted.keys()):
        if shipped.get(key) == adapted.get(key) and (key in shipped) == (key in adapted):
            continue
        change = {"key": key, "shipped": shipped.get(key), "value": adapted.get(key)}
        if key not in adapted:
            change["removed"] = True
        change["reason"] = reason(key, overrides)
        changes.append(change)
    return changes


def updates_per_epoch(
    lengths: list[tuple[int, int]],
    batch_tokens: int,
    multiplier: int,
    max_lengths: tuple[int, int],
    seed: int,
) -> int:
    """Updates in one epoch as Joey's TokenBatchSampler fills batches (no bucketing: a batch
    closes when its longest pair times its size reaches `batch_tokens`) over a shuffled
    order, without the pairs longer than `max_lengths` (source, target); `multiplier` batches
    make an update and leftovers are dropped."""
    max_src, max_tgt = max_lengths
    sizes = [max(s + 1, t + 1) for s, t in lengths if s <= max_src and t <= max_tgt]
    random.Random(seed).shuffle(sizes)
    batches, longest, count = 0, 0, 0
    for size in sizes:
        longest, count = max(longest, size), count + 1
        if longest * count >= batch_tokens:
            batches, longest, count = batches + 1, 0, 0
    batches += count > 0
    return max(1, batches // multiplier)


# ---------------------------------------------------------------- inside Joey's venv


def build_vocab(config_path: Path, lengths_path: Path) -> None:
    """Joey's `scripts/build_vocab.py --joint` (v2.3) for a SentencePiece config: the model is
    trained on both sides' training text as Joey pre-processes it (Moses tokenization here),
    with Joey's special symbols and its SentencePiece options; then the pairs' lengths in
    pieces, for the validation frequency. Runs in Joey's venv. Unlike the script, each side is
    pre-tokenized for its own language, as Joey's training does."""
    import sentencepiece as spm
    from joeynmt.config import _check_special_symbols, load_config
    from joeynmt.helpers import read_list_from_file, write_list_to_file
    from joeynmt.tokenizers import BasicTokenizer

    config = load_config(config_path)
    data = config["data"]
    symbols = SimpleNamespace(**_check_special_symbols(data["special_symbols"]))
    sides = []
    for side in (data["src"], data["trg"]):
        tokenizer = BasicTokenizer(
            level=side["level"],
            lowercase=side.get("lowercase", False),
            normalize=side.get("normalize", False),
            pretokenizer=side["tokenizer_cfg"].get("pretokenizer", "none").lower(),
            lang=side["lang"],
        )
        lines = read_list_from_file(Path(f"{data['train']}.{side['lang']}"))
        sides.append([tokenizer.pre_process(line) for line in lines])
    model_file = Path(data["src"]["tokenizer_cfg"]["model_file"])
    model_file.parent.mkdir(parents=True, exist_ok=True)
    text = model_file.with_suffix(".train.txt")
    write_list_to_file(text, sides[0] + sides[1])
    cfg = data["src"]["tokenizer_cfg"]
    arguments = [
        f"--input={text}",
        f"--model_prefix={model_file.with_suffix('')}",
        f"--model_type={cfg.get('model_type', 'unigram')}",
        f"--vocab_size={data['src']['voc_limit']}",
        f"--character_coverage={cfg.get('character_coverage', 1.0)}",
        f"--accept_language={data['src']['lang']},{data['trg']['lang']}",
        f"--unk_piece={symbols.unk_token}",
        f"--bos_piece={symbols.bos_token}",
        f"--eos_piece={symbols.eos_token}",
        f"--pad_piece={symbols.pad_token}",
        f"--unk_id={symbols.unk_id}",
        f"--bos_id={symbols.bos_id}",
        f"--eos_id={symbols.eos_id}",
        f"--pad_id={symbols.pad_id}",
        "--vocabulary_output_piece_score=false",
    ]
    try:
        spm.SentencePieceTrainer.Train(" ".join(arguments))
    except RuntimeError as e:
        raise SystemExit(
            f"SentencePiece could not build {data['src']['voc_limit']} pieces from "
            f"{data['train']}.*: {str(e).rstrip('.')}. Pass a smaller --vocab-size."
        ) from None
    text.unlink()
    vocab = model_file.with_suffix(".vocab")
    if vocab != Path(data["src"]["voc_file"]):
        raise SystemExit(f"voc_file must be {vocab}, SentencePiece's vocabulary beside its model")
    pieces = spm.SentencePieceProcessor(model_file=str(model_file))
    lengths = [
        [len(pieces.encode(s)), len(pieces.encode(t))]
        for s, t in zip(sides[0], sides[1], strict=True)
    ]
    lengths_path.write_text(json.dumps(lengths), encoding="utf-8")


# ---------------------------------------------------------------- the run


def parse_cores(text: str) -> set[int]:
    """'0,1', '0-3' or '0' -> the CPU numbers."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            cores.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise SystemExit(f"--cores {text!r}: expected CPU numbers like 0,1 or 0-3") from None
    available = os.sched_getaffinity(0)
    if not cores <= available:
        raise SystemExit(
            f"--cores {text}: CPUs {sorted(cores - available)} are not available to this "
            f"process (it may use {sorted(available)})"
        )
    return cores


def machine(cores: set[int]) -> dict[str, Any]:
    """The CPU as lscpu names it, whether it has bf16 units, and the cores used."""
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("Flags", "").split())
    return {
        "cpu": fields.get("Model name"),
        "cpu_family": fields.get("CPU family"),
        "cpu_model": fields.get("Model"),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "amx_tile": "amx_tile" in flags,
        "cores": sorted(cores),
        "threads": len(cores),
    }


def venv_versions(python: Path) -> dict[str, str]:
    code = (
        "import json, joeynmt, torch, sentencepiece, sacrebleu; print(json.dumps({"
        "'joeynmt': joeynmt.__version__, 'torch': torch.__version__, "
        "'sentencepiece': sentencepiece.__version__, 'sacrebleu': sacrebleu.__version__}))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"Joey NMT does not import in {python}: {done.stderr.strip()[-2000:]}\n"
            "Create it as this script's docstring says (python scripts/peer_joeynmt.py --help)"
        )
    return json.loads(done.stdout)


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def corpus_files(args: argparse.Namespace) -> tuple[dict[str, dict[str, Path]], str, str]:
    """{split role: {lang: file}} of the corpus, and its source and target languages."""
    if args.corpus in CORPORA:
        known = CORPORA[args.corpus]
        directory, names, pair = args.data_dir / args.corpus, known.splits, known.pair
    else:
        directory, names, pair = Path(args.corpus), ("train", "dev", "test"), (None, None)
    names = tuple(args.split_names or names)
    src, tgt = args.src or pair[0], args.tgt or pair[1]
    if not src or not tgt:
        raise SystemExit(f"--corpus {args.corpus}: give the languages with --src and --tgt")
    files: dict[str, dict[str, Path]] = {}
    for role, name in zip(("train", "dev", "test"), names, strict=True):
        files[role] = {}
        for lang in (src, tgt):
            candidates = [directory / f"{name}.{lang}", directory / f"{name}.{lang}.gz"]
            found = [path for path in candidates if path.is_file()]
            if not found:
                raise SystemExit(
                    f"--corpus {args.corpus}: neither {candidates[0]} nor {candidates[1].name} "
                    "exists; give the corpus directory (files <split>.<lang>[.gz]), the splits "
                    "with --split-names and the languages with --src/--tgt"
                )
            files[role][lang] = found[0]
    return files, src, tgt


def run_logged(command: list[str], log: Path, env: dict[str, str]) -> float:
    """Run to completion, output to `log`; seconds taken. A failure shows the log's end."""
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({code}); end of {log}:\n{tail(log)}")
    return time.monotonic() - start


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def train_for(command: list[str], seconds: float, log: Path, env: dict[str, str]) -> dict[str, Any]:
    """Train until Joey ends or the clock does; then SIGINT, which Joey answers by saving the
    current weights as latest.ckpt and exiting. Joey gets SIGINT's default handling even where
    this script was started with it ignored (a job started with `&` by a shell script), where
    Python would ignore it too and Joey train on."""
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            process.wait(timeout=seconds)
            stopped_by = "joey"
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            stopped_by = "clock"
        stop = time.monotonic()
        try:
            process.wait(timeout=600)
        except subprocess.TimeoutExpired:
            process.kill()
            raise SystemExit(
                f"Joey NMT did not exit within 10 minutes of SIGINT; see {log}"
            ) from None
    if process.returncode != 0:
        raise SystemExit(
            f"Joey NMT training failed ({process.returncode}); a budget that ends before its "
            f"first update stops it while it loads the data. End of {log}:\n{tail(log)}"
        )
    return {
        "stopped_by": stopped_by,
        "train_seconds": round(stop - start, 1),
        "stop_seconds": round(time.monotonic() - stop, 1),
    }


def validations(model_dir: Path) -> list[dict[str, float]]:
    """Joey's validation report: step and greedy dev BLEU (Joey's own sacreBLEU call, on its
    post-processed references)."""
    report = model_dir / "validations.txt"
    if not report.is_file():
        return []
    rows = []
    for line in report.read_text(encoding="utf-8").splitlines():
        fields = dict(field.split(": ", 1) for field in line.split("\t") if ": " in field)
        rows.append({"step": int(fields["Steps"]), "dev_bleu": float(fields["bleu"])})
    return rows


def epochs_done(log: Path) -> int | None:
    text = log.read_text(encoding="utf-8", errors="replace")
    interrupted = re.findall(r"Interrupt at epoch (\d+), step (\d+)", text)
    if interrupted:
        return int(interrupted[-1][0])
    started = re.findall(r"EPOCH (\d+)", text)
    return int(started[-1]) if started else None


def choose_checkpoint(model_dir: Path, wanted: str) -> dict[str, Any]:
    """The weights to decode: the latest (at the stop), or Joey's best validated ones."""
    best = model_dir / "best.ckpt"
    if wanted == "best" and best.exists():
        which, why = "best", "--checkpoint best: Joey's best greedy dev BLEU among its validations"
    else:
        which, why = (
            "latest",
            (
                "the weights at the stop: Joey validates once an epoch, so its best.ckpt predates "
                "the stop, and an hour on a CPU ends far from convergence"
            ),
        )
        if wanted == "best":
            why = "no validation ran before the stop, so no best.ckpt: " + why
    path = (model_dir / f"{which}.ckpt").resolve()
    return {"which": which, "path": str(path), "step": int(path.stem), "reason": why}


def scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """seq2seq's corpus scores (BLEU 13a, chrF, lowercased BLEU) plus BLEU with the intl
    tokenizer, each with its signature."""
    from seq2seq.metrics import corpus_scores

    result: dict[str, Any] = corpus_scores(hypotheses, references)
    intl = BLEU(tokenize="intl")
    result["bleu_intl"] = round(intl.corpus_score(hypotheses, [references]).score, 2)
    result["bleu_intl_signature"] = str(intl.get_signature())
    return result


def dev_sample(dev: dict[str, list[str]], lines: int) -> dict[str, list[str]]:
    """The dev pairs Joey validates on (and a dev trial scores): all, or the seeded random
    sample of `lines` pairs that seq2seq's data.val_subset decodes, so that both toolkits
    validate on the same pairs at the same cost."""
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


def decode(
    python: Path, paths: Paths, checkpoint: str, beam: int, env: dict[str, str]
) -> tuple[list[str], float]:
    """Joey's translations of `eval.<src>` (detokenized by Joey: SentencePiece, then Moses)
    with the training config's test settings, `checkpoint` and `beam`; and the seconds."""
    config = yaml.safe_load(paths.train_config.read_text(encoding="utf-8"))
    config["data"]["test"] = str(paths.data / "eval")
    del config["data"]["dev"]  # `joeynmt test` would decode it too
    config["testing"]["load_model"] = checkpoint
    config["testing"]["beam_size"] = beam
    paths.decode_config.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    output = paths.work / "hyp"
    command = ["-m", "joeynmt", "test", str(paths.decode_config), "-o", str(output)]
    seconds = run_logged([str(python), *command], paths.work / "decode.out", env)
    return output.with_suffix(".test").read_text(encoding="utf-8").split("\n")[:-1], seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    from seq2seq.data.corpus import read_lines

    cores = parse_cores(args.cores)
    os.sched_setaffinity(0, cores)  # Joey and SentencePiece inherit it
    env = dict(os.environ, OMP_NUM_THREADS=str(len(cores)), MKL_NUM_THREADS=str(len(cores)))
    python = args.venv / "bin" / "python"
    versions = venv_versions(python)
    files, src, tgt = corpus_files(args)
    paths = Paths(args.work_dir.resolve())
    if paths.model.exists():
        raise SystemExit(f"{paths.model} exists (Joey does not overwrite); pass a new --work-dir")
    overrides = parse_overrides(args.set)

    raw = {
        role: {lang: read_lines(path) for lang, path in pair.items()}
        for role, pair in files.items()
    }
    raw["dev"] = dev_sample(raw["dev"], args.dev_lines)
    evaluated = "dev" if args.dev_trial else "test"
    prepared, kept = prepare_text(raw, src, tgt, evaluated, paths.data)

    def write_config(validation_freq: int | None) -> dict[str, Any]:
        config = adapt_config(
            paths, src, tgt, args.vocab_size, args.seed, args.model_size, validation_freq, overrides
        )
        paths.train_config.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return config

    first = write_config(None)
    lengths_file = paths.work / "train_lengths.json"
    vocab_seconds = run_logged(
        [str(python), __file__, "--build-vocab", str(paths.train_config), str(lengths_file)],
        paths.work / "build_vocab.log",
        env,
    )
    lengths = [tuple(pair) for pair in json.loads(lengths_file.read_text(encoding="utf-8"))]
    per_epoch = updates_per_epoch(
        lengths,
        first["training"]["batch_size"],
        first["training"]["batch_multiplier"],
        (first["data"]["src"]["max_length"], first["data"]["trg"]["max_length"]),
        args.seed,
    )
    config = write_config(overrides.get("training.validation_freq", per_epoch))

    trained = train_for(
        [str(python), "-m", "joeynmt", "train", str(paths.train_config), "--skip-test"],
        args.minutes * 60,
        paths.work / "train.out",
        env,
    )
    checkpoint = choose_checkpoint(paths.model, args.checkpoint)

    joey_output, decode_seconds = decode(python, paths, checkpoint["path"], args.beam, env)
    hypotheses = restore_order(joey_output, kept, len(raw[evaluated][src]))
    write_lines(paths.work / f"{evaluated}.hyp.{tgt}", hypotheses)

    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine(cores),
        "versions": versions,
        "corpus": {
            "name": args.corpus,
            "src": src,
            "tgt": tgt,
            "files": {
                role: {lang: str(p) for lang, p in pair.items()} for role, pair in files.items()
            },
            "prepared": prepared,
            "dev_lines": args.dev_lines,
        },
        "config": {
            "shipped": JOEY_SOURCE,
            "model_size": args.model_size,
            "changed": changed_keys(config, overrides),
            "train_config": str(paths.train_config),
            "decode_config": str(paths.decode_config),
            "updates_per_epoch_estimate": per_epoch,
        },
        "seed": args.seed,
        "minutes": args.minutes,
        "sentencepiece_seconds": round(vocab_seconds, 1),
        **trained,
        "updates": int((paths.model / "latest.ckpt").resolve().stem),
        "epochs": epochs_done(paths.work / "train.out"),
        "validations": validations(paths.model),
        "checkpoint": checkpoint,
        "evaluated_on": evaluated,
        "beam": args.beam,
        "decode_seconds": round(decode_seconds, 1),
        "hypotheses": str(paths.work / f"{evaluated}.hyp.{tgt}"),
        "scores": scores(hypotheses, raw[evaluated][tgt]),
    }


def write_json(path: Path, result: dict[str, Any]) -> None:
    from seq2seq.io import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def parser() -> argparse.ArgumentParser:
    shipped = yaml.safe_load(SHIPPED_YAML)
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--corpus",
        help=f"{' or '.join(CORPORA)} (in --data-dir), or a directory of <split>.<lang>[.gz] files",
    )
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument(
        "--split-names", nargs=3, metavar=("TRAIN", "DEV", "TEST"), help="file stems of the splits"
    )
    p.add_argument("--src", help="source language (file suffix); the corpus's first by default")
    p.add_argument("--tgt", help="target language (file suffix); the corpus's second by default")
    p.add_argument("--minutes", type=float, default=60.0, help="training wall clock")
    p.add_argument("--seed", type=int, default=shipped["random_seed"])
    p.add_argument("--cores", default="0", help="CPUs to pin to, e.g. 0,1 or 0; also the threads")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="Joey NMT 2.3's environment")
    p.add_argument("--work-dir", type=Path, help="a new directory for this run's files (required)")
    p.add_argument("--out", type=Path, help="the result JSON (default: <work-dir>/result.json)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=shipped["data"]["src"]["voc_limit"],
        help="joint SentencePiece pieces (the shipped 32000 is more than a small corpus holds)",
    )
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default=DEFAULT_MODEL_SIZE)
    p.add_argument("--beam", type=int, default=shipped["testing"]["beam_size"])
    p.add_argument(
        "--checkpoint",
        choices=("latest", "best"),
        default="latest",
        help="decode the weights at the stop (default) or Joey's best validated ones",
    )
    p.add_argument(
        "--dev-trial",
        action="store_true",
        help="decode and score the dev split instead of the test split (choosing settings)",
    )
    p.add_argument(
        "--dev-lines",
        type=int,
        default=0,
        help="validate on (and score a dev trial on) the seeded sample of this many dev pairs "
        "that seq2seq's data.val_subset draws; 0: the whole dev split",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a key of Joey's config, e.g. training.batch_multiplier=1 (repeatable)",
    )
    p.add_argument(
        "--build-vocab",
        nargs=2,
        type=Path,
        metavar=("CONFIG", "LENGTHS"),
        help="internal: the SentencePiece step, run inside Joey's venv",
    )
    return p


def main() -> None:
    args = parser().parse_args()
    if args.build_vocab:
        build_vocab(*args.build_vocab)
        return
    if not args.corpus or not args.work_dir:
        raise SystemExit("--corpus and --work-dir are required")
    out = args.out or args.work_dir / "result.json"
    result = run(args)
    write_json(out, result)
    print(
        json.dumps({k: result[k] for k in ("updates", "epochs", "checkpoint", "scores")}, indent=2)
    )


if __name__ == "__main__":
    main()
