"""`python -m seq2seq`: the commands, each run as `seq2seq-<command>` or
`python -m seq2seq.<command>` with Hydra overrides (`--help` shows a command's config)."""

from __future__ import annotations

import ast
import importlib.util
import re
from importlib.metadata import PackageNotFoundError, entry_points


def commands() -> dict[str, str]:
    """Console script -> module of the installed seq2seq's commands (pyproject's
    [project.scripts])."""
    scripts = entry_points(group="console_scripts")
    found = {s.name: s.value.split(":")[0] for s in scripts if s.value.startswith("seq2seq.")}
    if not found:
        raise PackageNotFoundError("seq2seq is not installed: pip install -e '.[dev]'")
    return found


def summary(module: str) -> str:
    """What a command does, from its docstring ("`usage`: what it does (details)."), read
    without importing it (torch is slow to import)."""
    spec = importlib.util.find_spec(module)
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    what = first.split("`: ", 1)[-1]
    return re.split(r" \(|\. |\.$", what)[0]


def main() -> None:
    print("seq2seq commands (seq2seq-<command> or python -m seq2seq.<command> [key=value ...]):")
    for script, module in sorted(commands().items()):
        print(f"  {script:<18} {summary(module)}")


if __name__ == "__main__":
    main()
