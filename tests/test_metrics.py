"""Our scores equal the sacrebleu command line's on the same files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.metrics import corpus_scores

HYPOTHESES = [
    "Ein Mann fährt auf einem Fahrrad die Straße entlang.",
    "Zwei Hunde spielen im Schnee",
    "eine Frau mit einem roten Hut liest ein Buch .",
    "Kinder spielen Fußball auf einer Wiese.",
]
REFERENCES = [
    "Ein Mann fährt mit dem Fahrrad eine Straße entlang.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau mit rotem Hut liest ein Buch.",
    "Kinder spielen auf einer grünen Wiese Fußball.",
]


def sacrebleu_cli(tmp_path: Path, *args: str) -> float:
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("\n".join(HYPOTHESES) + "\n")
    ref.write_text("\n".join(REFERENCES) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-b", "-w", "2", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


@pytest.mark.parametrize(
    ("key", "args"),
    [("bleu", ()), ("chrf", ("-m", "chrf")), ("bleu_lc", ("-lc", "-tok", "13a"))],
)
def test_scores_equal_the_sacrebleu_command_line(tmp_path: Path, key: str, args) -> None:
    ours = corpus_scores(HYPOTHESES, REFERENCES)
    assert ours[key] == sacrebleu_cli(tmp_path, *args)
    assert 0 < ours[key] < 100


def test_signatures_say_what_was_computed() -> None:
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert "case:lc" in scores["bleu_lc_signature"]
    assert scores["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    assert scores["bleu_lc"] > scores["bleu"]  # the lowercased 'eine' matches 'Eine'
