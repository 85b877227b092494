"""Where a real training run's update goes: `seq2seq.train` as users run it (Lightning's loop,
callbacks, logging, the loaders), with windows of updates timed, profiled and searched for
host synchronisations.

    python scripts/train_profile.py [--out DIR] [--first 70] [--steps 30] -- overrides
    python scripts/train_profile.py --out /tmp/profile -- experiment=multi30k_gpu_wu2021 \
        paths.data_dir=../shared/data

The run trains `--first + 4 x --steps` updates (trainer.max_steps), nothing averaged or
scored, in four windows that follow one another from update `--first`:
1. plain: wall time per update and target tokens/s, the device synchronised at both ends;
2. torch.profiler (CPU and CUDA): the device's busy time against the wall, the kernel launches
   and synchronisations per update, the operators with the most self CPU time (ops.txt) and
   the Chrome trace (trace.json.gz);
3. cProfile of the Python that runs each update (cprofile.txt): Lightning's hooks, logging,
   the loaders, ours (cprofile.prof: the whole profile, for pstats);
4. on a GPU, CUDA's sync debug mode: every operation that waits for the device, by call site
   (syncs.txt).
Each validation's wall time is logged too, and so is what the host does between epochs: the
time from an epoch's last update to the next one's first, validation left out
(`epoch_ends_ms`: the epoch checkpoints, the loaders, the callbacks), and each checkpoint's
save (`checkpoint_saves_ms`). The run keeps no epoch checkpoints unless `--average-last K`
asks for the K a preset would keep (they are averaged and scored after the windows).
summary.json holds the figures.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gzip
import io
import json
import pstats
import shutil
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from bench.arguments import parse_with_overrides
from bench.report import environment

import seq2seq
from seq2seq.io import atomic_path

# the host-side calls the CUDA runtime and driver make, by what they mean for the update
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPIES = ("cudaMemcpyAsync", "cudaMemcpy")


def device_busy_seconds(events: list[dict]) -> float:
    """The time the device ran anything (kernels, copies, sets) in a Chrome trace's events:
    the union of their intervals, so that overlapping work counts once."""
    kinds = {"kernel", "gpu_memcpy", "gpu_memset"}
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in kinds)
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return busy / 1e6  # the trace's times are microseconds


def ours_per_update(stats: pstats.Stats, updates: int, count: int = 12) -> dict[str, float]:
    """The project's functions around the model (training hooks, loaders) with the most
    cumulative time, in ms per update under cProfile (which slows Python more than native
    code): the host work of ours that CUDA graphs leave outside the replay. Cumulative, so
    training_step's holds the model's forward it calls; keyed as pstats names functions."""
    package = Path(seq2seq.__file__).parent
    ours = [
        (cumulative, f"{Path(file).relative_to(package.parent)}:{line}({name})")
        for (file, line, name), (*_, cumulative, _) in stats.stats.items()
        if Path(file).is_relative_to(package) and not Path(file).is_relative_to(package / "model")
    ]
    return {where: 1000 * seconds / updates for seconds, where in sorted(ours)[::-1][:count]}


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# the windows, in the order they run
WINDOWS = ("plain", "profiled", "cprofile", "syncs")


class StepWindows(pl.Callback):
    """The windows of `steps` updates each, one after another from update `first`."""

    def __init__(self, first: int, steps: int, out: Path) -> None:
        self.first, self.steps, self.out = first, steps, out
        self.end = first + len(WINDOWS) * steps
        self.summary: dict[str, Any] = {
            "validations": [],
            "epoch_ends_ms": [],
            "checkpoint_saves_ms": [],
        }
        self._batch_end: float | None = None
        self._validating = 0.0  # seconds validated since the last update
        self._tokens, self._started = 0, 0.0
        self._profiler: torch.profiler.profile | None = None
        self._cprofile: cProfile.Profile | None = None
        self._sync_sites: collections.Counter[str] = collections.Counter()
        self._show_warning = warnings.showwarning
        self._validation_start = 0.0
        # what a window does besides timing, at its start and its end
        self._hooks = {
            "profiled": (self._start_profile, self._finish_profile),
            "cprofile": (self._start_cprofile, self._finish_cprofile),
            "syncs": (self._start_syncs, self._finish_syncs),
        }

    def window(self, update: int) -> tuple[str | None, int]:
        """The window update number `update` (from 0) falls in, and its place in it."""
        number, place = divmod(update - self.first, self.steps)
        return (WINDOWS[number] if 0 <= number < len(WINDOWS) else None), place

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, index: int):
        if index == 0 and self._batch_end is not None:
            between = time.perf_counter() - self._batch_end - self._validating
            self.summary["epoch_ends_ms"].append(1000 * between)
        window, place = self.window(trainer.global_step)
        if window is None or place != 0:
            return
        synchronize()
        self._tokens, self._started = 0, time.perf_counter()
        if window in self._hooks:
            start, _ = self._hooks[window]
            start()

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, *_):
        self._batch_end, self._validating = time.perf_counter(), 0.0
        self._tokens += batch.tgt_tokens
        window, place = self.window(trainer.global_step - 1)  # the update just done
        if window is None or place != self.steps - 1:
            return
        synchronize()
        seconds = time.perf_counter() - self._started
        self.summary[window] = {
            "updates": self.steps,
            "ms_per_update": 1000 * seconds / self.steps,
            "target_tok_s": self._tokens / seconds,
        }
        if window in self._hooks:
            _, finish = self._hooks[window]
            finish(seconds)

    def _start_profile(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.__enter__()

    def _start_cprofile(self) -> None:
        self._cprofile = cProfile.Profile()
        self._cprofile.enable()

    def _start_syncs(self) -> None:
        if torch.cuda.is_available():
            warnings.simplefilter("always")
            warnings.showwarning = self._record_sync
            torch.cuda.set_sync_debug_mode("warn")

    def _record_sync(self, message: Any, *args: Any, **kwargs: Any) -> None:
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        site = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-6:])
        self._sync_sites[f"{str(message)[:60]} | {site}"] += 1

    def _finish_profile(self, seconds: float) -> None:
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        averages = profiler.key_averages()
        calls = {e.key: e.count for e in averages}
        table = averages.table(
            sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60
        )
        (self.out / "ops.txt").write_text(table)
        trace = self.out / "trace.json"
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
        busy = device_busy_seconds(events)
        operators = sum(1 for e in events if e.get("cat") == "cpu_op")
        with trace.open("rb") as raw, gzip.open(self.out / "trace.json.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        trace.unlink()
        self.summary["profiled"].update(
            {
                "device_busy_share": busy / seconds,
                "device_ms_per_update": 1000 * busy / self.steps,
                "launches_per_update": sum(calls.get(k, 0) for k in LAUNCHES) / self.steps,
                "syncs_per_update": sum(calls.get(k, 0) for k in SYNCS) / self.steps,
                "copies_per_update": sum(calls.get(k, 0) for k in COPIES) / self.steps,
                "operators_per_update": operators / self.steps,
            }
        )

    def _finish_cprofile(self, seconds: float) -> None:
        profile, self._cprofile = self._cprofile, None
        profile.disable()
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text).sort_stats("cumulative")
        stats.print_stats(60)
        stats.sort_stats("tottime").print_stats(30)
        (self.out / "cprofile.txt").write_text(text.getvalue())
        stats.dump_stats(self.out / "cprofile.prof")  # for pstats or snakeviz: callers, callees
        self.summary["cprofile"]["seq2seq_ms_per_update"] = ours_per_update(stats, self.steps)

    def _finish_syncs(self, seconds: float) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = self._show_warning
        self.summary["syncs"]["per_update"] = sum(self._sync_sites.values()) / self.steps
        sites = self._sync_sites.most_common()
        lines = [f"{n / self.steps:6.2f}/update  {site}" for site, n in sites]
        (self.out / "syncs.txt").write_text("\n".join(lines) + "\n")

    def on_validation_start(self, trainer: pl.Trainer, module: Any) -> None:
        synchronize()
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, module: Any) -> None:
        synchronize()
        seconds = time.perf_counter() - self._validation_start
        self._validating += seconds
        self.summary["validations"].append({"step": trainer.global_step, "seconds": seconds})

    def timed_saves(self, save: Callable[..., None]) -> Callable[..., None]:
        """`Trainer.save_checkpoint`, each call's wall time recorded."""

        def timed(*arguments: Any, **keywords: Any) -> None:
            started = time.perf_counter()
            save(*arguments, **keywords)
            self.summary["checkpoint_saves_ms"].append(1000 * (time.perf_counter() - started))

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("train_profile"))
    parser.add_argument("--first", type=int, default=70, help="updates before the windows")
    parser.add_argument("--steps", type=int, default=30, help="updates per window")
    parser.add_argument(
        "--average-last", type=int, default=0, help="epoch checkpoints kept, as average_last"
    )
    args, overrides = parse_with_overrides(parser, sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    windows = StepWindows(args.first, args.steps, args.out)

    from seq2seq import train as entry
    from seq2seq.training import run

    build_trainer = run.build_trainer

    def with_windows(*arguments: Any, **keywords: Any) -> tuple[pl.Trainer, Any]:
        trainer, best = build_trainer(*arguments, **keywords)
        trainer.callbacks.append(windows)
        trainer.save_checkpoint = windows.timed_saves(trainer.save_checkpoint)
        return trainer, best

    run.build_trainer = with_windows
    fixed = [
        f"trainer.max_steps={windows.end}",
        f"average_last={args.average_last}",
        "evaluate_after=false",
    ]
    sys.argv = [sys.argv[0], *overrides, *fixed]
    started = time.perf_counter()
    entry.main()
    windows.summary["process_seconds"] = time.perf_counter() - started
    windows.summary["environment"] = environment("train_profile.py", [*overrides])
    if torch.cuda.is_available():
        windows.summary["environment"]["gpu_max_allocated_mib"] = (
            torch.cuda.max_memory_allocated() / 2**20
        )
    with atomic_path(args.out / "summary.json") as tmp:
        tmp.write_text(json.dumps(windows.summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in windows.summary.items() if k != "environment"}, indent=1))


if __name__ == "__main__":
    main()
