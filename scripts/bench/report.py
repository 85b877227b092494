"""The report: the run's environment, the printed tables and the JSON of all measurements
(docs/bench/*.json)."""

from __future__ import annotations

import importlib
import json
import os
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

from bench.measure import Measured
from bench.training import Precisions
from seq2seq.io import atomic_path


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu} ({os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}){gpu}"


def version(package: str) -> str | None:
    try:
        return importlib.import_module(package).__version__
    except ImportError:
        return None


def environment(script: str, argv: list[str]) -> dict[str, str | None]:
    """What a figure needs beside it to be read later: command, date, machine, versions."""
    return {
        "command": " ".join(["python", f"scripts/{script}", *argv]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "ctranslate2": version("ctranslate2"),
    }


def write_json(path: Path, results: dict) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(results, indent=2))


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def mib(values: list[int]) -> str:
    return f"{max(values) / 2**20:,.0f}"


def ratio(a: Measured, b: Measured) -> str:
    """Median over repetitions of a's rate / b's rate (same round, same conditions)."""
    pairs = [x / y for x, y in zip(a.rates(), b.rates(), strict=True)]
    return f"{statistics.median(pairs):.2f}x"


def summary(results: dict, notes: dict[str, str]) -> list[str]:
    """The lines above the tables: what was run, where, on what."""
    params = results["parameters"]
    lines = [
        f"command: `{results['command']}`",
        f"date: {results['date']}; machine: {results['machine']}",
        f"torch {results['torch']}, transformers {results['transformers']}, "
        f"ctranslate2 {results['ctranslate2']}",
        f"parameters: ours {params['ours']:,}, Marian {params['marian'] or 0:,}",
        "training, a pass: "
        + ", ".join(
            f"{precision} {n} Multi30k batches ({results['target_tokens'][precision]:,} target "
            "tokens)"
            for precision, n in results["batches"].items()
        ),
        f"decoding: {results['sentences']} test sources, {results['length']} tokens + EOS each",
        "matmul peak: "
        + ", ".join(f"{k} {v:,.1f} GFLOP/s" for k, v in results["matmul_peak_gflops"].items()),
    ]
    lines += [f"{system} rows skipped: {note}" for system, note in notes.items() if note]
    return lines


def training_table(results: dict, trained: dict[str, Measured], precisions: Precisions) -> str:
    """A row per system and precision; ours against Marian and against the matmul peak."""
    rows = []
    for precision in precisions:
        marian = trained.get(f"marian {precision}")
        peak = results["matmul_peak_gflops"][precision]
        for name, m in trained.items():
            if not name.endswith(f" {precision}"):
                continue
            is_ours = name.startswith("ours")
            flops = results["training_flops"][precision]
            achieved = flops / statistics.median(m.seconds) / 1e9
            rows.append(
                [
                    name,
                    f"{m.median():,.0f}",
                    f"{min(m.rates()):,.0f}-{max(m.rates()):,.0f}",
                    ratio(m, marian) if is_ours and marian else "",
                    f"{achieved:,.1f} ({achieved / peak:.0%})" if is_ours else "",
                    mib(m.memory),
                ]
            )
    header = ["training", "target tok/s (median)", "range", "ours / Marian", "GFLOP/s (MFU)"]
    return table([*header, "peak MiB"], rows)


def decoding_table(decoded: dict[str, Measured], beam: int) -> str:
    """A row per search; ours against the others' same search, and greedy against no cache."""
    rows = []
    others = {
        "Marian's": "marian",
        "CTranslate2 float32": "ctranslate2 float32",
        "CTranslate2 int8": "ctranslate2 int8",
    }
    for name, m in decoded.items():
        against = []
        if name in ("ours greedy", f"ours beam {beam}"):
            search = name.removeprefix("ours ")
            against = [
                f"{ratio(m, decoded[f'{system} {search}'])} {label}"
                for label, system in others.items()
                if f"{system} {search}" in decoded
            ]
        if name == "ours greedy":
            against.append(f"{ratio(m, decoded['ours greedy, no cache'])} no cache")
        rows.append([name, f"{m.median():,.1f}", "; ".join(against), mib(m.memory)])
    return table(["decoding", "sentences/s (median)", "ours /", "peak MiB"], rows)


def report(
    results: dict,
    trained: dict[str, Measured],
    decoded: dict[str, Measured],
    precisions: Precisions,
    beam: int,
    notes: dict[str, str],
) -> str:
    """The printed report: summary lines, the training table, the decoding table."""
    same = "yes" if results["cache_equals_no_cache"] else "NO"
    rows = results["greedy_rows_as_ctranslate2"]
    as_ctranslate2 = "not run" if rows is None else f"{rows} sentences"
    return "\n".join(
        [
            *summary(results, notes),
            "",
            training_table(results, trained, precisions),
            "",
            decoding_table(decoded, beam),
            f"\ngreedy with cache gives the no-cache outputs (first batch): {same}",
            f"CTranslate2 float32 greedy gives our token ids (first batch): {as_ctranslate2}",
        ]
    )
