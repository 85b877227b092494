"""scripts/mbr_rerank.py: the MBR choice on a hand-checked n-best list, and its input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, python

from seq2seq.decoding.translator import Translation
from seq2seq.translate import nbest_lines

# written as seq2seq.translate writes n-best lists, so the script reads the real format
NBEST = nbest_lines(
    [
        [  # the beam's first choice is the odd one out; the other two agree
            Translation("ein Hund rennt über eine grüne Wiese", -0.10),
            Translation("ein Hund läuft über eine grüne Wiese .", -0.20),
            Translation("ein Hund läuft über eine grüne Wiese", -0.30),
        ],
        [  # every candidate the same, so the first is kept
            Translation("zwei Männer spielen Fußball", -0.50),
            Translation("zwei Männer spielen Fußball", -0.90),
        ],
    ],
    first_line=1,
)


def test_mbr_picks_the_candidate_the_others_agree_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from mbr_rerank import mbr_choice, read_nbest
    from sacrebleu.metrics import BLEU

    nbest = tmp_path / "val.nbest"
    nbest.write_text(NBEST, encoding="utf-8")
    sentences = read_nbest(nbest)
    assert [len(candidates) for candidates in sentences] == [3, 2]
    assert sentences[0][2] == (-0.30, "ein Hund läuft über eine grüne Wiese")
    utility = BLEU(effective_order=True)
    for weighted in (False, True):
        assert mbr_choice(sentences[0], utility, weighted) == "ein Hund läuft über eine grüne Wiese"
        assert mbr_choice(sentences[1], utility, weighted) == "zwei Männer spielen Fußball"
    # the first candidate alone: nothing to agree with, the beam's choice stands
    only_first = [candidates[:1] for candidates in sentences]
    assert mbr_choice(only_first[0], utility, True) == "ein Hund rennt über eine grüne Wiese"


def test_mbr_rerank_reports_the_corpus_scores_of_each_choice(tmp_path: Path) -> None:
    nbest = tmp_path / "val.nbest"
    nbest.write_text(NBEST, encoding="utf-8")
    references = tmp_path / "val.de"
    references.write_text(
        "ein Hund läuft über eine grüne Wiese\nzwei Männer spielen Fußball\n", encoding="utf-8"
    )
    figures = tmp_path / "mbr.json"
    result = python(
        ROOT / "scripts" / "mbr_rerank.py", "--references", references, "--json", figures, nbest
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(figures.read_text())[str(nbest)]
    assert row["mbr_bleu_weighted"]["bleu"] == pytest.approx(100.0)
    assert row["top1"]["bleu"] < 100.0


def test_mbr_rerank_names_the_line_of_a_plain_translation_file(tmp_path: Path) -> None:
    plain = tmp_path / "val.hyp"
    plain.write_text("ein Hund läuft\n", encoding="utf-8")
    references = tmp_path / "val.de"
    references.write_text("ein Hund läuft\n", encoding="utf-8")
    result = python(ROOT / "scripts" / "mbr_rerank.py", "--references", references, plain)
    assert result.returncode != 0
    assert f"{plain}:1: expected 'line<TAB>score<TAB>text'" in result.stderr
    assert "got 'ein Hund läuft'" in result.stderr
    assert "decoding.nbest > 1" in result.stderr


def test_mbr_rerank_refuses_references_of_another_input(tmp_path: Path) -> None:
    nbest = tmp_path / "val.nbest"
    nbest.write_text(NBEST, encoding="utf-8")
    references = tmp_path / "test.de"
    references.write_text("eine Zeile\n", encoding="utf-8")
    result = python(ROOT / "scripts" / "mbr_rerank.py", "--references", references, nbest)
    assert result.returncode != 0
    assert f"{nbest}: 2 sentences, {references} has 1 lines" in result.stderr
