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
