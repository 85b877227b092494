"""scripts/corpus_recipe.py without training: the corpora it names, the seeded subsets, and the
scores its JSON reports against sacreBLEU recomputed."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from helpers import ROOT, SHARED_DATA, compose_config, write_lines
from sacrebleu.metrics import BLEU

from seq2seq.data.corpus import read_lines, split_paths


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import corpus_recipe

    return corpus_recipe


def test_a_subset_is_a_seeded_sample_of_aligned_pairs(script: ModuleType, tmp_path: Path) -> None:
    sources = [f"s{i}" for i in range(50)]
    src = write_lines(tmp_path / "train.src", sources)
    tgt = write_lines(tmp_path / "train.tgt", [f"t{i}" for i in range(50)])
    first = script.subset(src, tgt, 10, tmp_path / "a")
    again = script.subset(src, tgt, 10, tmp_path / "b")
    picked = read_lines(first[0])
    assert picked == read_lines(again[0]) and len(set(picked)) == 10
    assert [line.replace("s", "t") for line in picked] == read_lines(first[1])  # aligned
    assert picked == sorted(picked, key=sources.index)  # in corpus order
    assert picked != sources[:10]  # a sample, not the head


def test_samples_of_two_directions_keep_their_own_files(script: ModuleType, tmp_path: Path) -> None:
    if not (SHARED_DATA / "multi30k").is_dir():
        pytest.skip(f"needs {SHARED_DATA}")
    de, _ = script.corpus_overrides("multi30k:en-de:100", tmp_path)
    cs, _ = script.corpus_overrides("multi30k:en-cs:100", tmp_path)  # beside it, or after it
    de, cs = (
        split_paths(compose_config(de).data, "train"),
        split_paths(compose_config(cs).data, "train"),
    )
    assert read_lines(de.src) == read_lines(cs.src)  # the same pairs' English
    for split, lang in ((de, "de"), (cs, "cs")):
        full = read_lines(SHARED_DATA / "multi30k" / f"train.{lang}.gz")
        assert set(read_lines(split.tgt)) <= set(full)  # each still its own language


@pytest.mark.parametrize(
    "corpus",
    [
        "multi30k:en-cs",
        "multi30k:fr-de:5000",
        "autshumato:en-nso",
        "autshumato:en-zu",
        "menyo:en-yo",
    ],
)
def test_each_named_corpus_composes_with_the_recipes(
    script: ModuleType, corpus: str, tmp_path: Path
) -> None:
    if not (SHARED_DATA / "autshumato_en_zu").is_dir():
        pytest.skip(f"needs {SHARED_DATA}")
    overrides, test_set = script.corpus_overrides(corpus, tmp_path)
    for recipe in ("corpus_cpu_1h", "multi30k_cpu_1h_tuned"):
        config = compose_config([f"experiment={recipe}", *overrides])
        src, tgt = corpus.split(":")[1].split("-")
        assert (config.data.src_lang, config.data.tgt_lang) == (src, tgt)
        assert test_set in config.data.test_sets
        test = split_paths(config.data, test_set)
        assert test.tgt.is_file()
        assert test.tsv or test.tgt.name.split(".")[-2] == tgt
        assert not test.tsv or (test.languages == (src, tgt) and test.skip_malformed)


def test_an_unknown_corpus_is_refused(script: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--corpus wmt:en-de: use multi30k"):
        script.corpus_overrides("wmt:en-de", tmp_path)


def test_scores_are_sacrebleus_with_both_tokenizations(script: ModuleType) -> None:
    hypotheses = ["Ke a leboga, Modulasetulo.", "Mmušo o tla thuša."]
    references = ["Ke a leboga Modulasetulo.", "Mmušo o tla thuša batho."]
    scores = script.scores(hypotheses, references)
    for tokenize in ("13a", "intl"):
        metric = BLEU(tokenize=tokenize)
        expected = metric.corpus_score(hypotheses, [references])
        assert scores[f"bleu_{tokenize}"] == round(expected.score, 2)
        assert f"tok:{tokenize}" in scores[f"bleu_{tokenize}_signature"]
    assert 0 < scores["chrf"] < 100


def test_the_record_names_the_warmup_that_set_the_schedule(script: ModuleType) -> None:
    tree: dict = {}
    for key in script.SETTINGS:
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = 1
    tree["optim"].update(warmup_ratio=0.25, warmup_steps=1000)
    assert "optim.warmup_steps" not in script.settings(tree)
    tree["optim"].update(warmup_ratio=0.0)
    assert script.settings(tree)["optim.warmup_steps"] == 1000
