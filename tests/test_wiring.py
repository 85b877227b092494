"""Attention wiring as configuration: the rules of docs/attention.md, for every wiring."""

from __future__ import annotations

import itertools
import json
import logging
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from helpers import ROOT, compose_config, config_of, few_pairs_overrides, random_batch

from seq2seq.config import AttentionSiteConfig, ModelConfig
from seq2seq.data.tokenizer import PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.model.sites import AttentionSite
from seq2seq.model.transformer import Transformer

VOCAB = 40
STREAM_PAIRS = list(itertools.product(["target", "source"], repeat=2))
WIRINGS = list(itertools.product(STREAM_PAIRS, STREAM_PAIRS))  # (decoder_self, cross)


def model(decoder_self=("target", "target"), cross=("target", "source"), score="scaled_dot", **kw):
    torch.manual_seed(0)
    attention = replace(
        config_of("model/transformer_tiny", ModelConfig).attention,
        encoder_self=AttentionSiteConfig("source", "source", score, None),
        decoder_self=AttentionSiteConfig(*decoder_self, score, None),
        cross=AttentionSiteConfig(*cross, score, kw.pop("cross_heads", None)),
        allow_future_leak=kw.pop("allow_future_leak", False),
    )
    cfg = config_of(
        "model/transformer_tiny",
        ModelConfig,
        d_model=32,
        heads=4,
        encoder_layers=1,
        decoder_layers=2,
        ffn_dim=64,
        dropout=0.0,
        attention=attention,
    )
    return Transformer(cfg, VOCAB, VOCAB, True).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(VOCAB)


def incremental(m: Transformer, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    state = m.start_decoding(src)
    return torch.stack([m.decode_step(state, tgt[:, t]) for t in range(tgt.shape[1])], 1)


@pytest.mark.parametrize(("decoder_self", "cross"), WIRINGS)
@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_every_wiring_is_causal_and_its_kv_cache_equals_the_full_pass(decoder_self, cross, score):
    m = model(decoder_self, cross, score)
    src, tgt = batch()
    full = m(src, tgt).log_softmax(-1)
    torch.testing.assert_close(incremental(m, src, tgt), full, atol=1e-5, rtol=1e-5)
    for t in range(tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % (VOCAB - 4) + 4
        torch.testing.assert_close(m(src, changed).log_softmax(-1)[:, : t + 1], full[:, : t + 1])
        torch.testing.assert_close(incremental(m, src, changed)[:, : t + 1], full[:, : t + 1])


def test_swapped_cross_attention_equals_a_hand_computation() -> None:
    torch.manual_seed(2)
    site = AttentionSite(
        AttentionSiteConfig("source", "target", "scaled_dot", None), 16, 2, 0.0, causal=True
    ).eval()
    source, target = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[1, ..., 3:] = False  # sentence 1 has 3 source tokens
    a = site.attention
    expected = torch.zeros(2, 4, 16)
    for b in range(2):
        n = int(keep[b].sum())
        for t in range(4):
            per_head = []
            for h in range(2):
                cols = slice(8 * h, 8 * h + 8)
                q = a.query(source[b, :n])[:, cols]  # (n, d_k): the source positions query
                k, v = a.key_value(target[b, : t + 1]).split(16, dim=-1)
                k, v = k[:, cols], v[:, cols]  # the target prefix <= t gives keys/values
                weights = (q @ k.T / math.sqrt(8)).softmax(-1)  # (n, t+1)
                per_head.append((weights @ v).mean(0))  # averaged over source positions
            expected[b, t] = a.output(torch.cat(per_head))
    torch.testing.assert_close(site(target, source, keep), expected, atol=1e-5, rtol=1e-5)


def test_no_source_wiring_ignores_the_source_entirely() -> None:
    m = model(cross=("target", "target"))
    src, tgt = batch()
    other = torch.randint(4, VOCAB, (3, 5))
    torch.testing.assert_close(m(other, tgt), m(src, tgt))


def test_source_summary_is_one_vector_for_every_target_position() -> None:
    m = model(cross=("source", "source"))
    src, tgt = batch()
    memory, mask = m.encode(src)
    target_states = torch.randn(3, 7, 32)
    site = m.decoder_layers[0].cross_attention
    out = site(target_states, memory, mask)
    assert out.shape == (3, 1, 32)  # added at every position of the target stream
    torch.testing.assert_close(site(torch.randn(3, 7, 32), memory, mask), out)  # no target in it
    padded = torch.cat([src, torch.full((3, 2), PAD_ID)], 1)  # padding is excluded
    torch.testing.assert_close(m(padded, tgt), m(src, tgt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("decoder_self", "cross"), WIRINGS[::3])
def test_weights_can_be_returned_for_any_site_without_changing_outputs(decoder_self, cross):
    m = model(decoder_self, cross)
    src, tgt = batch()
    memory, mask = m.encode(src)
    plain = m.decode(tgt, memory, mask)
    with_weights = m.decode(tgt, memory, mask, need_weights=True)
    torch.testing.assert_close(with_weights, plain, atol=1e-5, rtol=1e-5)
    for layer in m.decoder_layers:
        for site in (layer.self_attention, layer.cross_attention):
            weights = site.weights
            assert weights is not None and torch.allclose(weights.sum(-1), torch.tensor(1.0))


def test_the_encoder_never_sees_the_target() -> None:
    with pytest.raises(ConfigError, match="the encoder never sees the target"):
        compose_config(["model.attention.encoder_self.key_value=target"])
    bad = replace(
        model().cfg.attention,
        encoder_self=AttentionSiteConfig("target", "source", "scaled_dot", None),
    )
    cfg = replace(model().cfg, attention=bad)
    with pytest.raises(ConfigError, match="there is none at inference"):
        Transformer(cfg, VOCAB, VOCAB, True)


def test_future_leak_needs_the_flag_warns_and_leaks(caplog) -> None:
    src, tgt = batch()
    with caplog.at_level(logging.WARNING):
        leaky = model(allow_future_leak=True)
    assert "allow_future_leak=true" in caplog.text
    changed = tgt.clone()
    changed[:, -1] = (changed[:, -1] + 1) % (VOCAB - 4) + 4
    assert not torch.allclose(leaky(src, changed)[:, 0], leaky(src, tgt)[:, 0])


def test_per_site_heads_and_scores() -> None:
    for heads in (1, 4, 8):
        assert model(cross_heads=heads).decoder_layers[0].cross_attention.attention.heads == heads
    with pytest.raises(ConfigError, match="'model.attention.cross.heads'"):
        compose_config(["model.attention.cross.heads=3"])
    with pytest.raises(ConfigError, match="'model.attention.cross.query'"):
        compose_config(["model.attention.cross.query=sauce"])
    with pytest.raises(ConfigError, match="'model.attention.cross.score'"):
        compose_config(["model.attention.cross.score=cosine"])


def test_dot_score_is_unscaled() -> None:
    torch.manual_seed(3)
    scaled = model(score="scaled_dot").decoder_layers[0].cross_attention.attention
    dot = model(score="dot").decoder_layers[0].cross_attention.attention
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    reference = (q @ k.transpose(-2, -1)).softmax(-1) @ v
    for need_weights in (False, True):
        torch.testing.assert_close(dot.attend(q, k, v, None, need_weights)[0], reference)
    scaled_out = scaled.attend(q * math.sqrt(8), k, v, None)[0]
    torch.testing.assert_close(scaled_out, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "variant", sorted(p.stem for p in (ROOT / "conf" / "ablation").glob("*.yaml"))
)
def test_every_ablation_preset_composes_and_builds(variant: str) -> None:
    config = compose_config([f"+ablation={variant}", "model=transformer_tiny"])
    assert config.model.attention.name == variant
    m = Transformer(config.model, VOCAB, VOCAB, True).eval()
    src, tgt = batch()
    assert m(src, tgt).shape == (3, 7, VOCAB)


def fake_run(directory: Path, variant: str, bleu: float, cross: dict) -> None:
    (directory / ".hydra").mkdir(parents=True)
    attention = {
        "name": variant,
        "encoder_self": {
            "query": "source",
            "key_value": "source",
            "score": "scaled_dot",
            "heads": None,
        },
        "decoder_self": {
            "query": "target",
            "key_value": "target",
            "score": "scaled_dot",
            "heads": None,
        },
        "cross": {"score": "scaled_dot", "heads": None, **cross},
        "allow_future_leak": False,
    }
    config = {"model": {"attention": attention}, "data": {"test_sets": ["test_2016_flickr"]}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    test = {"bleu": bleu, "chrf": bleu + 20, "bleu_signature": "nrefs:1|case:mixed|tok:13a"}
    summary = {
        "variant": variant,
        "parameters": 1_500_000,
        "train_seconds": 900.0,
        "train_loss": 2.5,
        "best_val_bleu": bleu - 1,
        "test": {"test_2016_flickr": test},
    }
    (directory / "run_summary.json").write_text(json.dumps(summary))


def test_ablation_report_tabulates_runs_and_refuses_incomplete_ones(tmp_path: Path) -> None:
    fake_run(tmp_path / "0_standard", "standard", 30.5, {"query": "target", "key_value": "source"})
    fake_run(
        tmp_path / "1_swapped", "swapped_cross", 12.25, {"query": "source", "key_value": "target"}
    )
    script = [sys.executable, str(ROOT / "scripts" / "ablation_report.py"), str(tmp_path)]
    result = subprocess.run(script, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "ablation.md").read_text().splitlines()
    assert table[2].startswith("| standard | enc s/s, dec t/t, cross t/s; scaled_dot")
    assert "| 1.50M | 29.50 | 30.50 | 50.50 | 2.500 | 15.0 |" in table[2]
    assert table[3].startswith("| swapped_cross | enc s/s, dec t/t, cross s/t")
    assert (tmp_path / "ablation.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "ablation.csv").read_text().splitlines()) == 3

    result = subprocess.run([*script, "--test-set", "test_2017"], capture_output=True, text=True)
    assert result.returncode != 0
    assert "has no scores for test set 'test_2017'; it has ['test_2016_flickr']" in result.stderr

    (tmp_path / "2_broken" / ".hydra").mkdir(parents=True)
    result = subprocess.run(script, capture_output=True, text=True)
    assert result.returncode != 0
    assert "2_broken is incomplete: run_summary.json is missing" in result.stderr


def test_ablation_multirun_end_to_end(shared_data: Path, tmp_path: Path) -> None:
    """The suite's command on 40 Multi30k pairs: one run dir per variant, then the report."""

    from seq2seq.data.corpus import read_lines

    for side, lang in (("src", "en"), ("tgt", "de")):
        lines = read_lines(shared_data / "multi30k" / f"train.{lang}.gz")[:40]
        (tmp_path / f"pairs.{side}").write_text("".join(line + "\n" for line in lines))
    sweep = tmp_path / "sweep"
    train = [sys.executable, "-m", "seq2seq.train", "-m", "+ablation=standard,swapped_cross"]
    overrides = few_pairs_overrides(tmp_path, tmp_path / "cache")
    budget = ["trainer.max_epochs=2", "average_last=2", f"hydra.sweep.dir={sweep}"]
    result = subprocess.run(
        [*train, *overrides, *budget], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert runs == ["0_standard", "1_swapped_cross"]
    report = [sys.executable, str(ROOT / "scripts" / "ablation_report.py"), str(sweep)]
    result = subprocess.run(report, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    table = (sweep / "ablation.md").read_text()
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert sorted(row.split(" | ")[0] for row in rows) == ["| standard", "| swapped_cross"]
    assert "Test set: test;" in table


@pytest.mark.parametrize(
    "cross", [("target", "source"), ("source", "target"), ("source", "source")]
)
def test_heatmaps_for_each_wiring(cross, tmp_path: Path) -> None:
    from seq2seq.config import DecodingConfig, TokenizerConfig
    from seq2seq.data.tokenizer import Tokenizer, train_sentencepiece
    from seq2seq.translator import Translator
    from seq2seq.visualize import attention_maps, plot

    words = ["a dog runs", "the cat sleeps", "a man reads a book", "two children play"] * 20
    spm = train_sentencepiece(
        words,
        config_of("tokenizer/sentencepiece", TokenizerConfig, vocab_size=40, byte_fallback=False),
    )
    translator = Translator(
        model(cross=cross), Tokenizer(spm, spm), config_of("decoding/greedy", DecodingConfig)
    )
    maps, query, key, _ = attention_maps(translator, "a dog reads", "cross")
    assert len(maps) == 2 and all(m.shape == (4, len(query), len(key)) for m in maps)
    expected_query = "</s>" if cross[0] == "source" else "<s>"
    assert expected_query in query
    plot(maps, query, key, per_head=True, title="t", output=tmp_path / "x.png")
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"
