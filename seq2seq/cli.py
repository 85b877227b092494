"""Shared start-up of the entry points: Hydra composition, schema check, readable errors."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from seq2seq.concurrency import FAILED_FILE
from seq2seq.config import CONF_DIR, RootConfig, validate_config
from seq2seq.errors import ConfigError, Seq2SeqError, Stopped, install_hint
from seq2seq.io import atomic_path

log = logging.getLogger("seq2seq")

# hydra/launcher choices whose plugin is an optional extra of seq2seq (pyproject.toml):
# choice -> (plugin module, pip package, extra)
LAUNCHER_EXTRAS = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher", "sweep"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
}


def check_launcher(arguments: Sequence[str]) -> None:
    """A `hydra/launcher=` choice whose plugin is not installed: one line naming the extra.
    Checked before Hydra composes, which would fail with a listing of the installed ones."""
    for argument in arguments:
        key, _, choice = argument.lstrip("+~").partition("=")
        if key != "hydra/launcher" or choice not in LAUNCHER_EXTRAS:
            continue
        module, package, extra = LAUNCHER_EXTRAS[choice]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"hydra/launcher={choice} needs the {package} plugin, an optional extra: "
                f"{install_hint(extra)}"
            )


def check_paths(schema: type, arguments: Sequence[str]) -> None:
    """`paths.*` given to a command without them (evaluate takes its data config from the
    checkpoint): one line saying which key does the job there, before Hydra refuses the key."""
    fields = {field.name for field in dataclasses.fields(schema)}
    if "paths" in fields:
        return
    for argument in arguments:
        key, _, value = argument.lstrip("+~").partition("=")
        if key != "paths" and not key.startswith("paths."):
            continue
        if "data" not in fields:
            raise ConfigError(f"{key}: this command reads no data directory; leave it out")
        example = f", e.g. data.dir={value}/multi30k" if key == "paths.data_dir" and value else ""
        raise ConfigError(
            f"{key}: this command takes its data config from the checkpoint, so it has no "
            "paths.* keys; to read the test files from another directory, name that directory "
            f"itself: data.dir=<data_dir>/<dataset>{example}"
        )


def in_sweep() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def entrypoint(
    config_name: str, schema: type = RootConfig, before_start: Callable[[], None] | None = None
) -> Callable[[Callable[[Any], None]], Callable[[], None]]:
    """Turn `task(config)` into a Hydra command whose user errors print one message, exit 1.
    `before_start` runs before Hydra composes or writes anything (it may replace the process).

    In a sweep (`-m`) a failed run is recorded in its directory (failed.txt) and the sweep goes
    on with the others; Hydra reports the failure when all have run."""

    def wrap(task: Callable[[Any], None]) -> Callable[[], None]:
        # an absolute config path: found however the entry point is started (python -m, a
        # script importing main, Lightning's DDP launcher)
        @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
        @functools.wraps(task)  # Hydra names the job (and its .log) after the task's module
        def run(cfg: DictConfig) -> None:
            failed = Path(HydraConfig.get().runtime.output_dir) / FAILED_FILE
            if in_sweep():
                failed.unlink(missing_ok=True)
            try:
                task(validate_config(cfg, schema))
            except Exception as e:
                # in a sweep, recorded: Hydra runs the other jobs, then reports it; but Ctrl-C
                # or SIGTERM (Stopped) stops the sweep too, and a rerun resumes
                if in_sweep() and not isinstance(e, Stopped):
                    with atomic_path(failed) as tmp:
                        tmp.write_text(f"{type(e).__name__}: {e}\n")
                    log.error("run failed: %s", e)
                    raise
                if not isinstance(e, Seq2SeqError):
                    raise
                log.error("%s", e)
                print(f"error: {e}", file=sys.stderr)
                sys.exit(1)

        @functools.wraps(task)
        def main() -> None:
            try:
                if before_start is not None:
                    before_start()
                check_launcher(sys.argv[1:])
                check_paths(schema, sys.argv[1:])
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                sys.exit(1)
            run()

        return main

    return wrap
