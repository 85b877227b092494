"""scripts/multilingual.py without training: the directions it names as one config, and the
off-target rate it reports."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from helpers import ROOT, compose_config

from seq2seq.data.corpus import read_lines, split_paths
from seq2seq.data.directions import directions


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("langid", reason="needs the bench extra: .[bench]")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import multilingual

    return multilingual


def test_directions_of_three_corpora_make_one_config(
    script: ModuleType, shared_data: Path, tmp_path: Path
) -> None:
    overrides = script.direction_overrides(["en-de", "en-fr", "en-nso", "en-cs:50"], tmp_path)
    config = compose_config(overrides)
    found = {d.name: d for d in directions(config.data)}
    assert list(found) == ["en-de", "en-fr", "en-nso", "en-cs"]
    assert [found[name].corpus for name in found] == [
        "multi30k",
        "multi30k",
        "autshumato",
        "multi30k_en-cs_50",
    ]
    nso_test = split_paths(found["en-nso"].data, "test")
    assert (nso_test.src.name, nso_test.tgt.name) == ("test.en.gz", "test.nso.gz")
    assert nso_test.tgt.exists()
    train_cs = split_paths(found["en-cs"].data, "train")
    assert len(read_lines(train_cs.src)) == len(read_lines(train_cs.tgt)) == 50
    assert split_paths(found["en-cs"].data, "test").tgt.name == "test_2016_flickr.cs.gz"
    with pytest.raises(SystemExit, match="at least one Multi30k direction"):
        script.direction_overrides(["en-nso"], tmp_path)


def test_the_off_target_rate_counts_outputs_in_another_language(script: ModuleType) -> None:
    outputs = ["Ein Hund läuft über die grüne Wiese.", "A dog runs across the field.", ""]
    assert script.off_target(outputs, "de", ["en", "de", "fr"]) == 50.0  # the empty one skipped
    assert script.off_target(outputs[:1], "de", ["en", "de"]) == 0.0
    assert script.off_target(outputs, "nso", ["en", "nso"]) is None  # langid lacks it
    french = ["Un chien court dans l'herbe verte."]
    assert script.off_target(french, "fr", ["en", "fr"]) == 0.0  # after narrowing to en, de


def test_a_runs_test_sets_are_scored_for_the_language_each_asked_for(
    script: ModuleType, tmp_path: Path
) -> None:
    """A multilingual run names the direction in each test set's name; a one-direction run's
    sets are plain and take the run's language."""
    german = ["Ein Hund läuft über die grüne Wiese.", "Zwei Männer spielen Fußball im Park."]
    english = ["A dog runs across the green meadow.", "Two men play football in the park."]
    for name, lines in (("de", german), ("en", english)):
        (tmp_path / name).write_text("".join(line + "\n" for line in lines))
    test = {"hypotheses": str(tmp_path / "de"), "references": str(tmp_path / "en")}
    results = script.direction_results(
        {"test.en-de": test, "test.de-en": {**test, "zero_shot": True}}, ["de", "en"]
    )
    assert results["test.en-de"]["off_target_percent"] == 0.0
    assert results["test.de-en"]["off_target_percent"] == 100.0
    assert results["test.de-en"]["zero_shot"] and "zero_shot" not in results["test.en-de"]
    assert results["test.en-de"]["bleu_13a"] == results["test.de-en"]["bleu_13a"] < 5
    one = script.direction_results({"test": test}, ["de", "en"], "en")
    assert one["test"]["off_target_percent"] == 100.0


def test_runs_started_in_the_same_second_get_directories_of_their_own(
    script: ModuleType, tmp_path: Path
) -> None:
    wanted = tmp_path / "work" / "en-de-60min-T1-1234-20261204-150336"
    made = [script.own_directory(wanted) for _ in range(3)]
    assert [p.name for p in made] == [wanted.name, f"{wanted.name}-2", f"{wanted.name}-3"]
    assert all(p.is_dir() for p in made)
