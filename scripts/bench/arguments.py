"""Command lines of the measurement scripts: their own options, then `--` and config overrides."""

from __future__ import annotations

import argparse


def parse_with_overrides(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, list[str]]:
    """The script's options (before `--`) and the Hydra overrides after it."""
    if "--" not in argv:
        return parser.parse_args(argv), []
    split = argv.index("--")
    return parser.parse_args(argv[:split]), argv[split + 1 :]
