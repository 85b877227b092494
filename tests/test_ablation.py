"""The ablation suite: every preset composes and builds, the report tabulates finished runs (and
names the others), and the multirun works end to end, serial and side by side
(docs/attention.md, "Ablation suite"; docs/sweeps.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import (
    CONF_DIR,
    REFERENCES,
    SPECIAL_IDS,
    compose_config,
    differing_settings,
    fake_run,
    few_pairs_overrides,
    python,
    random_batch,
    report,
    table_rows,
)
from hydra import compose, initialize_config_dir

from seq2seq.model.transformer import Transformer

VOCAB = 40


@pytest.mark.parametrize("variant", sorted(p.stem for p in (CONF_DIR / "ablation").glob("*.yaml")))
def test_every_ablation_preset_composes_and_builds(variant: str) -> None:
    config = compose_config([f"+ablation={variant}", "model=transformer_tiny"])
    assert config.model.attention.name == variant
    m = Transformer(config.model, VOCAB, VOCAB, True, **SPECIAL_IDS).eval()
    src, tgt = random_batch(VOCAB)
    assert m(src, tgt).shape == (3, 7, VOCAB)


def sweep_params(experiment: str) -> dict[str, str]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        config = compose("train", [f"experiment={experiment}"], return_hydra_config=True)
    return dict(config.hydra.sweeper.params)


def test_the_two_suites_cover_every_preset_and_compare_with_standard() -> None:
    attention = sweep_params("ablation_cpu")
    block = sweep_params("block_ablation_cpu")
    assert attention["seed"] == block["seed"] == "1,2,3"
    attention_presets = set(attention["+ablation"].split(","))
    block_presets = set(block["+ablation"].split(","))
    assert attention_presets & block_presets == {"standard"}
    every = {p.stem for p in (CONF_DIR / "ablation").glob("*.yaml")}
    assert attention_presets | block_presets == every
    assert len(attention_presets) == 10 and len(block_presets) == 7


def test_the_gpu_suite_is_the_cpu_suite_at_a_converged_budget() -> None:
    """experiment=ablation_gpu changes where and how long each run trains, not what the suite
    compares: the same wirings, seeds, model and recipe; a larger budget, without early
    stopping, and the GPU's speed settings."""
    assert sweep_params("ablation_gpu") == sweep_params("ablation_cpu")
    cpu, gpu = (compose_config([f"experiment={name}"]) for name in ("ablation_cpu", "ablation_gpu"))
    changed = differing_settings(cpu, gpu)
    assert changed == {
        "trainer.accelerator",
        "trainer.precision",
        "trainer.max_steps",
        "trainer.check_val_every_n_epoch",
        "early_stopping_patience",
        "cuda_graphs",
        "data.num_workers",
        "data.pad_to_multiple",
    }
    assert gpu.trainer["max_steps"] > cpu.trainer["max_steps"]


def test_the_block_suite_trains_as_the_attention_suite_does() -> None:
    """block_ablation_cpu swaps the presets swept (above) and nothing of the runs."""
    attention, block = (
        compose_config([f"experiment={name}"]) for name in ("ablation_cpu", "block_ablation_cpu")
    )
    assert not differing_settings(attention, block)


@pytest.mark.slow
def test_ablation_report_tabulates_finished_runs_and_names_the_others(tmp_path: Path) -> None:
    fake_run(tmp_path / "0_standard_seed1", "standard", 30.5)
    fake_run(tmp_path / "1_swapped_seed1", "swapped_cross", 12.25, hypotheses=REFERENCES)
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 0, result.stderr
    rows = table_rows(tmp_path / "ablation.md")
    assert list(rows) == ["standard", "swapped_cross"]  # by test BLEU
    assert rows["standard"][1].startswith("enc s/s, dec t/t, cross t/s; scaled_dot")
    assert rows["standard"][2:] == [
        "1",
        "401",
        "15.0",
        "bf16-mixed",
        "29.50",
        "30.50",
        "50.50",
        "",
        "",
    ]
    assert rows["swapped_cross"][1].startswith("enc s/s, dec t/t, cross s/t")
    text = (tmp_path / "ablation.md").read_text()
    assert "One seed per variant: no variance is available" in text
    assert (tmp_path / "ablation.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "ablation.csv").read_text().splitlines()) == 3

    result = report(f"sweep={tmp_path}", "test_set=test_2017")
    assert result.returncode == 1
    assert "has no scores for test set 'test_2017'; it has ['test_2016_flickr']" in result.stderr

    (tmp_path / "1_swapped_seed1" / "test.hyp").unlink()
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 1 and "1_swapped_seed1 is incomplete: its test hypotheses" in (
        result.stderr
    )
    (tmp_path / "1_swapped_seed1" / "test.hyp").write_text("".join(f"{r}\n" for r in REFERENCES))
    # runs without a summary are named under the table of the finished ones
    (tmp_path / "2_stopped" / ".hydra").mkdir(parents=True)
    (tmp_path / "3_failed" / ".hydra").mkdir(parents=True)
    (tmp_path / "3_failed" / "failed.txt").write_text("DataError: train.src, line 3: empty\n")
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert list(table_rows(tmp_path / "ablation.md")) == ["standard", "swapped_cross"]
    assert (
        "Not in the table (2): 2_stopped: did not finish (still running, or stopped); "
        "3_failed: failed (DataError: train.src, line 3: empty)."
    ) in (tmp_path / "ablation.md").read_text()

    for finished in ("0_standard_seed1", "1_swapped_seed1"):
        (tmp_path / finished / "run_summary.json").unlink()
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 1
    assert f"no finished runs (*/run_summary.json) under {tmp_path}" in result.stderr
    assert "3_failed: failed (DataError: train.src, line 3: empty)" in result.stderr


@pytest.mark.slow
def test_ablation_report_statistics_over_seeds_and_against_the_baseline(tmp_path: Path) -> None:
    """Three seeds of each variant. A variant whose hypotheses are the baseline's gets p = 1
    and a difference interval around 0; one whose hypotheses are the references is
    significantly better; cross_heads_4 (the standard model when model.heads is 4) is checked
    to equal standard; no_causal_mask is apart."""
    for seed, bleu in ((1, 30.0), (2, 31.0), (3, 32.0)):
        fake_run(tmp_path / f"{seed}_standard", "standard", bleu, seed)
        fake_run(tmp_path / f"{seed}_same", "cross_heads_4", bleu, seed)
        fake_run(tmp_path / f"{seed}_perfect", "dot", bleu + 5, seed, REFERENCES)
        fake_run(tmp_path / f"{seed}_leak", "no_causal_mask", 90.0, seed, REFERENCES)
    fake_run(tmp_path / "4_other", "cross_heads_1", 20.0, 1, REFERENCES[::-1])
    fake_run(tmp_path / "4_unpaired", "additive", 10.0, 7)
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 0, result.stderr
    rows = table_rows(tmp_path / "ablation.md")
    assert list(rows) == [
        "dot",
        "standard",
        "cross_heads_4",
        "cross_heads_1",
        "additive",
        "no_causal_mask",
    ]
    standard = rows["standard"]
    assert standard[2:9] == [
        "1,2,3",
        "401-403",
        "15.0",
        "bf16-mixed",
        "30.00 ± 1.00",
        "31.00 ± 1.00",
        "51.00 ± 1.00",
    ]
    assert standard[9:] == ["", ""]  # the baseline is not tested against itself
    same, better = rows["cross_heads_4"], rows["dot"]
    assert same[9] == "+0.00 [+0.00, +0.00]" and same[10] == "1.000"
    difference, interval = better[9].split(" [")
    low, high = (float(x) for x in interval.rstrip("] *").split(", "))
    assert float(difference) > 0 and 0 < low <= float(difference) <= high
    assert better[9].endswith("*") and float(better[10]) < 0.05
    assert rows["cross_heads_1"][2] == "1" and rows["cross_heads_1"][7] == "20.00"
    assert rows["additive"][9] == "no seed in common with standard"
    assert rows["no_causal_mask"][9:] == ["", ""]
    text = (tmp_path / "ablation.md").read_text()
    assert "Reported apart (sees later target tokens; not tested)" in text
    for seed in (1, 2, 3):
        assert f"seed {seed}: cross_heads_4's hypotheses and standard's are equal" in text
    assert "no variance" not in text

    (tmp_path / "2_same" / "test.hyp").write_text("".join(line + "\n" for line in REFERENCES))
    assert report(f"sweep={tmp_path}").returncode == 0
    text = (tmp_path / "ablation.md").read_text()
    assert "seed 2: cross_heads_4's hypotheses and standard's are DIFFERENT" in text

    fake_run(tmp_path / "5_again", "dot", 1.0, 2)
    result = report(f"sweep={tmp_path}")
    assert result.returncode == 1 and "variant dot has seed(s) [1, 2, 2, 3] more than once" in (
        result.stderr
    )


@pytest.mark.slow
def test_ablation_multirun_end_to_end(shared_data: Path, tmp_path: Path) -> None:
    """The suite's command on 40 Multi30k pairs, serial and side by side (joblib, 2 jobs): one
    run dir per variant, the same report from both but the timing column, and a rerun into the
    sweep directory skips the finished runs."""

    from seq2seq.data.corpus import read_lines

    for side, lang in (("src", "en"), ("tgt", "de")):
        lines = read_lines(shared_data / "multi30k" / f"train.{lang}.gz")[:40]
        (tmp_path / f"pairs.{side}").write_text("".join(line + "\n" for line in lines))
    train = ["-m", "seq2seq.train", "-m", "+ablation=standard,swapped_cross"]
    overrides = few_pairs_overrides(tmp_path, tmp_path / "cache")
    budget = ["trainer.max_epochs=2", "average_last=2", "threads=1"]
    launchers = {"serial": [], "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]}
    tables = {}
    for name, launcher in launchers.items():
        sweep = tmp_path / name
        command = [*train, *overrides, *budget, *launcher, f"hydra.sweep.dir={sweep}"]
        result = python(*command, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        runs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
        assert runs == ["0_standard_seed1234", "1_swapped_cross_seed1234"]
        summary = json.loads((sweep / runs[0] / "run_summary.json").read_text())
        assert summary["seed"] == 1234 and summary["variant"] == "standard"
        result = report(f"sweep={sweep}")
        assert result.returncode == 0, result.stderr
        table = (sweep / "ablation.md").read_text()
        assert "Test set: test;" in table
        header = [c.strip() for c in table.splitlines()[0][1:-1].split("|")]
        timing = header.index("train min")
        rows = table_rows(sweep / "ablation.md")
        tables[name] = {k: v[:timing] + v[timing + 1 :] for k, v in rows.items()}
    assert sorted(tables["serial"]) == ["standard", "swapped_cross"]
    assert tables["joblib"] == tables["serial"]

    summaries = {p: p.read_bytes() for p in (tmp_path / "joblib").glob("*/run_summary.json")}
    command = [*train, *overrides, *budget, *launchers["joblib"], f"hydra.sweep.dir={sweep}"]
    result = python(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("finished already, skipped") == 2
    assert {p: p.read_bytes() for p in summaries} == summaries
