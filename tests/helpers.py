"""Helpers shared by the test modules: composing configs, running entry points, small corpora.

Fixtures live in conftest.py; plain functions live here and are imported as `from helpers
import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from commands import ForkedPython
from hydra import compose, initialize_config_dir

from seq2seq.config import CONF_DIR, RootConfig, config_to_dict, group_config, validate_config
from seq2seq.data.corpus import read_lines
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from seq2seq.metrics import corpus_scores

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]  # the checkout
SHARED_DATA = Path(os.environ.get("SEQ2SEQ_SHARED_DATA", ROOT.parent / "shared" / "data"))
# what the model and search receive from the tokenizer: Transformer(..., **SPECIAL_IDS)
SPECIAL_IDS = {"pad_id": Tokenizer.pad_id, "bos_id": Tokenizer.bos_id, "eos_id": Tokenizer.eos_id}


def run(
    module: str,
    cwd: Path,
    *overrides: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    console_script: bool = False,
    fresh_interpreter: bool = False,
) -> subprocess.CompletedProcess:
    """`python -m seq2seq.<module> <overrides>` in `cwd`, output captured; `env` is added to
    this process's environment. It runs forked from a process that has imported torch and
    Lightning already (tests/commands.py); `fresh_interpreter` starts a new interpreter instead,
    for tests of what happens before the command runs. `console_script`: start it as
    `seq2seq-<module>`, a fresh interpreter too."""
    if not (fresh_interpreter or console_script):
        return python("-m", f"seq2seq.{module}", *overrides, cwd=cwd, stdin=stdin, env=env)
    if console_script:
        command = [str(Path(sys.executable).with_name(f"seq2seq-{module}"))]
    else:
        command = [sys.executable, "-m", f"seq2seq.{module}"]
    return subprocess.run(
        [*command, *overrides],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        env=None if env is None else {**os.environ, **env},
    )


def python(
    *arguments: str | Path,
    cwd: Path | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """`python <arguments>` (`-m module ...` or `script.py ...`) in `cwd`, output captured, as
    subprocess.run would start it but forked from a process that has imported torch and
    Lightning already (tests/commands.py): 9-10 s less per command on a 2-core machine."""
    child = start_python(*arguments, cwd=cwd, stdin=stdin, env=env)
    stdout, stderr = child.communicate(timeout)
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def start_python(
    *arguments: str | Path,
    cwd: Path | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> ForkedPython:
    """python() started and left running, as subprocess.Popen leaves it."""
    environ = {**os.environ, **(env or {})}
    return ForkedPython([str(a) for a in arguments], cwd, stdin, environ)


def compose_config(
    overrides: list[str] | None = None, config_name: str = "train", schema: type = RootConfig
):
    """Compose a root config of seq2seq/conf/ as the entry points do, checked against `schema`."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate_config(compose(config_name, overrides=overrides or []), schema)


def differing_settings(first: RootConfig, second: RootConfig) -> set[str]:
    """The dotted keys (e.g. "optim.lr") whose values differ between two train configs: what
    one preset changes of another, whatever file each value comes from."""

    def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                found.update(leaves(value, f"{prefix}{key}."))
            else:
                found[f"{prefix}{key}"] = value
        return found

    a, b = (leaves(config_to_dict(config)) for config in (first, second))
    return {key for key in a.keys() | b.keys() if a.get(key, "<absent>") != b.get(key, "<absent>")}


def config_of(option: str, schema: type, **fields: Any) -> Any:
    """A group option of seq2seq/conf/ (e.g. "decoding/beam") with `fields` replaced: tests take
    their defaults from the YAML files, as users do."""
    return replace(group_config(option, schema), **fields)


def write_lines(path: Path, lines: list[str]) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def random_batch(vocab: int) -> tuple:
    """A fixed random (src, tgt_in) pair of batches: 3 sentences, one with source padding."""
    import torch

    from seq2seq.data.tokenizer import BOS_ID, PAD_ID

    torch.manual_seed(1)
    src = torch.randint(4, vocab, (3, 8))
    src[1, 5:] = PAD_ID
    tgt = torch.randint(4, vocab, (3, 7))
    tgt[:, 0] = BOS_ID
    return src, tgt


SMALL_MODEL = dict(d_model=32, heads=4, encoder_layers=1, decoder_layers=2, ffn_dim=64, dropout=0.0)


def wired_model(
    decoder_self: tuple[str, str] = ("target", "target"),
    cross: tuple[str, str] = ("target", "source"),
    score: str = "scaled_dot",
    *,
    encoder_score: str | None = None,
    cross_heads: int | None = None,
    allow_future_leak: bool = False,
    vocab: int = 40,
    **model_fields: Any,
):
    """A small Transformer (seed 0, eval mode) with the given attention wiring: (query,
    key_value) streams of the decoder sites, the score of every site (the encoder's may
    differ), the heads of cross-attention; `model_fields` replace other ModelConfig fields."""
    import torch

    from seq2seq.model.config import AttentionSiteConfig, ModelConfig, Score, Stream
    from seq2seq.model.transformer import Transformer

    def site(streams: tuple[str, str], site_score: str, heads: int | None = None):
        return AttentionSiteConfig(Stream(streams[0]), Stream(streams[1]), Score(site_score), heads)

    torch.manual_seed(0)
    attention = replace(
        config_of("model/transformer_tiny", ModelConfig).attention,
        encoder_self=site(("source", "source"), encoder_score or score),
        decoder_self=site(decoder_self, score),
        cross=site(cross, score, cross_heads),
        allow_future_leak=allow_future_leak,
    )
    fields = {**SMALL_MODEL, "attention": attention, **model_fields}
    config = config_of("model/transformer_tiny", ModelConfig, **fields)
    return Transformer(config, vocab, vocab, True, **SPECIAL_IDS).eval()


def configured_model(*overrides: str, vocab: int = 40, **model_fields: Any):
    """A small Transformer (seed 0, eval mode) of the model group's transformer_tiny with
    `overrides` relative to the group, e.g. "block.decoder.feed_forward.run=none"."""
    import torch

    from seq2seq.config import group_config
    from seq2seq.model.config import ModelConfig
    from seq2seq.model.transformer import Transformer

    torch.manual_seed(0)
    config = group_config("model/transformer_tiny", ModelConfig, overrides)
    config = replace(config, **{**SMALL_MODEL, **model_fields})
    return Transformer(config, vocab, vocab, True, **SPECIAL_IDS).eval()


def toy_corpus(n: int = 300) -> tuple[list[str], list[str]]:
    """A small deterministic corpus with varied lengths."""
    words = ["the", "a", "dog", "cat", "runs", "jumps", "over", "under"]
    words += ["red", "blue", "big", "small", "man", "woman", "child", "ball"]
    src, tgt = [], []
    for i in range(n):
        length = 1 + (i * 7) % 12
        sentence = [words[(i * 3 + j * 5) % len(words)] for j in range(length)]
        src.append(" ".join(sentence))
        tgt.append(" ".join(w.upper() for w in reversed(sentence)))
    return src, tgt


def toy_tokenizer(vocab: int) -> Tokenizer:
    """A joint SentencePiece model of `vocab` pieces trained on the toy corpus."""
    from seq2seq.data.config import TokenizerConfig
    from seq2seq.data.tokenizer import train_sentencepiece

    config = group_config("tokenizer/sentencepiece", TokenizerConfig)
    config.vocab_size, config.byte_fallback = vocab, False
    sources, targets = toy_corpus()
    model = train_sentencepiece(sources + targets, config)
    return Tokenizer(model, model)


def trained_toy_model(tokenizer: Tokenizer, steps: int = 150, **fields: Any):
    """A tiny model (wired_model: 1+2 layers, d 32) after `steps` Adam updates of 32 toy pairs:
    enough for greedy search to end sentences with EOS."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    from seq2seq.data.tokenizer import BOS_ID, EOS_ID

    torch.manual_seed(0)
    model = wired_model(vocab=tokenizer.src_vocab_size, max_len=64, **fields).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    sources, targets = toy_corpus()
    src, tgt = tokenizer.encode_src(sources), tokenizer.encode_tgt(targets)
    for step in range(steps):
        batch = [(step * 32 + j) % len(src) for j in range(32)]
        source = pad_sequence([torch.tensor([*src[i], EOS_ID]) for i in batch], batch_first=True)
        tgt_in = pad_sequence([torch.tensor([BOS_ID, *tgt[i]]) for i in batch], batch_first=True)
        tgt_out = pad_sequence([torch.tensor([*tgt[i], EOS_ID]) for i in batch], batch_first=True)
        loss = model.loss(source, tgt_in, tgt_out, 0.0) / (tgt_out != 0).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def split_file_overrides() -> list[str]:
    """data=parallel_files names: <split>.src and <split>.tgt for train, val and test."""
    return [
        f"data.splits.{s}.{side}={s}.{side}"
        for s in ("train", "val", "test")
        for side in ("src", "tgt")
    ]


# trainer.precision=auto picks bf16 on CPUs with bf16 units: tests train in fp32 everywhere, so
# that their results do not depend on the CPU they run on
FP32 = "trainer.precision=32-true"


def toy_overrides(data: Path, cache: Path) -> list[str]:
    return [
        FP32,
        "data=parallel_files",
        f"data.dir={data}",
        f"paths.cache_dir={cache}",
        *split_file_overrides(),
        "tokenizer.vocab_size=60",
        "tokenizer.byte_fallback=false",
    ]


def gradient_norms(
    toy_files: Path, work: Path, monkeypatch, precision: str
) -> tuple[dict[int, float], dict[int, float]]:
    """Train a tiny model 7 updates with clipping at 0.05 and train/grad_norm logged every 3rd:
    (logged norm by step from metrics.csv, the norm recomputed in float64 just before Lightning
    clips, by step: the gradients as the update finds them, unscaled under 16-mixed)."""
    import torch

    from seq2seq.analysis.learning_curves import read_metrics
    from seq2seq.training.module import TranslationModule
    from seq2seq.training.run import train

    recomputed: dict[int, float] = {}

    def record(module: TranslationModule, optimizer) -> None:
        grads = [p.grad.double().flatten() for p in module.parameters() if p.grad is not None]
        recomputed[module.global_step] = float(torch.linalg.vector_norm(torch.cat(grads)))

    monkeypatch.setattr(TranslationModule, "on_before_optimizer_step", record)
    overrides = [
        *toy_overrides(toy_files, work / "cache"),
        "model=transformer_tiny",
        f"trainer.precision={precision}",
        "trainer.max_steps=7",
        "trainer.log_every_n_steps=3",
        "trainer.gradient_clip_val=0.05",
        "trainer.num_sanity_val_steps=0",
        "decoding=greedy",
        "average_last=0",
        "evaluate_after=false",
    ]
    train(compose_config(overrides), work / "run")
    rows = [row for row in read_metrics([work / "run" / "metrics.csv"]) if row["train/grad_norm"]]
    return {int(row["step"]): float(row["train/grad_norm"]) for row in rows}, recomputed


def small_model(toy_files: Path, cache: Path) -> list[str]:
    return [
        *toy_overrides(toy_files, cache),
        "model=transformer_tiny",
        "model.max_len=64",
        "data.filter.max_len=60",
        "data.max_tokens=256",
        "decoding=greedy",
    ]


def tiny_checkpoint(work: Path, steps: int = 2, *overrides: str) -> Path:
    """A tiny model trained for `steps` steps on the toy corpus (with train's `overrides`),
    written by train as users' checkpoints are; 63 source tokens at most."""
    return Path(tiny_run(work, steps, *overrides)["final_checkpoint"])


def tiny_run(work: Path, steps: int = 2, *overrides: str) -> dict:
    """tiny_checkpoint's training run in work/run, and the summary train returns."""
    from seq2seq.training.run import train

    src, tgt = toy_corpus()
    for split, lo, hi in (("train", 0, 240), ("val", 240, 270), ("test", 270, 300)):
        write_lines(work / f"{split}.src", src[lo:hi])
        write_lines(work / f"{split}.tgt", tgt[lo:hi])
    settings = [
        *small_model(work, work / "cache"),
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={steps}",
        "trainer.num_sanity_val_steps=0",
        "average_last=0",
        "evaluate_after=false",
        *overrides,
    ]
    return train(compose_config(settings), work / "run")


def few_pairs_overrides(data: Path, cache: Path, vocab_size: int = 400) -> list[str]:
    """A tiny model that overfits a few pairs in pairs.src / pairs.tgt quickly."""
    splits = ("train", "val", "test")
    files = [f"data.splits.{s}.{side}=pairs.{side}" for s in splits for side in ("src", "tgt")]
    return [
        FP32,
        "data=parallel_files",
        f"data.dir={data}",
        *files,
        f"paths.cache_dir={cache}",
        "model=transformer_tiny",
        "model.dropout=0",
        f"tokenizer.vocab_size={vocab_size}",
        "tokenizer.byte_fallback=false",
        "data.max_tokens=512",
        "optim.lr=3e-3",
        "optim.warmup_steps=30",
        "optim.label_smoothing=0",
        "decoding.beam_size=1",
    ]


def incremental(model, src, tgt):
    """Next-token log-probabilities (B, T, V) of `tgt` decoded step by step with the caches."""
    import torch

    state = model.start_decoding(src)
    return torch.stack([model.decode_step(state, tgt[:, t]) for t in range(tgt.shape[1])], 1)


def assert_causal_and_cached(model, src, tgt, vocab: int) -> None:
    """The KV-cache decoding equals the full pass, and no target position's output, in either,
    changes when later target tokens do."""
    import torch

    full = model(src, tgt).log_softmax(-1)
    torch.testing.assert_close(incremental(model, src, tgt), full, atol=1e-5, rtol=1e-5)
    for t in range(tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % (vocab - 4) + 4
        torch.testing.assert_close(
            model(src, changed).log_softmax(-1)[:, : t + 1], full[:, : t + 1]
        )
        torch.testing.assert_close(incremental(model, src, changed)[:, : t + 1], full[:, : t + 1])


# a fake ablation sweep (seq2seq.report's tests)
REFERENCES, _ = toy_corpus(60)
# the baseline's hypotheses: every third sentence loses its last word
BASELINE_HYPOTHESES = [
    " ".join(line.split()[:-1]) if i % 3 == 0 else line for i, line in enumerate(REFERENCES)
]


def fake_run(
    directory: Path,
    preset: str,
    bleu: float,
    seed: int = 1,
    hypotheses: list[str] = BASELINE_HYPOTHESES,
    overrides: tuple[str, ...] = (),
) -> None:
    """A finished run directory as seq2seq.train leaves it: its summary, its resolved config
    (`+ablation=<preset>` on transformer_small, whose 4 heads make cross_heads_4 the standard
    model) and the test hypotheses (the references are written once, beside the run
    directories)."""
    (directory / ".hydra").mkdir(parents=True)
    config = compose_config([f"+ablation={preset}", f"seed={seed}", *overrides])
    (directory / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
    references = directory.parent / "references.de"
    references.write_text("".join(line + "\n" for line in REFERENCES))
    hypotheses_path = directory / "test.hyp"
    hypotheses_path.write_text("".join(line + "\n" for line in hypotheses))
    test = {
        "bleu": bleu,
        "chrf": bleu + 20,
        "bleu_signature": "nrefs:1|case:mixed|tok:13a",
        "hypotheses": str(hypotheses_path),
        "references": str(references),
    }
    summary = {
        "variant": config.model.attention.name,
        "seed": seed,
        "parameters": 1_500_000,
        "precision": "bf16-mixed",
        "train_seconds": 900.0,
        "steps": 400 + seed,
        "train_loss": 2.5,
        "best_val_bleu": bleu - 1,
        "test": {"test_2016_flickr": test},
    }
    (directory / "run_summary.json").write_text(json.dumps(summary))


def assert_scores_of_the_files_named(scores: dict, sentences: int) -> None:
    """A test set's `scores` (evaluate's, a run summary's) are sacreBLEU's on the hypotheses
    and references files they name, one hypothesis per test sentence."""
    hypotheses = read_lines(Path(scores["hypotheses"]))
    references = read_lines(Path(scores["references"]))
    assert len(hypotheses) == len(references) == scores["sentences"] == sentences
    recomputed = corpus_scores(hypotheses, references)
    assert {k: scores[k] for k in recomputed} == recomputed


def report(*overrides: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m seq2seq.report <overrides>`, forked as run() starts the other commands."""
    return python("-m", "seq2seq.report", *overrides, cwd=cwd)


def table_rows(markdown: Path) -> dict[str, list[str]]:
    """The Markdown table's cells by variant."""
    lines = markdown.read_text().splitlines()
    cells = [[c.strip() for c in line[1:-1].split("|")] for line in lines if line.startswith("| ")]
    return {row[0]: row for row in cells[1:] if row[0] != "variant"}


# a hand-built decoder (seq2seq.decoding's search and sampling tests)
A, B, C = 4, 5, 6  # tokens of the hand-built models


class TableState:
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def reorder(self, index: torch.Tensor) -> None:
        pass  # the table model only looks at the last token


class TableModel:
    """A hand-built decoder whose next-token distribution depends on the last token only.

    By default greedy takes A (0.6), after which nothing is likely; the best sequence is B EOS
    (0.4 x 0.95 = 0.38), which a beam of 2 keeps. Search reads its special ids from it.
    `next_tokens` replaces the table: {last token: {next token: probability}}, EOS as "eos".
    """

    def __init__(
        self,
        pad_id: int = PAD_ID,
        bos_id: int = BOS_ID,
        eos_id: int = EOS_ID,
        next_tokens: dict[int, dict[int | str, float]] | None = None,
        tag_ids: tuple[int, ...] = (),
    ) -> None:
        import torch

        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.never_ids = (pad_id, bos_id, *tag_ids)
        next_tokens = next_tokens or {
            bos_id: {A: 0.6, B: 0.4},
            A: {"eos": 0.3, A: 0.35, B: 0.35},
            B: {"eos": 0.95, A: 0.05},
        }
        p = torch.full((7, 7), 1e-9)
        for last, following in next_tokens.items():
            for token, probability in following.items():
                p[last, eos_id if token == "eos" else token] = probability
        self.log_p = (p / p.sum(-1, keepdim=True)).log()

    def start_decoding(self, src: torch.Tensor, beam: int = 1) -> TableState:
        return TableState(src.shape[0] * beam)

    def decode_step(self, state: TableState, tokens: torch.Tensor) -> torch.Tensor:
        return self.log_p[tokens]

    def score(self, seq: list[int]) -> float:
        tokens = [self.bos_id, *seq, self.eos_id]
        return sum(self.log_p[a, b].item() for a, b in zip(tokens, tokens[1:], strict=False))


def teacher_forced_score(
    model, source: list[int], target: list[int], length_penalty: float = 1.0
) -> float:
    """The model's own score of `target` (ids without BOS/EOS) for `source` (ids without EOS),
    as search reports it: the log-probabilities of the tokens and EOS, each step's distribution
    renormalised without the ids it never outputs (PAD, BOS, tags), over (tokens + 1) **
    length_penalty. A reference that shares nothing with search but the model's forward pass."""
    import torch

    with torch.no_grad():
        src = torch.tensor([[*source, EOS_ID]])
        tgt_in = torch.tensor([[BOS_ID, *target]])
        log_probs = model(src, tgt_in).float().log_softmax(-1)[0]  # (T + 1, V)
    total = 0.0
    for step, token in enumerate([*target, EOS_ID]):
        p = log_probs[step].exp()
        total += float(log_probs[step, token]) - math.log(1 - float(p[list(model.never_ids)].sum()))
    return total / (len(target) + 1) ** length_penalty


def tiny_transformer(tag_ids: tuple[int, ...] = ()):
    """A 30-token Transformer (d_model 32, seed 0, eval mode) for search tests; `tag_ids`:
    ids it never outputs beside PAD and BOS, as a multilingual model's tags."""
    import torch

    from seq2seq.model.config import ModelConfig
    from seq2seq.model.transformer import Transformer

    torch.manual_seed(0)
    config = config_of(
        "model/transformer_tiny", ModelConfig, d_model=32, heads=4, ffn_dim=64, dropout=0.0
    )
    return Transformer(config, 30, 30, True, **SPECIAL_IDS, tag_ids=tag_ids).eval()


def padded_sources():
    """Five source rows (B=5, S=9) of tiny_transformer's ids with EOS, two of them padded."""
    import torch

    torch.manual_seed(3)
    src = torch.randint(4, 30, (5, 9))
    src[:, -1] = EOS_ID
    src[1, 4:], src[1, 3] = PAD_ID, EOS_ID
    src[3, 6:], src[3, 5] = PAD_ID, EOS_ID
    return src


def toy_languages(n: int = 300) -> dict[str, list[str]]:
    """Three aligned toy languages: en, xx (en upper-cased and reversed), yy (each en word with
    an "o" added)."""
    en, xx = toy_corpus(n)
    return {"en": en, "xx": xx, "yy": [" ".join(w + "o" for w in s.split()) for s in en]}


def write_aligned(data: Path) -> Path:
    """train/val/test.<lang> of the three toy languages, line i of each a translation."""
    data.mkdir()
    for lang, lines in toy_languages().items():
        for split, lo, hi in (("train", 0, 240), ("val", 240, 270), ("test", 270, 300)):
            write_lines(data / f"{split}.{lang}", lines[lo:hi])
    return data


def multilingual_overrides(data: Path, cache: Path, directions: str = "[en-xx,en-yy]") -> list:
    return [
        FP32,
        "data=parallel_files",
        f"data.dir={data}",
        f"paths.cache_dir={cache}",
        *(
            f"data.splits.{split}.{side}='{split}.{{{side}}}'"  # quoted: Hydra's grammar
            for split in ("train", "val", "test")
            for side in ("src", "tgt")
        ),
        f"data.directions={directions}",
        "tokenizer.vocab_size=70",
        "tokenizer.byte_fallback=false",
    ]
