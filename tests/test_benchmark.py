"""scripts/benchmark.py --quick, as CI runs it: for its output, never its timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_benchmark_reports_every_phase(multi30k_config, tmp_path: Path) -> None:
    results_path = tmp_path / "benchmark.json"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "benchmark.py"),
        "--quick",
        "--json",
        str(results_path),
        f"paths.data_dir={multi30k_config.paths.data_dir}",
        f"paths.cache_dir={multi30k_config.paths.cache_dir}",  # the session's tokenizer
        "model=transformer_tiny",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
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
