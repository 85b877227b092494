"""The docs as a reader meets them: every relative link in README.md and docs/*.md leads to a
file that exists and, with a #fragment, to a heading of it (GitHub's anchors), and no text of
the project points at a tracker the user cannot see."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
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
