"""The docs as a reader meets them: every relative link in README.md and docs/*.md leads to a
file that exists and, with a #fragment, to a heading of it (GitHub's anchors), and no text of
the project points at a tracker the user cannot see. README stays a guide one can read through
(its length, its prose lines), docs/results.md a reference of bounded length; no doc names a
path of the machine it was written on, and every `ckpt_path=` names a model that the commands
read for every preset: a run directory, its final.ckpt, an export directory, or a candidate
checkpoint in a paragraph that says which preset (or every run) writes it."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# where a tracker reference would reach a user: the guides and every source, config, script and
# test (docs/ whole: its benchmark JSON and CSV tables too)
TEXT_ROOTS = [ROOT / "README.md", ROOT / "docs", ROOT / "seq2seq", ROOT / "scripts", ROOT / "tests"]
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) and ![alt](target), an optional "title" after the target
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")  # [name]: target
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...
# the word and a number (this pattern's own text has none, so this file does not report itself)
TRACKER = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)

README_MAX_LINES = 250
RESULTS_MAX_LINES = 400
PROSE_MAX_CHARACTERS = 200  # a README line outside code blocks
# a home or work directory of the machine a doc was written on
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|root|home|Users)/[^\s`)\]]*")
CKPT_PATH = re.compile(r"ckpt_path=([^\s`)\]\"',;]*)")
CANDIDATES = {"last", "best", "averaged"}  # what the final-checkpoint rule chooses among
PRESETS = sorted(p.stem for p in (ROOT / "seq2seq" / "conf" / "experiment").glob("*.yaml"))
WRITES = re.compile(r"\b(writes|written|write)\b")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks, inline code blanked out:
    a link or heading shown as code is not one."""
    fence = ""
    for number, line in enumerate(text.splitlines(), 1):
        marker = FENCE.match(line)
        if fence:
            # a closing fence: the opening's character, at least as many, nothing after them
            if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
                fence = "" if not line.strip().lstrip(fence[0]) else fence
            continue
        if marker:
            fence = marker.group(1)
            continue
        yield number, INLINE_CODE.sub(lambda match: " " * len(match.group(0)), line)


def segments(text: str) -> Iterator[tuple[int, list[str], bool]]:
    """(first line number, lines, is code) of each fenced code block and prose paragraph."""
    fence, start, lines = "", 0, []
    for number, line in enumerate(text.splitlines(), 1):
        marker = FENCE.match(line)
        if fence:
            lines.append(line)
            closes = (
                marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence)
            )
            if closes and not line.strip().lstrip(fence[0]):
                yield start, lines, True
                fence, lines = "", []
            continue
        if marker:
            if lines:
                yield start, lines, False
            fence, start, lines = marker.group(1), number, [line]
        elif line.strip():
            start, lines = (start, lines) if lines else (number, [])
            lines.append(line)
        elif lines:
            yield start, lines, False
            lines = []
    if lines:
        yield start, lines, bool(fence)


def checkpoint_problem(value: str, context: str) -> str | None:
    """Why a `ckpt_path=` value does not name a model every preset's run has, if it does not."""
    value = value.rstrip(".:")
    if value in ("auto", "null"):  # train's: where to resume from
        return None
    if not value or "..." in value:
        return "names no model: give a run directory, its final.ckpt or an export directory"
    name = value.rsplit("/", 1)[-1]
    if not name.endswith(".ckpt") or name == "final.ckpt":  # a run or an export directory
        return None
    if name.removesuffix(".ckpt") not in CANDIDATES:
        return "names a checkpoint no run writes: give a run directory or its final.ckpt"
    says_who = WRITES.search(context) and (
        "every run" in context.lower() or any(preset in context for preset in PRESETS)
    )
    if says_who:
        return None
    return (
        f"{name} is one of the candidates, which presets write differently: give the run "
        "directory or final.ckpt, or say in the paragraph which preset (or every run) writes it"
    )


def checkpoint_references(text: str) -> list[str]:
    """'line N: ckpt_path=value: why' for each value that checkpoint_problem refuses; a code
    block's context is the paragraph before it and the block."""
    failures, before = [], ""
    for start, lines, is_code in segments(text):
        block = "\n".join(lines)
        context = f"{before}\n{block}" if is_code else block
        for offset, line in enumerate(lines):
            for match in CKPT_PATH.finditer(line):
                why = checkpoint_problem(match.group(1), context)
                if why:
                    failures.append(f"line {start + offset}: ckpt_path={match.group(1)}: {why}")
        before = "" if is_code else block
    return failures


def guide_problems(text: str, max_lines: int, max_prose: int | None = None) -> list[str]:
    """A doc's length and its prose lines' length."""
    lines = text.splitlines()
    failures = [f"{len(lines)} lines, over {max_lines}"] if len(lines) > max_lines else []
    if max_prose is not None:
        failures += [
            f"line {number}: {len(line)} characters outside code, over {max_prose}"
            for number, line in prose_lines(text)
            if len(line) > max_prose
        ]
    return failures


def machine_paths(text: str) -> list[str]:
    return [
        f"line {number}: {match.group(0)}: a path of one machine; write it relative"
        for number, line in enumerate(text.splitlines(), 1)
        for match in MACHINE_PATH.finditer(line)
    ]


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every inline, image and reference-definition link."""
    for number, line in prose_lines(text):
        for match in LINK.finditer(line):
            yield number, match.group(1)
        definition = REFERENCE.match(line)
        if definition:
            yield number, definition.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (links and inline markup reduced to their words),
    lowercased, punctuation other than '-' and '_' dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = unicodedata.normalize("NFC", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every fragment a link may name in this Markdown: each heading's slug, repeated headings
    numbered -1, -2, ... as GitHub numbers them, and explicit <a id=...>/<a name=...>."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    original = text.splitlines()
    for number, line in prose_lines(text):
        heading = HEADING.match(original[number - 1])
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def broken_links(files: Iterable[Path], root: Path) -> list[str]:
    """'file:line: target: why' for each relative link that leads nowhere."""
    failures = []
    cache: dict[Path, set[str]] = {}
    for source in files:
        for number, target in links(source.read_text(encoding="utf-8")):
            if not target or SCHEME.match(target):
                continue
            path_part, _, fragment = target.partition("#")
            destination = (source.parent / unquote(path_part)).resolve() if path_part else source
            where = f"{source.relative_to(root)}:{number}: {target}"
            if not destination.exists():
                failures.append(f"{where}: no such file")
            elif fragment and destination.suffix == ".md":
                if destination not in cache:
                    cache[destination] = anchors(destination.read_text(encoding="utf-8"))
                if unquote(fragment) not in cache[destination]:
                    failures.append(f"{where}: no heading or <a id> with this anchor")
    return failures


def text_files(roots: Iterable[Path]) -> Iterator[Path]:
    for top in roots:
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            if path.is_file() and not SKIPPED_DIRS & set(path.parts):
                yield path


def tracker_references(files: Iterable[Path], root: Path) -> list[str]:
    """'file:line: text' for each mention of a tracker's issue number; binary files are skipped."""
    failures = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in TRACKER.finditer(line):
                failures.append(f"{path.relative_to(root)}:{number}: {match.group(0)}")
    return failures


def test_every_relative_link_resolves() -> None:
    failures = broken_links(DOCS, ROOT)
    assert not failures, "broken links:\n" + "\n".join(failures)


def test_no_tracker_references() -> None:
    failures = tracker_references(text_files(TEXT_ROOTS), ROOT)
    assert not failures, "a user has no tracker; say what is meant instead:\n" + "\n".join(failures)


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("The final checkpoint", "the-final-checkpoint"),
        ("CUDA graphs (`cuda_graphs=N`)", "cuda-graphs-cuda_graphsn"),
        (
            "The moving average of the weights (`optim.ema_decay`)",
            "the-moving-average-of-the-weights-optimema_decay",
        ),
        ("`multi30k_cpu_1h_tuned`", "multi30k_cpu_1h_tuned"),
        ("Runs 48 and 49: one head, at 4,000 updates", "runs-48-and-49-one-head-at-4000-updates"),
        ("Results: en->de, 2026-11-24", "results-en-de-2026-11-24"),
        ("See [the guide](guide.md) -- twice", "see-the-guide----twice"),
        ("Übersetzung café", "übersetzung-café"),
    ],
)
def test_slug_is_githubs(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_anchors_number_repeated_headings_and_skip_code() -> None:
    text = "# Setup\n\n## Setup\n\n```bash\n# Setup\n# not a heading\n```\n\n### Setup\n"
    text += '<a id="custom"></a>\n'
    assert anchors(text) == {"setup", "setup-1", "setup-2", "custom"}


def test_broken_links_are_reported_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Two words\n", encoding="utf-8")
    (tmp_path / "docs" / "my picture.png").write_bytes(b"\x89PNG")
    readme = tmp_path / "README.md"
    readme.write_text(
        "\n".join(
            [
                "# Title",
                "[ok](docs/guide.md) [ok](docs/guide.md#two-words) [ok](#title)",
                "![ok](docs/my%20picture.png) [web](https://example.com/x#y) [mail](mailto:a@b)",
                "[missing](docs/missing.md)",
                "text [bad anchor](docs/guide.md#three-words) and [bad here](#nothing)",
                "`[in code](docs/none.md)`",
                "```",
                "[in a fence](docs/none.md)",
                "```",
                "![missing picture](docs/img/none.png)",
                "[ref]: docs/gone.md",
            ]
        ),
        encoding="utf-8",
    )
    assert broken_links([readme], tmp_path) == [
        "README.md:4: docs/missing.md: no such file",
        "README.md:5: docs/guide.md#three-words: no heading or <a id> with this anchor",
        "README.md:5: #nothing: no heading or <a id> with this anchor",
        "README.md:10: docs/img/none.png: no such file",
        "README.md:11: docs/gone.md: no such file",
    ]


def test_tracker_references_are_reported_with_file_and_line(tmp_path: Path) -> None:
    number = 27
    (tmp_path / "notes.md").write_text(
        f"fine: an issue of the data, issues with it\nsee Issue {number} and iss{'ue'} #{number}\n",
        encoding="utf-8",
    )
    (tmp_path / "image.png").write_bytes(b"\xff" + f"issue {number}".encode())  # not UTF-8
    found = tracker_references(text_files([tmp_path]), tmp_path)
    assert found == [f"notes.md:2: Issue {number}", f"notes.md:2: issue #{number}"]


def every_doc(check: Callable[[str], list[str]]) -> list[str]:
    """'file: failure' for each of `check`'s failures in README.md and docs/*.md."""
    return [
        f"{doc.relative_to(ROOT)}: {failure}"
        for doc in DOCS
        for failure in check(doc.read_text(encoding="utf-8"))
    ]


def test_readme_and_results_keep_their_shape() -> None:
    readme = DOCS[0].read_text(encoding="utf-8")
    failures = [
        f"README.md: {f}" for f in guide_problems(readme, README_MAX_LINES, PROSE_MAX_CHARACTERS)
    ]
    results = ROOT / "docs" / "results.md"
    failures += [
        f"docs/results.md: {f}"
        for f in guide_problems(results.read_text(encoding="utf-8"), RESULTS_MAX_LINES)
    ]
    assert not failures, "\n".join(failures)


def test_no_doc_holds_a_machine_path() -> None:
    failures = every_doc(machine_paths)
    assert not failures, "\n".join(failures)


def test_every_ckpt_path_names_a_model_every_preset_has() -> None:
    failures = every_doc(checkpoint_references)
    assert not failures, "\n".join(failures)


def test_the_shape_checks_fail_on_a_mutated_readme_and_results() -> None:
    """The real files pass (above); each mutation of them is reported, with its line."""
    readme = DOCS[0].read_text(encoding="utf-8")
    assert not guide_problems(readme, README_MAX_LINES, PROSE_MAX_CHARACTERS)
    padded = readme + "more\n" * (README_MAX_LINES + 1 - len(readme.splitlines()))
    assert guide_problems(padded, README_MAX_LINES) == [f"{README_MAX_LINES + 1} lines, over 250"]
    long_line = "word " * 41  # 205 characters
    [failure] = guide_problems(f"{readme}\n{long_line}\n", README_MAX_LINES + 2, 200)
    assert failure.startswith(f"line {len(readme.splitlines()) + 2}: 205 characters")
    fenced = f"{readme}\n```\n{long_line}\n```\n"  # a code block's lines may be long
    assert not guide_problems(fenced, README_MAX_LINES + 4, PROSE_MAX_CHARACTERS)
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    grown = results + "row\n" * (RESULTS_MAX_LINES + 1 - len(results.splitlines()))
    assert guide_problems(grown, RESULTS_MAX_LINES) == ["401 lines, over 400"]
    user = "/home/" + "alice"
    [failure] = machine_paths(f"intro\nrun `cd {user}/seq2seq` first\n")
    assert failure.startswith(f"line 2: {user}/seq2seq")
    assert not machine_paths("paths.data_dir=../shared/data, $HOME/data, ~/work/x, a/work/b")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("```bash\npython -m seq2seq.evaluate ckpt_path=outputs/run/checkpoints/averaged.ckpt\n```",
         "averaged.ckpt is one of the candidates"),
        ("Translate with `ckpt_path=.../last.ckpt`.", "names no model"),
        ("Translate with `ckpt_path=...`.", "names no model"),
        ("Use ckpt_path=run/checkpoints/epoch007.ckpt.", "names a checkpoint no run writes"),
        ("Every run writes it: `ckpt_path=<run>/checkpoints/last.ckpt`.", None),
        ("`experiment=multi30k_cpu_1h` writes averaged.ckpt:\n\n"
         "```\nseq2seq.export ckpt_path=r/checkpoints/averaged.ckpt\n```", None),
        ("`ckpt_path=outputs/<date>/<time>-<pid>`, `ckpt_path=model_ct2`", None),
        ("`ckpt_path=r/checkpoints/final.ckpt`, train's `ckpt_path=auto`", None),
    ],
)  # fmt: skip
def test_checkpoint_references_are_checked(text: str, problem: str | None) -> None:
    found = checkpoint_references(text)
    if problem is None:
        assert found == []
    else:
        [failure] = found
        assert problem in failure and failure.startswith("line ")
