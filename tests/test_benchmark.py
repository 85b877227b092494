"""scripts/benchmark.py --quick, as CI runs it: for its output, never its timings."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import ROOT, python, toy_overrides


@pytest.mark.slow
def test_quick_benchmark_reports_every_phase(multi30k_config, tmp_path: Path) -> None:
    results_path = tmp_path / "benchmark.json"
    command = [
        ROOT / "scripts" / "benchmark.py",
        "--quick",
        "--json",
        str(results_path),
        f"paths.data_dir={multi30k_config.paths.data_dir}",
        f"paths.cache_dir={multi30k_config.paths.cache_dir}",  # the session's tokenizer
        "model=transformer_tiny",
    ]
    result = python(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)  # the figures, for the CI log

    results = json.loads(results_path.read_text())
    marian = results["transformers"] is not None
    systems = ["ours", "marian"] if marian else ["ours"]
    assert set(results["training"]) == {
        f"{system} {precision}" for system in systems for precision in ("fp32", "bf16 autocast")
    }
    decoding = {"ours greedy", "ours greedy, no cache", "ours beam 5"}
    if marian:
        decoding |= {"marian greedy", "marian beam 5"}
    deployed = results["ctranslate2"] is not None
    for compute_type in ("float32", "int8") if deployed else ():
        decoding |= {f"ctranslate2 {compute_type} greedy", f"ctranslate2 {compute_type} beam 5"}
    assert set(results["decoding"]) == decoding
    for measured in [*results["training"].values(), *results["decoding"].values()]:
        assert len(measured["seconds"]) == 1 and measured["seconds"][0] > 0
        assert measured["memory"][0] > 0
    assert all(flops > 0 for flops in results["training_flops"].values())
    # the KV cache must not change what greedy search outputs
    assert results["cache_equals_no_cache"] is True
    if deployed:  # the same weights: CTranslate2 decodes (nearly) all of the batch as we do
        same, total = map(int, results["greedy_rows_as_ctranslate2"].split("/"))
        assert same >= 0.9 * total
    assert "| ours fp32 |" in result.stdout
    assert "greedy with cache gives the no-cache outputs (first batch): yes" in result.stdout


@pytest.mark.slow
def test_step_benchmark_runs_each_checkout_in_its_own_process(
    multi30k_config, tmp_path: Path
) -> None:
    results_path = tmp_path / "step.json"
    command = [
        ROOT / "scripts" / "step_benchmark.py",
        "--rounds=2",
        "--steps=2",
        "--profile",
        f"--json={results_path}",
        f"a={ROOT}",
        f"b={ROOT}",
        "--extra=b=+ablation=cross_heads_1",  # one side's own setting
        "--",
        f"paths.data_dir={multi30k_config.paths.data_dir}",
        f"paths.cache_dir={multi30k_config.paths.cache_dir}",
        "model=transformer_tiny",
        "trainer.precision=32-true",
    ]
    result = python(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(results_path.read_text())
    assert results["checkouts"] == {"a": str(ROOT), "b": str(ROOT)}
    assert "+ablation=cross_heads_1" not in results["rounds"]["a"][0]["overrides"]
    assert results["rounds"]["b"][0]["overrides"][-1] == "+ablation=cross_heads_1"
    for rounds in results["rounds"].values():
        assert len(rounds) == 2 and all(r["tok_s"] > 0 for r in rounds)
        assert rounds[0]["code"] == str(ROOT / "seq2seq") and rounds[0]["precision"] == "32-true"
        assert rounds[0]["allocator"] == "system"  # conftest's SEQ2SEQ_ALLOCATOR, honoured
        shares = [row["share"] for row in rounds[0]["operators"]]
        assert shares and shares == sorted(shares, reverse=True) and sum(shares) <= 1
        assert "aten::mm" in {row["operator"] for row in rounds[0]["operators"]}
        products = rounds[0]["matrix_products"]
        assert 0 < products["share"] < 1 and products["gflop_s"] > 0 and products["flops"] > 0
        assert rounds[0]["matmul_peak_gflop_s"] > 0
        assert rounds[1]["operators"] == [] and rounds[1]["matrix_products"] is None
    assert len(results["ratios"]) == 2
    assert "b/a per round" in result.stdout
    assert "a: matrix products " in result.stdout and "GFLOP/s" in result.stdout


def test_matrix_products_count_the_products_flops_and_share_of_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """step_benchmark's split of a profile: 2 m n k FLOPs per product (batched: times the
    batch), other operators in the time but not in the FLOPs."""
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from step_benchmark import matrix_products

    a, b = torch.randn(64, 32), torch.randn(32, 16)
    bias, c, d = torch.randn(4), torch.randn(8, 32), torch.randn(32, 4)
    e, f = torch.randn(3, 5, 6), torch.randn(3, 6, 7)
    big = torch.randn(512, 512)
    with torch.profiler.profile(with_flops=True) as profile:
        a @ b
        torch.addmm(bias, c, d)
        torch.bmm(e, f)
        for _ in range(20):
            big.exp()
    products = matrix_products(profile)
    assert products["flops"] == 2 * (64 * 32 * 16 + 8 * 32 * 4 + 3 * 5 * 6 * 7)
    assert 0 < products["share"] < 1 and products["gflop_s"] > 0


def test_the_profiles_host_work_of_ours_leaves_the_model_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """train_profile's list of our functions around the model: a training function and a
    data one, per update; the model's (replayed by CUDA graphs on a GPU) and torch's left out."""
    import cProfile
    import pstats

    import torch

    from seq2seq.data.batching import Batch
    from seq2seq.model.dropout import keep_mask
    from seq2seq.training.optim import inverse_sqrt

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from train_profile import ours_per_update

    factor = inverse_sqrt(4000)
    tokens = torch.tensor([[5, 6, 2]])
    profile = cProfile.Profile()
    profile.enable()
    for step in range(4):
        factor(step)
        keep_mask(torch.Size([8]), 0.1, torch.device("cpu"))
        Batch(tokens, tokens, tokens, torch.tensor([0]), 2).to(torch.device("cpu"))
    profile.disable()
    stats = pstats.Stats(profile)
    ours = ours_per_update(stats, updates=4)
    names = {re.sub(r":\d+\(", "(", where) for where in ours}  # without line numbers
    assert {"seq2seq/training/optim.py(factor)", "seq2seq/data/batching.py(to)"} <= names
    assert all(not where.startswith("seq2seq/model/") for where in ours)
    assert list(ours.values()) == sorted(ours.values(), reverse=True) and len(ours) <= 12
    # cumulative milliseconds per update: the factor's 4 calls over the 4 updates
    ((where, ms),) = [(w, ms) for w, ms in ours.items() if w.endswith("(factor)")]
    path, function = where.split(":")
    (seconds,) = [
        cumulative
        for (file, line, name), (*_, cumulative, _) in stats.stats.items()
        if file.endswith(path) and f"{line}({name})" == function
    ]
    assert ms == pytest.approx(1000 * seconds / 4)


def test_copies_by_caller_name_the_operator_that_cast(monkeypatch: pytest.MonkeyPatch) -> None:
    """step_benchmark's split of the copies: autocast's casts under the op they feed, a mask's
    under the multiply that promotes it, a cast the code asks for under no operator."""
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from step_benchmark import copies_by_caller

    x, w, mask = torch.randn(64, 32), torch.randn(16, 32), torch.rand(64, 32) > 0.5
    with torch.profiler.profile() as profile:
        with torch.autocast("cpu", torch.bfloat16):
            torch.nn.functional.linear(x, w)  # x and w cast to bf16 for the product
        x * mask  # the mask cast to float
        x.to(torch.bfloat16)
    rows = {row["caller"]: row for row in copies_by_caller(profile)}
    assert {name: row["calls"] for name, row in rows.items()} == {
        "aten::linear": 2,
        "aten::mul": 1,
        "(top level)": 1,
    }
    assert 0 < sum(row["share"] for row in rows.values()) < 1


def test_step_benchmark_children_start_under_the_allocator_seq2seq_train_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """tcmalloc preloaded as seq2seq-train preloads it; none under SEQ2SEQ_ALLOCATOR=system."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import step_benchmark

    library = str(tmp_path / "libtcmalloc_minimal.so.4")
    monkeypatch.setattr("seq2seq.allocator.find_tcmalloc", lambda: library)
    monkeypatch.setattr("seq2seq.allocator.allocator_in_use", lambda: "system")
    monkeypatch.setenv("LD_PRELOAD", "libother.so")
    monkeypatch.delenv("SEQ2SEQ_ALLOCATOR", raising=False)
    environment = step_benchmark.child_environment(tmp_path)
    assert environment["LD_PRELOAD"] == f"{library}:libother.so"
    assert environment["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
    monkeypatch.setenv("SEQ2SEQ_ALLOCATOR", "system")
    assert step_benchmark.child_environment(tmp_path)["LD_PRELOAD"] == "libother.so"


def test_step_benchmark_needs_two_checkouts() -> None:
    result = python(ROOT / "scripts" / "step_benchmark.py", f"a={ROOT}")
    assert result.returncode == 2 and "give two checkouts" in result.stderr


def test_time_split_counts_each_sample_once_under_its_most_specific_part(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(
        "main;_EvaluationLoop.run (x.py:1);greedy_search (search.py:9) 7\n"
        "main;_EvaluationLoop.run (x.py:1);TranslationModule.loss (module.py:3) 2\n"
        "main;training_step (m.py:5);_chunked_loss (loss.py:50) 5\n"
        "main;backward (torch/_tensor.py:1);_PackedDropout.backward (dropout.py:40) 3\n"
        "main;backward (torch/_tensor.py:1) 4\n"
        "main;_RefreshThread.run (rich.py:83) 1\n"
    )
    result = python(ROOT / "scripts" / "time_split.py", stacks)
    assert result.returncode == 0, result.stderr
    rows = {line[16:]: int(line[8:14]) for line in result.stdout.splitlines()[:-1]}
    assert rows == {
        "validation: greedy decoding": 7,
        "training: loss (fused output projection + cross-entropy)": 5,
        "training: backward": 4,
        "training: dropout masks": 3,
        "validation: loss and BLEU": 2,
        "other": 1,
    }
    assert result.stdout.splitlines()[-1] == "22 samples"


def test_the_terminology_rule_takes_the_longest_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/decoding_features.py's terminology phrases: the longest word of 4+ letters, on
    even lines also the next longest distinct one; punctuation off its ends, first on ties."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from decoding_features import phrases_of

    reference = "Ein Hund läuft über eine grüne Wiese, der Hund bellt."
    assert phrases_of(reference, 1) == ["läuft"]
    assert phrases_of(reference, 2) == ["läuft", "grüne"]
    assert phrases_of("Ein Mann.", 2) == ["Mann"]
    assert phrases_of("Da ist es.", 1) == []
    assert phrases_of("Ein „Bier-Zapfhahn“ steht da.", 1) == ["Bier-Zapfhahn"]


def test_step_benchmark_refuses_an_extra_override_for_no_checkout() -> None:
    command = [ROOT / "scripts" / "step_benchmark.py", "a=.", "b=.", "--extra=c=seed=2"]
    result = python(*command)
    assert result.returncode == 2
    assert "--extra c=seed=2: give NAME=OVERRIDE with NAME one of a, b" in result.stderr


@pytest.mark.slow
def test_the_profile_times_what_the_host_does_between_epochs(
    toy_files: Path, tmp_path: Path
) -> None:
    """train_profile.py records each pause between epochs (validation left out) and each
    checkpoint save: with epoch checkpoints kept, two saves per epoch (last.ckpt and the
    epoch's, validated or not) and one for the best epoch at the validation that ends the run."""
    out = tmp_path / "profile"
    result = python(
        ROOT / "scripts" / "train_profile.py",
        "--out",
        str(out),
        "--first",
        "1",
        "--steps",
        "1",
        "--average-last",
        "2",
        "--",
        *toy_overrides(toy_files, tmp_path / "cache"),
        "model=transformer_tiny",
        "trainer.limit_train_batches=2",
        "trainer.check_val_every_n_epoch=3",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    # 5 updates of 2 an epoch: epochs 0 and 1, then one update of epoch 2 (max_steps)
    assert len(summary["epoch_ends_ms"]) == 2 and min(summary["epoch_ends_ms"]) > 0
    assert [v["step"] for v in summary["validations"]] == [0, 5]  # sanity check, the end
    assert len(summary["checkpoint_saves_ms"]) == 2 * 3 + 1
    assert min(summary["checkpoint_saves_ms"]) > 0
