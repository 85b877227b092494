"""Shared start-up of the entry points: Hydra composition, schema check, readable errors."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from seq2seq.config import CONF_DIR, RootConfig, validate_config
from seq2seq.errors import Seq2SeqError

log = logging.getLogger("seq2seq")


def entrypoint(
    config_name: str, schema: type = RootConfig
) -> Callable[[Callable[[Any], None]], Callable[[], None]]:
    """Turn `task(config)` into a Hydra command whose user errors print one message, exit 1."""

    def wrap(task: Callable[[Any], None]) -> Callable[[], None]:
        # an absolute config path: found however the entry point is started (python -m, a
        # script importing main, Lightning's DDP launcher)
        @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
        @functools.wraps(task)
        def main(cfg: DictConfig) -> None:
            try:
                task(validate_config(cfg, schema))
            except Seq2SeqError as e:
                log.error("%s", e)
                print(f"error: {e}", file=sys.stderr)
                sys.exit(1)

        return main

    return wrap
