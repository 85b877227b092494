"""scripts/multilingual.py without training: the directions it names as one config, and the
off-target rate it reports."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest
from helpers import ROOT, compose_config

from seq2seq.config import RootConfig
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
    named = ["en-de", "en-fr", "en-nso", "en-cs:50"]
    overrides = script.direction_overrides([script.direction(d, tmp_path) for d in named])
    config = compose_config(overrides)
    found = {d.name: d for d in directions(config.data)}
    assert list(found) == ["en-de", "en-fr", "en-nso", "en-cs"]
    assert [found[name].corpus for name in found] == [
        "multi30k",
        "multi30k",
        "autshumato_nso",
        "multi30k_en-cs_50",
    ]
    nso_test = split_paths(found["en-nso"].data, "test")
    assert (nso_test.src.name, nso_test.tgt.name) == ("test.en.gz", "test.nso.gz")
    assert nso_test.tgt.exists()
    train_cs = split_paths(found["en-cs"].data, "train")
    assert len(read_lines(train_cs.src)) == len(read_lines(train_cs.tgt)) == 50
    assert split_paths(found["en-cs"].data, "test").tgt.name == "test_2016_flickr.cs.gz"


def test_without_multi30k_the_first_direction_is_the_runs_own_corpus(
    script: ModuleType, shared_data: Path, tmp_path: Path
) -> None:
    chosen = [script.direction(d, tmp_path) for d in ("en-zu", "en-nso")]
    config = compose_config(
        ["experiment=multi30k_multilingual_cpu_1h", *script.direction_overrides(chosen)]
    )
    found = {d.name: d for d in directions(config.data)}
    assert list(found) == ["en-zu", "en-nso"]
    assert [found[name].corpus for name in found] == ["autshumato_zu", "autshumato_nso"]
    for name, lang in (("en-zu", "zu"), ("en-nso", "nso")):
        for split, part in (("train", "train"), ("val", "dev"), ("test", "test")):
            files = split_paths(found[name].data, split)
            assert (files.src.name, files.tgt.name) == (f"{part}.en.gz", f"{part}.{lang}.gz")
            assert files.tgt.exists()


def test_training_pairs_whose_source_another_direction_is_scored_on_are_removed(
    script: ModuleType, tmp_path: Path
) -> None:
    """Each trained direction loses the pairs whose source, trimmed of spaces and a byte-order
    mark, is among another named direction's dev or test sources; its own are left alone."""

    def corpus(name: str, lines: dict[str, list[str]]) -> object:
        folder = tmp_path / name
        folder.mkdir()
        files = {}
        for split, sources in lines.items():
            (folder / f"{split}.en").write_text("".join(f"{s}\n" for s in sources))
            targets = [f"{name}:{i}" for i in range(len(sources))]
            (folder / f"{split}.xx").write_text("".join(f"{t}\n" for t in targets))
            files[split] = (f"{split}.en", f"{split}.xx")
        return script.Direction(f"en-{name}", name, folder, files, False)

    a = corpus(
        "aa",
        {
            "train": ["one", " two ", "\ufeffthree", "four", "own test"],
            "val": ["a dev"],
            "test": ["own test"],
        },
    )
    b = corpus(
        "bb",
        {"train": ["five", "a dev", "one"], "val": ["two", "six"], "test": ["three", "four x"]},
    )
    kept, removed = script.without_sources(a, [a, b], tmp_path / "work")
    assert removed == 2  # "two" and "three"; "own test" is a's own, "four" is not "four x"
    src, tgt = (Path(name) for name in kept.files["train"])
    assert read_lines(src) == ["one", "four", "own test"]
    assert read_lines(tgt) == ["aa:0", "aa:3", "aa:4"]
    assert kept.files["test"] == a.files["test"] and not kept.plain
    kept_b, removed_b = script.without_sources(b, [a, b], tmp_path / "work")
    assert removed_b == 1  # "a dev"; "one" is only among a's training sources
    assert read_lines(Path(kept_b.files["train"][0])) == ["five", "one"]
    assert script.without_sources(a, [a], tmp_path / "work") == (a, 0)


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


@pytest.mark.parametrize(("minutes", "seconds"), [(60, 3600), (4.75, 285), (15.6, 936), (90, 5400)])
def test_a_clock_of_any_minutes_is_a_max_time_lightning_reads(
    script: ModuleType, minutes: float, seconds: int
) -> None:
    from pytorch_lightning.callbacks import Timer

    timer = Timer(duration=script.clock(minutes))  # refuses anything but DD:HH:MM:SS
    assert timer._duration == seconds


def test_a_recipe_given_replaces_the_preset_each_run_shape_defaults_to(
    script: ModuleType, shared_data: Path, tmp_path: Path
) -> None:
    def run(named: list[str], recipe: str | None, trial: bool = False) -> tuple[str, RootConfig]:
        args = argparse.Namespace(
            recipe=recipe,
            temperature=5.0,
            minutes=30,
            seed=2024,
            dev_trial=trial,
            overrides=["threads=1"],
        )
        chosen = [script.direction(d, tmp_path) for d in named]
        command = script.overrides(args, chosen, tmp_path / "run")
        return command[0], compose_config([o for o in command if not o.startswith("hydra.")])

    preset, nso = run(["en-nso"], "corpus_cpu_1h")  # a bilingual control, derived from its corpus
    assert preset == "experiment=corpus_cpu_1h"
    assert nso.derive_from_corpus and (nso.data.src_lang, nso.data.tgt_lang) == ("en", "nso")
    assert (nso.trainer["max_time"], nso.seed, nso.threads) == ("00:00:30:00", 2024, 1)
    preset, both = run(["en-nso", "en-zu"], None)
    assert preset == "experiment=multi30k_multilingual_cpu_1h"
    assert (both.model.d_model, both.data.mix_temperature) == (192, 5.0)
    assert not both.derive_from_corpus
    preset, derived = run(["en-nso", "en-zu"], "corpus_cpu_1h", trial=True)  # derived from both
    assert derived.derive_from_corpus and derived.data.multilingual
    assert not derived.evaluate_after and nso.evaluate_after  # a dev trial scores no test set
    assert [d.name for d in directions(derived.data)] == ["en-nso", "en-zu"]
    preset, de = run(["en-de"], None)
    assert preset == "experiment=multi30k_cpu_1h_tuned"
    assert (de.data.tgt_lang, de.derive_from_corpus) == ("de", False)
