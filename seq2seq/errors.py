"""Errors a user can act on: entry points print the message alone, no traceback, and exit 1."""

import re
from importlib import metadata


class Seq2SeqError(Exception):
    """Base class: the message names the file, line or setting and says how to fix it."""


class ConfigError(Seq2SeqError):
    """A configuration key is unknown, missing or has a value that cannot work."""


class DataError(Seq2SeqError):
    """A data file is missing, unreadable, misaligned or fails its checksum."""


class CheckpointError(Seq2SeqError):
    """A checkpoint is missing, unreadable, or does not fit the data configuration."""


class TrainingError(Seq2SeqError):
    """Training cannot go on (non-finite values), or was stopped by a signal."""


class Stopped(TrainingError):
    """Ctrl-C or SIGTERM stopped training after saving a checkpoint: a sweep stops with it
    (its rerun resumes), where a failed run lets the sweep go on."""


def extra_packages(extra: str) -> list[str]:
    """The requirements of an optional extra, read from the installed package's metadata, which
    pip builds from pyproject.toml's [project.optional-dependencies] (their one home)."""
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    requirements = metadata.requires("seq2seq") or []
    found = [r.split(";")[0].strip() for r in requirements if ";" in r and marker.search(r)]
    # an extra that names another (seq2seq[hf]) holds that one's packages
    nested = [re.fullmatch(r"seq2seq\[(\w+)\]", r) for r in found]
    return [
        package
        for requirement, inner in zip(found, nested, strict=True)
        for package in (extra_packages(inner[1]) if inner else [requirement])
    ]


def install_hint(extra: str) -> str:
    """How to install an optional extra, from a wheel and from a source checkout: the packages
    themselves, as `seq2seq` on the package index is another project."""
    packages = " ".join(f'"{package}"' for package in extra_packages(extra))
    return f'pip install {packages} (from a source checkout: pip install -e ".[{extra}]")'


def require(ok: bool, key: str, message: str) -> None:
    """Raise a ConfigError naming the config `key` unless `ok`: the one format of such errors."""
    if not ok:
        raise ConfigError(f"config key '{key}': {message}")
