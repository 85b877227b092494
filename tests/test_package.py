"""The package as a user installs it: a wheel in a fresh environment runs its commands with the
configs inside it, `python -m seq2seq` lists them, and the modules form no import cycle, the
data flow never reaching back up (docs/architecture.md)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from helpers import ROOT
from packaging.requirements import Requirement

from seq2seq.decoding.ctranslate2_backend import import_ctranslate2
from seq2seq.errors import ConfigError, extra_packages

PACKAGE = ROOT / "seq2seq"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
COMMANDS = {value.split(":")[0] for value in SCRIPTS.values()}  # seq2seq.train, ...
MACHINERY = ("data", "model", "training", "decoding", "analysis", "serving")
# what each package may import besides itself and these top-level modules (the schema, the
# upgrade of saved configs, errors, file helpers, locks and threads of runs side by side, scores):
# the flow files -> tokenizer -> batches -> model -> loss / decoding -> metrics -> reports, with
# training driving it
SHARED = {
    "seq2seq",
    "seq2seq.config",
    "seq2seq.upgrade",
    "seq2seq.errors",
    "seq2seq.io",
    "seq2seq.concurrency",
    "seq2seq.metrics",
}
ALLOWED = {
    "data": set(),
    "model": set(),
    "decoding": {"data", "model"},
    "analysis": {"data", "model", "decoding"},
    "training": {"data", "model", "decoding", "analysis"},
    "serving": {"data", "model", "decoding", "analysis"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """The package's modules that `path` imports anywhere in it, deferred imports included;
    `from seq2seq.x import y` names seq2seq.x.y when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in MODULES
                else node.module
                for alias in node.names
            ]
        else:
            continue
        found.update(name for name in names if name in MODULES)
    return found - {module_name(path)}


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_no_import_cycle_deferred_imports_included() -> None:
    on_path: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in on_path, "import cycle: " + " -> ".join([*on_path, name])
        on_path.append(name)
        for imported in sorted(GRAPH[name]):
            visit(imported)
        on_path.pop()
        done.add(name)

    for name in sorted(GRAPH):
        visit(name)


def package_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in MACHINERY else None


def test_packages_import_only_what_comes_before_them_in_the_flow() -> None:
    wrong = []
    for name, imported in GRAPH.items():
        package = package_of(name)
        if package is None:
            continue
        for other in imported:
            target = package_of(other)
            allowed = other in SHARED if target is None else target in {package, *ALLOWED[package]}
            if not allowed:
                wrong.append(f"{name} imports {other}")
    assert wrong == []


def test_the_commands_are_the_top_level_modules_users_run() -> None:
    assert {
        f"seq2seq.{c}"
        for c in ("prepare", "train", "evaluate", "translate", "export", "analyze", "visualize")
    } | {"seq2seq.report", "seq2seq.serve"} == COMMANDS
    assert all(value.endswith(":main") for value in SCRIPTS.values())
    assert set(SCRIPTS) == {f"seq2seq-{c.removeprefix('seq2seq.')}" for c in COMMANDS}


def test_the_import_path_readme_taught_still_gives_the_translator() -> None:
    from seq2seq.decoding.translator import Translation, Translator
    from seq2seq.translator import Translation as OldTranslation
    from seq2seq.translator import Translator as OldTranslator

    assert (OldTranslator, OldTranslation) == (Translator, Translation)


def test_python_m_seq2seq_lists_the_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "seq2seq"], capture_output=True, text=True, check=True
    )
    listed = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert listed == sorted(SCRIPTS)
    assert "  seq2seq-report     reports of finished runs" in result.stdout


@pytest.mark.slow
def test_a_built_wheel_installs_and_runs_its_commands_outside_the_source_tree(
    tmp_path: Path,
) -> None:
    """`pip install --no-deps` of a wheel into a fresh virtual environment beside the installed
    dependencies: its console scripts start, compose from the configs shipped in the wheel,
    and import seq2seq from the environment, not from this checkout."""
    source, wheels = tmp_path / "source", tmp_path / "wheels"  # a build leaves build/ behind
    shutil.copytree(
        ROOT / "seq2seq", source / "seq2seq", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    [wheel] = wheels.glob("seq2seq-*.whl")
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        check=True, capture_output=True,
    )  # fmt: skip
    bin_dir = venv / "bin"
    subprocess.run(
        [bin_dir / "python", "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SEQ2SEQ_SHARED_DATA")}

    def run(*command: str | Path) -> str:
        result = subprocess.run(
            [str(c) for c in command], cwd=elsewhere, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    where = run(bin_dir / "python", "-c", "import seq2seq.config as c; print(c.CONF_DIR)")
    assert Path(where.strip()).is_relative_to(venv) and Path(where.strip()).is_dir()
    job = run(bin_dir / "seq2seq-train", "--cfg", "job", "experiment=smoke")
    assert "name: transformer_tiny" in job and "name: multi30k" in job
    assert "seq2seq-translate" in run(bin_dir / "python", "-m", "seq2seq")
    assert "sweep: null" in run(bin_dir / "seq2seq-report", "--cfg", "job")
    assert "host: 127.0.0.1" in run(bin_dir / "seq2seq-serve", "--cfg", "job", "ckpt_path=x")
    page = "import seq2seq.serving.app as a; print(sorted(p.name for p in a.STATIC.iterdir()))"
    assert run(bin_dir / "python", "-c", page).strip() == "['index.html', 'page.css', 'page.js']"
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("extra", ["deploy", "hf", "serve", "sweep", "slurm", "wandb", "mlflow"])
def test_install_hints_name_the_extras_packages_of_pyproject(extra: str) -> None:
    """Read from the installed metadata: the same requirements as pyproject.toml lists."""
    listed = PYPROJECT["project"]["optional-dependencies"][extra]
    assert extra_packages(extra) != []
    assert {str(Requirement(r)) for r in extra_packages(extra)} == {
        str(Requirement(r)) for r in listed
    }


def test_an_extra_that_names_another_holds_its_packages() -> None:
    """bench names seq2seq[hf]: its hint lists transformers' range from hf (its one home), never
    `seq2seq[...]`, which would install the package index's other seq2seq."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "seq2seq[hf]" in extras["bench"]
    bench = {str(Requirement(r)) for r in extra_packages("bench")}
    hf = {str(Requirement(r)) for r in extras["hf"]}
    assert hf < bench and not any(r.startswith("seq2seq") for r in bench)
    assert "langid>=1.1.6" in bench


def test_a_missing_ctranslate2_says_how_to_install_it_from_a_wheel_or_a_checkout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The packages themselves, not `seq2seq[deploy]`: the package index's seq2seq is another
    project."""
    (ctranslate2,) = PYPROJECT["project"]["optional-dependencies"]["deploy"]
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails as if not installed
    with pytest.raises(ConfigError) as info:
        import_ctranslate2(ConfigError, "exporting to CTranslate2")
    message = str(info.value)
    wheel, checkout = message.split(" (from a source checkout: ")
    assert checkout == 'pip install -e ".[deploy]")'
    prefix = "exporting to CTranslate2 needs the ctranslate2 package: pip install "
    assert wheel.startswith(prefix)
    assert str(Requirement(wheel.removeprefix(prefix).strip('"'))) == str(Requirement(ctranslate2))
