"""Multilingual runs: several directions in one model, the target language as a tag on the
source (one SentencePiece piece), a balanced joint vocabulary, and each epoch's mixture of the
directions drawn by temperature from (seed, epoch)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    ROOT,
    compose_config,
    multilingual_overrides,
    python,
    report,
    run,
    table_rows,
    toy_languages,
    write_aligned,
    write_lines,
)
from recording import fit_recording

from seq2seq.data.corpus import split_paths
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.directions import check_target, directions, tag, target_languages, zero_shot
from seq2seq.data.mixture import MixtureSplit, TaggedSplit, draw, epoch_counts, mixture_shares
from seq2seq.data.tokenizer import balanced_sample
from seq2seq.errors import ConfigError
from seq2seq.prepare import length_cuts, length_limits
from seq2seq.training.run import trainer_arguments

LANGUAGES = ("en", "xx", "yy")


@pytest.fixture
def aligned_files(tmp_path: Path) -> Path:
    return write_aligned(tmp_path / "aligned")


def prepared_module(data: Path, tmp_path: Path, *overrides: str) -> TranslationDataModule:
    config = compose_config([*multilingual_overrides(data, tmp_path / "cache"), *overrides])
    module = TranslationDataModule(config, tmp_path / "run")
    module.setup()
    return module


def test_each_direction_reads_its_own_files(aligned_files: Path, tmp_path: Path) -> None:
    config = compose_config(multilingual_overrides(aligned_files, tmp_path / "cache"))
    found = directions(config.data)
    assert [d.name for d in found] == ["en-xx", "en-yy"]
    assert config.data.multilingual and target_languages(config.data) == ["xx", "yy"]
    module = prepared_module(aligned_files, tmp_path)
    files = module.prepared.files
    assert set(files) == {f"{s}.en-{t}" for s in ("train", "val", "test") for t in ("xx", "yy")}
    assert (files["val.en-yy"].src.name, files["val.en-yy"].tgt.name) == ("val.en", "val.yy")
    assert module.references("test.en-xx") == toy_languages()["xx"][270:300]


def test_one_direction_keeps_its_keys_and_takes_no_tag(aligned_files: Path, tmp_path: Path) -> None:
    module = prepared_module(
        aligned_files, tmp_path, "data.directions=[]", "data.src_lang=en", "data.tgt_lang=yy"
    )
    assert not module.multilingual
    assert set(module.prepared.splits) == {"train", "val", "test"}
    assert module.dataset("val", shuffle=False) is module.prepared.splits["val"]
    assert module.references("val") == toy_languages()["yy"][240:270]


def test_tags_are_single_pieces_served_before_each_source(
    aligned_files: Path, tmp_path: Path
) -> None:
    module = prepared_module(aligned_files, tmp_path)
    tokenizer = module.tokenizer
    ids = {lang: tokenizer.piece_id(tag(lang)) for lang in ("xx", "yy")}
    assert len(set(ids.values())) == 2
    for lang, id_ in ids.items():
        assert tokenizer.src.id_to_piece(id_) == tag(lang) and tokenizer.src.is_control(id_)
    with pytest.raises(KeyError):
        tokenizer.piece_id(tag("en"))  # no direction writes English
    for key, lang in (("val.en-xx", "xx"), ("val.en-yy", "yy")):
        encoded, served = module.prepared.splits[key], module.dataset(key, shuffle=False)
        assert isinstance(served, TaggedSplit)
        for i in (0, 7, len(encoded) - 1):
            index, src, tgt = encoded[i]
            tagged = served[i]
            assert tagged[0] == index
            assert tagged[1].tolist() == [ids[lang], *src.tolist()]
            assert tagged[2].tolist() == tgt.tolist()
        assert np.array_equal(served.src_lens, encoded.src_lens + 1)
        # the cached encoding is the one-direction encoding: no tag stored
        assert ids[lang] not in np.asarray(encoded.src).tolist()


def test_no_text_reaches_a_tag_and_a_tag_decodes_to_nothing(
    aligned_files: Path, tmp_path: Path
) -> None:
    tokenizer = prepared_module(aligned_files, tmp_path).tokenizer
    ids = [tokenizer.piece_id(tag(lang)) for lang in ("xx", "yy")]
    assert tokenizer.tag_ids == tuple(sorted(ids))
    line = toy_languages()["en"][0]
    for text in (f"{tag('yy')} {line}", f"{line} {tag('xx')}", tag("xx")):
        assert not set(ids) & set(tokenizer.encode_src([text])[0] + tokenizer.encode_tgt([text])[0])
    assert tokenizer.decode_tgt([[ids[0], *tokenizer.encode_tgt([line])[0]]]) == [line]


def test_a_tokenizer_with_tags_as_user_symbols_reads_their_text_as_text() -> None:
    """Tokenizers trained before tags were control symbols: the text of a tag is spelled out in
    the ids of its characters, which decode to it."""
    import io

    import sentencepiece as spm

    from seq2seq.data.tokenizer import Tokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([*toy_languages()["en"], "<2xy>"]),
        model_writer=model,
        vocab_size=40,
        character_coverage=1.0,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        user_defined_symbols=[tag("xx"), tag("yy")],
        minloglevel=2,
    )
    tokenizer = Tokenizer(model.getvalue(), model.getvalue())
    ids = [tokenizer.piece_id(tag(lang)) for lang in ("xx", "yy")]
    assert tokenizer.tag_ids == tuple(sorted(ids)) and not tokenizer.src.is_control(ids[1])
    text = f"a {tag('yy')} b{tag('xx')}"
    assert set(ids) <= set(tokenizer.src.encode(text))  # SentencePiece alone reads the tags
    [encoded] = tokenizer.encode_src([text])
    assert not set(ids) & set(encoded)
    assert tokenizer.decode_tgt([encoded]) == [text]


def test_the_joint_sample_counts_a_shared_side_once(aligned_files: Path, tmp_path: Path) -> None:
    module = prepared_module(aligned_files, tmp_path)
    (settings,) = (tmp_path / "cache" / "tokenizer").glob("*/settings.json")
    languages = json.loads(settings.read_text())["inputs"]["languages"]
    assert sorted(languages) == list(LANGUAGES)
    assert all(len(files) == 1 for files in languages.values())  # train.en once, not twice
    assert module.tokenizer.joint


def test_balanced_sample_gives_each_language_as_many_sentences() -> None:
    texts = {
        "big": [lambda: (f"b{i}" for i in range(10))],
        "small": [lambda: ["s0", "s1", "s2"], lambda: ["s3"]],  # two sources, chained
    }
    sample = balanced_sample(texts, 0, seed=1)
    big = [x for x in sample if x.startswith("b")]
    small = [x for x in sample if x.startswith("s")]
    assert sorted(big) == sorted(f"b{i}" for i in range(10))
    assert len(small) == 10  # 4 sentences, twice whole, then 2 drawn
    counts = {x: small.count(x) for x in set(small)}
    assert set(counts) == {"s0", "s1", "s2", "s3"} and set(counts.values()) <= {2, 3}
    capped = balanced_sample(texts, 8, seed=1)  # 8 / 2 languages: 4 each
    assert len(capped) == 8 and sum(x.startswith("b") for x in capped) == 4
    assert balanced_sample(texts, 0, seed=1) == sample  # seeded


def test_mixture_shares_follow_the_temperature() -> None:
    sizes = [9000, 1000]
    assert np.allclose(mixture_shares(sizes, 1.0), [0.9, 0.1])
    t5 = mixture_shares(sizes, 5.0)
    expected = np.array([0.9, 0.1]) ** 0.2
    assert np.allclose(t5, expected / expected.sum())
    assert np.allclose(mixture_shares(sizes, 1e9), [0.5, 0.5])
    for temperature in (1.0, 2.0, 5.0, 100.0):
        counts = epoch_counts([9000, 1000, 7], temperature)
        assert counts.sum() == 10007
    assert epoch_counts(sizes, 1.0).tolist() == sizes


def test_draw_repeats_a_small_direction_evenly() -> None:
    rng = np.random.default_rng(0)
    drawn = draw(4, 10, rng)
    assert len(drawn) == 10 and sorted(set(drawn.tolist())) == [0, 1, 2, 3]
    assert sorted(np.bincount(drawn).tolist()) == [2, 2, 3, 3]
    assert sorted(draw(5, 5, rng).tolist()) == [0, 1, 2, 3, 4]


def test_an_epochs_mixture_depends_on_seed_and_epoch_alone(
    aligned_files: Path, tmp_path: Path
) -> None:
    module = prepared_module(aligned_files, tmp_path, "data.mix_temperature=3")
    mixture = module.dataset("train", shuffle=True)
    assert isinstance(mixture, MixtureSplit)
    parts = mixture.parts
    served = {}
    for epoch in (0, 1, 0):
        lengths = mixture.lengths(epoch)
        items = [mixture[k] for k in range(len(mixture))]
        if epoch in served:
            assert [(s.tolist(), t.tolist()) for _, s, t in items] == served[epoch]
        served[epoch] = [(s.tolist(), t.tolist()) for _, s, t in items]
        assert [len(s) for _, s, _ in items] == lengths[0].tolist()
        assert [len(t) for _, _, t in items] == lengths[1].tolist()
    assert served[0] != served[1]
    # T = 1 and equal sizes: every pair of every direction once per epoch
    module = prepared_module(aligned_files, tmp_path / "t1")
    mixture = module.dataset("train", shuffle=True)
    mixture.lengths(0)
    got = sorted((s.tolist(), t.tolist()) for _, s, t in (mixture[k] for k in range(len(mixture))))
    want = sorted(
        (s.tolist(), t.tolist()) for p in parts for _, s, t in (p[i] for i in range(len(p)))
    )
    assert got == want


def test_a_mixture_that_draws_its_pairs_validates_every_epoch(
    aligned_files: Path, tmp_path: Path
) -> None:
    """At T != 1 each epoch draws its pairs (the small direction repeated, the large one cut),
    so epochs serve different numbers of batches, which Lightning counts when it makes the
    loaders: without a reload every epoch, an epoch shorter than the count never validated."""
    small = tmp_path / "small"
    small.mkdir()
    languages = toy_languages()
    for split, lo, hi in (("train", 0, 60), ("val", 240, 270), ("test", 270, 300)):
        for lang in ("en", "yy"):
            write_lines(small / f"{split}.{lang}", languages[lang][lo:hi])
    splits = ",".join(
        f"{split}:{{src:'{split}.en',tgt:'{split}.yy',tsv:null}}"
        for split in ("train", "val", "test")
    )
    corpus = (
        f"+data.corpora.small={{dir:'{small}',languages:null,directions:[en-yy],"
        f"splits:{{{splits}}},train_split:train,val_split:val,test_sets:[test],download:null,"
        "verify_checksums:false}"
    )
    mix = [
        "data.directions=[en-xx]",
        corpus,
        "data.mix_temperature=5",
        "data.max_tokens=40",  # small batches: a few pairs more or fewer change their count
        "data.filter.max_len=20",
    ]
    module = prepared_module(aligned_files, tmp_path, *mix)
    mixture = module.dataset("train", shuffle=True)
    large, small_pairs = (len(part) for part in mixture.parts)
    assert mixture.counts[0] < large and mixture.counts[1] > small_pairs
    model = fit_recording(module, tmp_path, epochs=4)  # every epoch validated, served whole
    assert len(set(model.expected.values())) > 1
    every_other = [*multilingual_overrides(aligned_files, tmp_path / "cache"), *mix]
    every_other.append("+trainer.reload_dataloaders_every_n_epochs=2")
    with pytest.raises(ConfigError, match="2, and data.mix_temperature needs the training"):
        trainer_arguments(compose_config(every_other))


def test_validation_decodes_each_direction(aligned_files: Path, tmp_path: Path) -> None:
    module = prepared_module(aligned_files, tmp_path)
    assert module.validation_keys() == ["val.en-xx", "val.en-yy"]
    loaders = module.val_dataloader()
    assert len(loaders) == 2
    batch = next(iter(loaders[1]))
    assert (batch.src[:, 0] == module.tokenizer.piece_id(tag("yy"))).all()


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        ("data.directions=[en-xx,en]", "data.directions", "not a direction"),
        ("data.directions=[en-xx,en-en]", "data.directions", "not a direction"),
        ("data.directions=[en-xx,en-xx]", "data.directions", "also a direction"),
        ("data.bpe_dropout=0.1", "data.bpe_dropout", "multilingual"),
        ("data.num_workers=2", "data.num_workers", "multilingual"),
        ("tokenizer.joint=false", "tokenizer.joint", "one vocabulary"),
        ("data.mix_temperature=0", "data.mix_temperature", "> 0"),
        ("data.filter.max_len=255", "data.filter.max_len", "and the tag"),
    ],
)
def test_bad_multilingual_settings_are_refused(
    aligned_files: Path, tmp_path: Path, override: str, key: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'.*{says}"):
        compose_config([*multilingual_overrides(aligned_files, tmp_path), override])


def test_multi30k_directions_must_be_its_languages(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown language 'nso' for multi30k"):
        compose_config(["data.directions=[en-de,en-nso]"])
    config = compose_config(["data.directions=[en-de,en-fr,en-cs]"])
    assert [d.data.splits["train"].src for d in directions(config.data)] == ["train.{src}.gz"] * 3
    assert target_languages(config.data) == ["cs", "de", "fr"]


def test_the_target_language_is_required_and_checked() -> None:
    config = compose_config(["data.directions=[en-de,en-fr]"])
    assert check_target(config.data, "fr") == "fr"
    with pytest.raises(ConfigError, match="unset.*de, fr.*decoding.target_lang=de"):
        check_target(config.data, None)
    with pytest.raises(ConfigError, match="'cs' is not a language this model writes; choose one"):
        check_target(config.data, "cs")
    one = compose_config([])
    assert check_target(one.data, None) is None and check_target(one.data, "de") is None
    with pytest.raises(ConfigError, match="translates en->de only"):
        check_target(one.data, "fr")
    assert not zero_shot(config.data, "en", "fr")
    with pytest.raises(ConfigError, match="de-fr, and this model never read de: it reads en"):
        zero_shot(config.data, "de", "fr")
    both_ways = compose_config(["data.directions=[de-en,en-fr]"])
    assert zero_shot(both_ways.data, "de", "fr")  # read German, wrote French: not together
    with pytest.raises(ConfigError, match="'de' is not a language this model writes"):
        zero_shot(both_ways.data, "en", "de")


# a tiny model trained 2 epochs of 4 batches, decoded greedily
TINY_RUN = [
    "model=transformer_tiny",
    "model.max_len=64",
    "data.filter.max_len=60",
    "data.max_tokens=256",
    "decoding=greedy",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=4",
    "trainer.num_sanity_val_steps=0",
    "average_last=2",
]


@pytest.fixture(scope="module")
def multilingual_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny en->xx, en->yy model trained 2 epochs, with its final choice and test scores."""
    from seq2seq.train import train_and_evaluate

    work = tmp_path_factory.mktemp("multilingual")
    data = write_aligned(work / "aligned")
    overrides = [
        *multilingual_overrides(data, work / "cache"),
        *TINY_RUN,
        "prefer_checkpoint=last",
    ]
    train_and_evaluate(compose_config(overrides), work / "run")
    return work / "run"


def test_a_multilingual_run_validates_chooses_and_tests_per_direction(
    multilingual_run: Path,
) -> None:
    from seq2seq.analysis.learning_curves import read_metrics

    rows = [r for r in read_metrics([multilingual_run / "metrics.csv"]) if r.get("val/bleu")]
    assert len(rows) == 2
    for row in rows:
        mean = (float(row["val/bleu/en-xx"]) + float(row["val/bleu/en-yy"])) / 2
        assert float(row["val/bleu"]) == pytest.approx(mean)
        assert row["val/loss/en-xx"] and row["val/loss/en-yy"]
    summary = json.loads((multilingual_run / "run_summary.json").read_text())
    assert set(summary["test"]) == {"test.en-xx", "test.en-yy"}
    assert all(not s.get("zero_shot") for s in summary["test"].values())
    choice = summary["final_checkpoint_choice"]
    assert set(choice["val_bleu_by_direction"]["last"]) == {"en-xx", "en-yy"}
    assert choice["reason"].startswith("mean validation BLEU, greedy, fp32 of 2 directions")


def test_a_multilingual_model_translates_into_the_language_asked_for(
    multilingual_run: Path,
) -> None:
    from seq2seq.config import group_config
    from seq2seq.decoding.config import DecodingConfig
    from seq2seq.decoding.translator import Translator

    final = Path(
        json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    )
    unset = Translator.from_checkpoint(final, group_config("decoding/greedy", DecodingConfig))
    with pytest.raises(ConfigError, match="unset, and this model writes xx, yy"):
        unset.translate(["a dog"])
    greedy = group_config("decoding/greedy", DecodingConfig, ["target_lang=yy"])
    translator = Translator.from_checkpoint(final, greedy)
    lines = toy_languages()["en"][270:275] + [""]
    ids = translator.source_ids(lines, "input", list(range(1, 7)))
    yy = translator.tokenizer.piece_id(tag("yy"))
    assert [seq[0] for seq in ids[:5]] == [yy] * 5 and ids[5] == []  # empty stays empty
    assert [seq[1:] for seq in ids[:5]] == translator.tokenizer.encode_src(lines[:5])
    bad = group_config("decoding/greedy", DecodingConfig, ["target_lang=en"])
    with pytest.raises(ConfigError, match="'en' is not a language this model writes"):
        Translator.from_checkpoint(final, bad).translate(["a dog"])


def test_the_language_asked_for_is_read_at_each_call(multilingual_run: Path) -> None:
    from seq2seq.config import group_config
    from seq2seq.decoding.config import DecodingConfig
    from seq2seq.decoding.translator import Translator

    final = json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    lines = toy_languages()["en"][270:274]
    by_lang = {
        lang: Translator.from_checkpoint(
            Path(final), group_config("decoding/greedy", DecodingConfig, [f"target_lang={lang}"])
        )
        for lang in ("xx", "yy")
    }
    expected = {lang: translator.translate(lines) for lang, translator in by_lang.items()}
    assert expected["xx"] != expected["yy"]
    translator = by_lang["xx"]
    assert translator.translate(lines, target_lang="yy") == expected["yy"]
    assert translator.translate(lines) == expected["xx"]  # the call's language, not kept
    translator.decoding = dataclasses.replace(translator.decoding, target_lang="yy")
    assert translator.translate(lines) == expected["yy"]  # a changed setting takes effect
    with pytest.raises(ConfigError, match="'en' is not a language this model writes"):
        translator.translate(lines, target_lang="en")


def test_attention_of_a_multilingual_model_reads_the_tagged_source(multilingual_run: Path) -> None:
    from seq2seq.analysis.attention import attention_maps, translate_with_attention
    from seq2seq.config import group_config
    from seq2seq.decoding.config import DecodingConfig
    from seq2seq.decoding.torch_backend import TorchBackend
    from seq2seq.decoding.translator import Translator

    final = json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    backend = TorchBackend.from_checkpoint(Path(final))
    line = toy_languages()["en"][271]
    with pytest.raises(ConfigError, match="unset, and this model writes xx, yy"):
        attention_maps(backend, group_config("decoding/greedy", DecodingConfig), line, "cross")
    for lang in ("xx", "yy"):
        greedy = group_config("decoding/greedy", DecodingConfig, [f"target_lang={lang}"])
        attention, translation = translate_with_attention(backend, greedy, line)
        assert attention.source[0] == tag(lang) and attention.source[-1] == "</s>"
        assert translation == Translator(backend, backend.tokenizer, greedy).translate([line])[0]
        maps, _ = attention_maps(backend, greedy, line, "encoder_self")
        assert maps[0].key[0] == tag(lang)


def test_a_multilingual_model_never_writes_a_tag_in_either_search(
    multilingual_run: Path, tmp_path: Path
) -> None:
    import torch

    from seq2seq.config import group_config
    from seq2seq.data.tokenizer import BOS_ID, PAD_ID
    from seq2seq.decoding.backend import source_batch
    from seq2seq.decoding.checkpoint import load_trained
    from seq2seq.decoding.config import DecodingConfig
    from seq2seq.decoding.translator import Translator

    final = Path(
        json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    )
    trained = load_trained(final)
    tags = sorted(trained.tokenizer.piece_id(tag(lang)) for lang in ("xx", "yy"))
    assert trained.model.never_ids == (PAD_ID, BOS_ID, *tags)
    checkpoint = torch.load(final, map_location="cpu", weights_only=False)
    for name, weight in checkpoint["state_dict"].items():
        if name.endswith("output_projection.weight"):
            weight[tags] *= 40  # the tags the most likely outputs
    boosted = tmp_path / "boosted.ckpt"
    torch.save(checkpoint, boosted)
    lines = toy_languages()["en"][240:250]
    model = load_trained(boosted).model
    yy = group_config("decoding/greedy", DecodingConfig, ["target_lang=yy"])
    ids = Translator.from_checkpoint(boosted, yy).source_ids(lines, "input", list(range(10)))
    with torch.no_grad():  # unmasked, the first token of some lines would be a tag
        logits = model(source_batch(ids), torch.full((len(lines), 1), BOS_ID))
    assert set(logits[:, 0].argmax(-1).tolist()) & set(tags)
    for beam in ("greedy", "beam"):
        decoding = group_config(f"decoding/{beam}", DecodingConfig, ["target_lang=yy"])
        outputs = Translator.from_checkpoint(boosted, decoding).translate_nbest(lines)
        written = {token for nbest in outputs for t in nbest for token in t.tokens}
        assert written and not written & set(tags)
    pytest.importorskip("ctranslate2", reason="needs the deploy extra: .[deploy]")
    from seq2seq.export import export_checkpoint

    directory = export_checkpoint(boosted, tmp_path / "ct2")
    for beam in ("greedy", "beam"):
        decoding = group_config(f"decoding/{beam}", DecodingConfig, ["target_lang=yy"])
        outputs = Translator.from_checkpoint(directory, decoding).translate_nbest(lines)
        written = {token for nbest in outputs for t in nbest for token in t.tokens}
        assert written and not written & set(tags)


def test_translate_takes_the_target_language_from_the_command_line(
    multilingual_run: Path, tmp_path: Path
) -> None:
    from seq2seq.config import group_config
    from seq2seq.decoding.config import DecodingConfig
    from seq2seq.decoding.translator import Translator

    final = json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    lines = toy_languages()["en"][270:274]
    text = "".join(line + "\n" for line in lines)
    args = [f"ckpt_path={final}", "decoding=greedy"]
    unset = run("translate", tmp_path, *args, stdin=text)
    assert unset.returncode != 0 and "this model writes xx, yy" in unset.stderr
    result = run("translate", tmp_path, *args, "decoding.target_lang=yy", stdin=text)
    assert result.returncode == 0, result.stderr[-3000:]
    greedy = group_config("decoding/greedy", DecodingConfig, ["target_lang=yy"])
    expected = Translator.from_checkpoint(Path(final), greedy).translate(lines)
    assert result.stdout == "".join(line + "\n" for line in expected)


def test_evaluate_refuses_a_source_the_model_never_read(multilingual_run: Path) -> None:
    from seq2seq.config import group_config
    from seq2seq.decoding.config import DecodingConfig
    from seq2seq.evaluate import evaluate_checkpoint

    final = Path(
        json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    )
    greedy = group_config("decoding/greedy", DecodingConfig)
    with pytest.raises(ConfigError, match="xx-yy, and this model never read xx: it reads en "):
        evaluate_checkpoint(final, greedy, {"directions": ["xx-yy", "en-yy"]})
    scores = evaluate_checkpoint(final, greedy, {"directions": ["en-yy"]})
    assert set(scores["test_sets"]) == {"test.en-yy"}
    assert "zero_shot" not in scores["test_sets"]["test.en-yy"]
    summary = json.loads((multilingual_run / "run_summary.json").read_text())
    assert scores["test_sets"]["test.en-yy"]["bleu"] == summary["test"]["test.en-yy"]["bleu"]


def test_a_one_direction_model_is_refused_other_directions() -> None:
    from seq2seq.evaluate import evaluation_sets

    trained = compose_config([]).data  # Multi30k en->de
    for asked in ("[en-de,en-fr]", "[en-fr]"):
        data = compose_config([f"data.directions={asked}"]).data
        with pytest.raises(ConfigError, match="and this model translates en->de only; leave data"):
            evaluation_sets(data, trained)


def test_a_multilingual_runs_learning_curve_has_each_directions_validation_loss(
    multilingual_run: Path,
) -> None:
    from seq2seq.analysis.learning_curves import curve_series, metrics_files, read_metrics

    series = curve_series(read_metrics(metrics_files(multilingual_run)))
    assert not series["val/loss"]  # a multilingual run logs one per direction
    for direction in ("en-xx", "en-yy"):
        assert [step for step, _ in series[f"val/loss/{direction}"]] == [
            step for step, _ in series["val/bleu"]
        ]


class Recording:
    """CTranslate2's translator, with the sources it is given recorded."""

    def __init__(self, engine) -> None:
        self.engine, self.inputs = engine, []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def translate_batch(self, batch, **options):
        self.inputs.extend(batch)
        return self.engine.translate_batch(batch, **options)


def test_the_ctranslate2_export_tags_its_sources_as_ours(
    multilingual_run: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ctranslate2", reason="needs the deploy extra: .[deploy]")
    from seq2seq.config import group_config
    from seq2seq.decoding.config import DecodingConfig
    from seq2seq.decoding.translator import Translator
    from seq2seq.export import export_checkpoint

    final = Path(
        json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    )
    directory = export_checkpoint(final, tmp_path / "ct2")
    lines = toy_languages()["en"][240:270]
    for lang in ("xx", "yy"):
        settings = [f"target_lang={lang}", "max_len_a=0", "max_len_b=20"]  # one limit for all
        greedy = group_config("decoding/greedy", DecodingConfig, settings)
        ours = Translator.from_checkpoint(final, greedy).translate_nbest(lines)
        exported = Translator.from_checkpoint(directory, greedy)
        recording = Recording(exported.backend.engine)
        exported.backend.engine = recording
        found = exported.translate_nbest(lines)
        assert recording.inputs and all(pieces[0] == tag(lang) for pieces in recording.inputs)
        for (mine,), (theirs,) in zip(ours, found, strict=True):
            # an output that reaches the limit ends there in ours (a forced EOS), and one
            # token later in CTranslate2's (docs/deploy.md); the untrained model's do
            assert theirs.tokens[: len(mine.tokens)] == mine.tokens
            assert len(mine.tokens) == 20 or theirs.tokens == mine.tokens


def test_the_server_takes_the_target_language_per_request(multilingual_run: Path) -> None:
    testclient = pytest.importorskip("fastapi.testclient")
    from seq2seq.decoding.translator import Translator, load_backend
    from seq2seq.serving.app import create_app
    from seq2seq.serving.config import ServeConfig

    final = Path(
        json.loads((multilingual_run / "run_summary.json").read_text())["final_checkpoint"]
    )
    backend = load_backend(final)
    config = compose_config([f"ckpt_path={final}", "decoding=greedy"], "serve", ServeConfig)
    lines = toy_languages()["en"][240:243]
    with testclient.TestClient(create_app(backend, config)) as client:
        assert client.get("/model").json()["target_languages"] == ["xx", "yy"]
        unset = client.post("/translate", json={"sentences": lines})
        assert (
            unset.status_code == 422
            and "choose one, e.g. decoding.target_lang=xx" in (unset.json()["error"])
        )
        wrong = client.post(
            "/translate", json={"sentences": lines, "decoding": {"target_lang": "en"}}
        )
        assert wrong.status_code == 422 and "choose one of xx, yy" in wrong.json()["error"]
        for lang in ("xx", "yy"):
            asked = dataclasses.replace(config.decoding, target_lang=lang)
            expected = Translator(backend, backend.tokenizer, asked).translate(lines)
            answer = client.post(
                "/translate", json={"sentences": lines, "decoding": {"target_lang": lang}}
            )
            assert answer.status_code == 200
            assert [n[0]["text"] for n in answer.json()["translations"]] == expected


def test_prepare_summarises_each_direction_and_the_mixture(
    aligned_files: Path, tmp_path: Path
) -> None:
    overrides = multilingual_overrides(aligned_files, tmp_path / "cache")
    result = run("prepare", tmp_path, *overrides, "data.val_subset=10")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "multilingual en-xx, en-yy: vocabulary 70 joint" in out
    assert "training epoch (data.mix_temperature=1): 480 pairs (en-xx 240, en-yy 240)" in out
    for key in ("train.en-xx", "val.en-yy", "test.en-xx"):
        assert key in out
    assert "val.en-yy: validation in training decodes a seeded random sample of 10" in out


def test_the_guides_mixed_corpora_example_composes_and_finds_its_files(
    shared_data: Path, tmp_path: Path
) -> None:
    """docs/multilingual.md's data config of Multi30k en-de beside Autshumato en-nso, with the
    Autshumato folder pointed at the shared copy: it validates, and every split it names
    exists for its direction."""
    guide = (ROOT / "docs" / "multilingual.md").read_text()
    [example] = re.findall(r"```yaml\n# conf/data/my_mix.yaml\n(.*?)```", guide, re.S)
    nso = shared_data / "autshumato_en_nso"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "my_mix.yaml").write_text(
        example.replace("/data/autshumato_en_nso", str(nso))
    )
    config = compose_config(
        [f"hydra.searchpath=[file://{tmp_path}]", "data=my_mix", f"paths.data_dir={shared_data}"]
    )
    assert [d.name for d in directions(config.data)] == ["en-de", "en-nso"]
    assert config.data.mix_temperature == 5.0
    for direction in directions(config.data):
        view = direction.data
        for name in [view.train_split, view.val_split, *view.test_sets]:
            for path in split_paths(view, name).files:
                assert path.is_file(), path


@pytest.mark.slow
def test_an_ablation_sweep_of_a_multilingual_model_reports_each_wiring_per_direction(
    aligned_files: Path, tmp_path: Path
) -> None:
    """The attention-wiring presets on a multilingual model unchanged: a two-wiring sweep trains
    both, tests both directions of each, and the report writes one table per direction."""
    sweep = tmp_path / "sweep"
    command = [
        "-m",
        "seq2seq.train",
        "-m",
        "+ablation=standard,swapped_cross",
        *multilingual_overrides(aligned_files, tmp_path / "cache"),
        *TINY_RUN,
        "threads=1",
        f"hydra.sweep.dir={sweep}",
    ]
    result = python(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["0_standard_seed1234", "1_swapped_cross_seed1234"]
    for run_dir in runs:
        summary = json.loads((run_dir / "run_summary.json").read_text())
        assert set(summary["test"]) == {"test.en-xx", "test.en-yy"}
    result = report(f"sweep={sweep}")
    assert result.returncode == 0, result.stderr
    for direction in ("en-xx", "en-yy"):
        table = sweep / f"test.{direction}" / "ablation.md"
        assert sorted(table_rows(table)) == ["standard", "swapped_cross"]
        assert f"[test.{direction}/ablation.md]" in (sweep / "ablation.md").read_text()


def test_the_tag_takes_a_source_position_in_the_length_limits(
    aligned_files: Path, tmp_path: Path
) -> None:
    """A source exactly as long as the model's positions fits a bilingual model; the tag that
    leads it in a multilingual run makes it one too many, and prepare counts it truncated."""
    lengths, _ = prepared_module(aligned_files, tmp_path / "probe").encoded_lengths("val.en-xx")
    longest = int(lengths.max())
    module = prepared_module(
        aligned_files,
        tmp_path,
        f"model.max_len={longest + 1}",
        f"data.filter.max_len={longest - 2}",
    )
    assert (module.model_positions(), module.source_positions()) == (longest, longest - 1)
    src_lens, tgt_lens = module.encoded_lengths("val.en-xx")
    cut = int(((src_lens == longest) | (tgt_lens > longest)).sum())
    assert cut >= 1 and length_cuts(module, "val.en-xx").truncated == cut
    caption = length_limits(module.config, module.model_positions())
    assert "less BOS/EOS; a source one fewer, for its target-language tag)" in caption


def test_the_output_limit_counts_the_tag_as_decoding_does(
    aligned_files: Path, tmp_path: Path
) -> None:
    """Decoding lets an output grow with the source it serves, its tag included: with
    max_len_a=1 a reference max_len_b + 1 tokens longer than its source still fits."""
    src_lens, tgt_lens = prepared_module(aligned_files, tmp_path / "probe").encoded_lengths(
        "val.en-xx"
    )
    gaps = tgt_lens - src_lens
    widest = int(gaps.max())
    assert widest >= 3 and int(src_lens.max()) < 100  # no source near the model's positions
    fits = prepared_module(
        aligned_files, tmp_path / "fits", "decoding.max_len_a=1", f"decoding.max_len_b={widest - 1}"
    )
    assert length_cuts(fits, "val.en-xx").beyond_output == 0
    tighter = prepared_module(
        aligned_files,
        tmp_path / "tight",
        "decoding.max_len_a=1",
        f"decoding.max_len_b={widest - 2}",
    )
    assert length_cuts(tighter, "val.en-xx").beyond_output == int((gaps == widest).sum())
