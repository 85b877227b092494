"""`python -m seq2seq.train [overrides]`: train a Transformer, average, score the test sets.

The run directory (Hydra's, under outputs/) receives the resolved config, the tokenizer
models, checkpoints, metrics (metrics.csv, and the files of the `logger=` choice) and the
learning curve. The run itself is seq2seq.training.run.

The command imports the run, and with it Lightning and torch, only after it has started itself
again under tcmalloc (seq2seq.allocator). Those imports are most of its start (9 of 10 s on a
2-core AMD EPYC; bf16 units: none), and they ran twice when they came before the restart.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from seq2seq.allocator import (
    allocator_description,
    allocator_in_use,
    find_tcmalloc,
    restart_under_tcmalloc,
)
from seq2seq.cli import entrypoint, in_sweep
from seq2seq.concurrency import RunDirectory, release_run_memory
from seq2seq.config import RootConfig, config_to_dict
from seq2seq.errors import ConfigError
from seq2seq.io import atomic_path
from seq2seq.training.config import several_processes

log = logging.getLogger("seq2seq.train")


def check_launcher_fits(config: RootConfig) -> None:
    """Lightning's DDP launcher starts each rank by re-running the command line; inside a
    joblib worker that command is the whole sweep."""
    launcher = HydraConfig.get().launcher.get("_target_", "")
    if "joblib" in launcher and several_processes(config.trainer):
        raise ConfigError(
            "trainer: data-parallel training (strategy, devices or num_nodes) cannot run inside "
            "hydra/launcher=joblib: each rank would re-run the whole sweep. Run the sweep with "
            "the basic launcher (the default), or train with one process per run"
        )


@entrypoint(config_name="train", before_start=restart_under_tcmalloc)
def main(config: RootConfig) -> None:
    # after the restart under tcmalloc: see the module's docstring
    from lightning_fabric.utilities.rank_zero import rank_zero_only

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    check_launcher_fits(config)
    if in_sweep() and (run_dir / "run_summary.json").is_file():
        log.info("%s has finished (run_summary.json): skipped", run_dir)
        print(f"finished already, skipped: {run_dir}")
        return
    if in_sweep():  # a worker's earlier run, a failed one included
        release_run_memory()
    held = RunDirectory(run_dir)
    if rank_zero_only.rank == 0:  # the other ranks of this run share its directory
        held.hold()
    try:
        train_and_evaluate(config, run_dir)
    finally:
        held.release()
        if in_sweep():
            release_run_memory()


def train_and_evaluate(config: RootConfig, run_dir: Path) -> None:
    from seq2seq.evaluate import evaluate_checkpoint  # torch: after the restart, as in main
    from seq2seq.training.recipe import derive
    from seq2seq.training.run import train

    config = derive(config)  # derive_from_corpus: settings from the training split's counts
    allocator = allocator_in_use()
    log.info("memory allocator: %s", allocator_description(allocator, os.environ, find_tcmalloc()))
    summary = train(config, run_dir)
    if summary is None:  # not the first process of a data-parallel run
        return
    summary["allocator"] = allocator
    final = Path(summary["final_checkpoint"])
    if config.evaluate_after and config.data.test_sets:
        scores = evaluate_checkpoint(final, config.decoding, config_to_dict(config.data))
        summary["test"] = scores["test_sets"]
    with atomic_path(run_dir / "run_summary.json") as tmp:  # written last: the run is complete
        tmp.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    # the run directory is the name of the trained model: ckpt_path=<it> in every other command
    print(f"run directory: {shown(run_dir)}\nfinal checkpoint: {shown(final)}")


def shown(path: Path) -> str:
    """A path as the user launched from: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    main()
