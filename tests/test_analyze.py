"""The rank-collapse probe (seq2seq.analyze): the measures against numpy, padding excluded,
attention alone collapsing at initialisation, and the command with its errors."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import compose_config, configured_model, run, toy_corpus, toy_overrides, toy_tokenizer

from seq2seq.analysis.rank_collapse import probe, rank_measures
from seq2seq.config import CONF_DIR
from seq2seq.training.run import train


def test_rank_measures_against_numpy() -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 16)
    s = np.linalg.svd(x.numpy().astype(np.float64), compute_uv=False)
    p = s / s.sum()
    residual, effective = rank_measures(x)
    assert residual == pytest.approx(np.sqrt((s[1:] ** 2).sum() / (s**2).sum()))
    assert effective == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    # every token the same vector, up to scale: rank 1
    collapsed = torch.arange(1.0, 6.0)[:, None] * torch.randn(1, 16)
    residual, effective = rank_measures(collapsed)
    assert residual == pytest.approx(0.0, abs=1e-6) and effective == pytest.approx(1.0, abs=1e-5)
    # 4 orthonormal rows: singular values all 1
    residual, effective = rank_measures(torch.eye(4, 16))
    assert residual == pytest.approx(math.sqrt(3 / 4)) and effective == pytest.approx(4.0)


def test_probe_excludes_padding_and_covers_every_layer() -> None:
    tokenizer = toy_tokenizer(60)
    model = configured_model(vocab=60, encoder_layers=2, decoder_layers=3)
    src, tgt = toy_corpus(12)
    short, long = 0, max(range(12), key=lambda i: len(src[i]) + len(tgt[i]))
    assert len(src[long]) > len(src[short]) and len(tgt[long]) > len(tgt[short])
    alone = [probe("m", model, tokenizer, [src[i]], [tgt[i]]) for i in (short, long)]
    # in one batch the short pair is padded to the long one: its measures must not change
    together = probe("m", model, tokenizer, [src[short], src[long]], [tgt[short], tgt[long]])
    assert [(r.stack, r.layer) for r in together] == [
        *[("encoder", layer) for layer in range(3)],
        *[("decoder", layer) for layer in range(4)],
    ]
    for row, first, second in zip(together, *alone, strict=True):
        assert row.sentences == 2
        mean = (first.residual + second.residual) / 2
        assert row.residual == pytest.approx(mean, rel=1e-4)
        mean_rank = (first.effective_rank + second.effective_rank) / 2
        assert row.effective_rank == pytest.approx(mean_rank, rel=1e-4)


def test_attention_alone_collapses_at_initialisation() -> None:
    tokenizer = toy_tokenizer(60)
    src, tgt = toy_corpus(20)
    last = {}
    for name, overrides in {
        "standard": [],
        "attention_only": [
            "block.encoder.self_attention.residual=none",
            "block.encoder.feed_forward.skip=all",
        ],
    }.items():
        model = configured_model(*overrides, vocab=60, encoder_layers=4, decoder_layers=1)
        rows = probe(name, model, tokenizer, src, tgt)
        last[name] = next(r for r in rows if r.stack == "encoder" and r.layer == 4)
    assert last["attention_only"].residual < 0.1 < last["standard"].residual
    assert last["attention_only"].effective_rank < 2 < last["standard"].effective_rank


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    work = tmp_path_factory.mktemp("analyze")
    files = work / "corpus"
    files.mkdir()
    src, tgt = toy_corpus()
    for split, lo, hi in (("train", 0, 240), ("val", 240, 270), ("test", 270, 300)):
        (files / f"{split}.src").write_text("".join(x + "\n" for x in src[lo:hi]))
        (files / f"{split}.tgt").write_text("".join(x + "\n" for x in tgt[lo:hi]))
    overrides = [
        *toy_overrides(files, work / "cache"),
        "model=transformer_tiny",
        "model.max_len=64",
        "data.filter.max_len=60",
        "data.max_tokens=256",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.num_sanity_val_steps=0",
        "average_last=0",
        "evaluate_after=false",
    ]
    summary = train(compose_config(overrides), work / "run")
    return Path(summary["final_checkpoint"]), toy_overrides(files, work / "cache")


@pytest.mark.slow
def test_analyze_probes_checkpoints_and_presets_at_initialisation(toy_run, tmp_path) -> None:
    checkpoint, data = toy_run
    result = run(
        "analyze",
        tmp_path,
        *data,
        "model=transformer_tiny",
        f"ckpt_path={checkpoint}",
        "init=[standard,attention_only]",
        "sentences=20",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "rank_collapse.csv") as f:
        rows = list(csv.DictReader(f))
    models = list(dict.fromkeys(row["model"] for row in rows))
    assert models == ["standard trained (run)", "standard at init", "attention_only at init"]
    assert len(rows) == 3 * (3 + 3)  # embedding + 2 layers, in the encoder and the decoder
    assert {row["sentences"] for row in rows} == {"20"}
    assert (tmp_path / "rank_collapse.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.glob("rank_collapse*")) == [
        "rank_collapse.csv",
        "rank_collapse.md",
        "rank_collapse.png",
    ]
    assert not (tmp_path / "analyze.log").exists()  # the log goes to the console only
    assert "| attention_only at init | decoder | 2 |" in (tmp_path / "rank_collapse.md").read_text()


@pytest.mark.slow
def test_analyze_composes_presets_of_a_config_dir(toy_run, tmp_path) -> None:
    """A preset in a `--config-dir`'s ablation/ is found as a shipped one: a copy of
    attention_only probes exactly as attention_only does."""
    _, data = toy_run
    (tmp_path / "mine" / "ablation").mkdir(parents=True)
    shutil.copy(CONF_DIR / "ablation" / "attention_only.yaml", tmp_path / "mine/ablation/copy.yaml")
    config_dir = ["--config-dir", str(tmp_path / "mine")]
    init = ["model=transformer_tiny", "init=[attention_only,copy]", "sentences=20"]
    result = run("analyze", tmp_path, *config_dir, *data, *init)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "rank_collapse.csv") as f:
        rows = list(csv.DictReader(f))
    measured = {}
    for row in rows:
        measured.setdefault(row.pop("model"), []).append(row)
    assert list(measured) == ["attention_only at init", "copy at init"]
    assert measured["copy at init"] == measured["attention_only at init"]

    result = run("analyze", tmp_path, *config_dir, *data, "init=[deep]")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "no preset 'deep'" in result.stderr and "attention_only, copy, " in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "config key 'checkpoints': nothing to probe"),
        (["init=[deep]"], "config key 'init': no preset 'deep'"),
        (["init=[standard]", "split=dev"], "config key 'split': 'dev' is not one of"),
        (["checkpoints=[missing.ckpt]"], "missing.ckpt"),
        (["ckpt_path=gone.ckpt"], "gone.ckpt"),
    ],
)
def test_analyze_errors_name_the_setting(toy_run, tmp_path, overrides, message) -> None:
    _, data = toy_run
    result = run("analyze", tmp_path, *data, *overrides)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
