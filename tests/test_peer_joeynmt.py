"""scripts/peer_joeynmt.py without Joey NMT: which keys of Joey's shipped config change for a
corpus, the text Joey is given (byte-order marks, blank lines, splitlines' line breaks), the
batches it counts an epoch in, and the scores in its JSON against sacreBLEU recomputed."""

from __future__ import annotations

import gzip
import os
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from helpers import ROOT, compose_config, small_model
from sacrebleu.metrics import BLEU, CHRF

from seq2seq.data.corpus import read_lines
from seq2seq.data.datamodule import TranslationDataModule

# what the corpus and the CPU change; everything else (optimizer, schedule, dropout, batch,
# label smoothing, initialization, beam) stays as configs/iwslt14_deen_sp.yaml ships it
CORPUS_KEYS = {
    "name",
    "model_dir",
    "use_cuda",
    "fp16",
    "data.train",
    "data.dev",
    "data.test",
    "data.dataset_type",
    "data.dataset_cfg.name",
    "data.dataset_cfg.trust_remote_code",
    "testing.max_output_length",
    "testing.sacrebleu_cfg.lowercase",
    "training.validation_freq",
    "training.logging_freq",
} | {
    f"data.{side}.{key}"
    for side in ("src", "trg")
    for key in ("lang", "lowercase", "voc_limit", "voc_file", "tokenizer_cfg.model_file")
}
SIZE_KEYS = {
    f"model.{part}.{key}"
    for part in ("encoder", "decoder")
    for key in ("embeddings.embedding_dim", "hidden_size", "ff_size", "num_heads")
}  # both sizes have 6 layers


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import peer_joeynmt

    return peer_joeynmt


def adapted(peer: ModuleType, tmp_path: Path, **kwargs: object) -> dict:
    arguments = {
        "paths": peer.Paths(tmp_path / "run"),
        "src": "en",
        "tgt": "nso",
        "vocab_size": 4000,
        "seed": 42,
        "model_size": peer.DEFAULT_MODEL_SIZE,
        "validation_freq": 30,
    }
    return peer.adapt_config(**{**arguments, **kwargs})


def test_a_corpus_changes_only_its_data_model_size_and_machine_keys(
    peer: ModuleType, tmp_path: Path
) -> None:
    config = adapted(peer, tmp_path)
    changes = {change["key"]: change for change in peer.changed_keys(config, {})}
    assert set(changes) == CORPUS_KEYS | SIZE_KEYS
    assert all(change["reason"] for change in changes.values())
    assert changes["data.trg.lang"]["value"] == "nso"
    assert changes["data.src.lang"]["value"] == "en"
    assert changes["data.trg.voc_limit"] == {
        "key": "data.trg.voc_limit",
        "shipped": 32000,
        "value": 4000,
        "reason": peer.REASONS["voc_limit"],
    }
    assert changes["testing.max_output_length"]["removed"] is True
    assert changes["model.decoder.hidden_size"]["value"] == 256
    assert config["data"]["src"]["lowercase"] is False
    assert config["data"]["src"]["voc_file"] == str(tmp_path / "run" / "spm" / "sp.vocab")
    assert config["training"]["validation_freq"] == 30
    # Joey refuses a logging frequency that does not divide the validation frequency
    assert config["training"]["logging_freq"] == 30
    # the shipped size changes no model key; a seed changes only the seed
    shipped_size = adapted(peer, tmp_path, model_size="iwslt14_deen_sp", seed=7)
    keys = {change["key"] for change in peer.changed_keys(shipped_size, {})}
    assert keys == CORPUS_KEYS | {"random_seed"}


@pytest.mark.parametrize(("validation_freq", "logging_freq"), [(1200, 100), (7, 7), (150, 75)])
def test_logging_frequency_divides_the_validation_frequency(
    peer: ModuleType, tmp_path: Path, validation_freq: int, logging_freq: int
) -> None:
    training = adapted(peer, tmp_path, validation_freq=validation_freq)["training"]
    assert training["logging_freq"] == logging_freq


def test_before_the_lengths_are_known_the_validation_frequency_is_shipped(
    peer: ModuleType, tmp_path: Path
) -> None:
    keys = {c["key"] for c in peer.changed_keys(adapted(peer, tmp_path, validation_freq=None), {})}
    validation = {"training.validation_freq", "training.logging_freq"}
    assert keys == (CORPUS_KEYS | SIZE_KEYS) - validation


def test_set_changes_a_key_and_says_so(peer: ModuleType, tmp_path: Path) -> None:
    overrides = peer.parse_overrides(["training.batch_multiplier=1", "training.batch_size=2048"])
    assert overrides == {"training.batch_multiplier": 1, "training.batch_size": 2048}
    config = adapted(peer, tmp_path, overrides=overrides)
    changes = {change["key"]: change for change in peer.changed_keys(config, overrides)}
    assert changes["training.batch_multiplier"]["shipped"] == 4
    assert changes["training.batch_multiplier"]["value"] == 1
    assert changes["training.batch_size"]["reason"] == "--set on the command line"


def test_set_refuses_a_missing_section_and_a_pair_without_a_value(
    peer: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(SystemExit, match="no section trainig"):
        adapted(peer, tmp_path, overrides={"trainig.batch_size": 1})
    with pytest.raises(SystemExit, match="expected key=value"):
        peer.parse_overrides(["training.batch_size"])


def test_text_for_joey_drops_pairs_with_a_blank_side_and_keeps_lines_whole(
    peer: ModuleType, tmp_path: Path
) -> None:
    source = tmp_path / "train.en.gz"
    target = tmp_path / "train.nso.gz"
    # a byte-order mark, a whitespace-only target line, and a line separator inside a line
    source.write_bytes(gzip.compress("\ufeffOne.\nTwo.\nThree\u2028four.\n".encode()))
    target.write_bytes(gzip.compress("\ufeffTee.\n \nTharo\u2028nne.\n".encode()))
    raw = {
        "train": {"en": read_lines(source), "nso": read_lines(target)},
        "dev": {"en": ["Yes.", "No."], "nso": ["Ee.", ""]},
        "test": {"en": ["", "Five."], "nso": ["", "Hlano."]},
    }
    data = tmp_path / "data"
    prepared, kept = peer.prepare_text(raw, "en", "nso", "test", data)
    assert prepared == {
        "train": {"pairs": 2, "dropped_blank": 1},
        "dev": {"pairs": 1, "dropped_blank": 1},
        "test_decoded": {"lines": 2, "blank_sources": 1},
    }
    assert kept == [1]
    # read back as Joey reads a file (str.splitlines), each side keeps its pairs in line
    lines = {path.name: path.read_text(encoding="utf-8").splitlines() for path in data.iterdir()}
    assert lines == {
        "train.en": ["One.", "Three four."],
        "train.nso": ["Tee.", "Tharo nne."],
        "dev.en": ["Yes."],
        "dev.nso": ["Ee."],
        "eval.en": ["Five."],
    }
    with pytest.raises(ValueError, match="3 source lines but 2 target lines"):
        peer.training_pairs(["a", "b", "c"], ["x", "y"])


def test_joey_validates_on_the_pairs_seq2seqs_validation_sample_decodes(
    peer: ModuleType, toy_files: Path, tmp_path: Path
) -> None:
    config = compose_config([*small_model(toy_files, tmp_path / "cache"), "data.val_subset=10"])
    data = TranslationDataModule(config)
    data.setup()
    ours = data.validation_sample().indices.tolist()
    dev = {lang: read_lines(toy_files / f"val.{lang}") for lang in ("src", "tgt")}
    sampled = peer.dev_sample(dev, 10)
    assert sampled == {lang: [lines[i] for i in ours] for lang, lines in dev.items()}
    assert sampled["src"] != dev["src"][:10]  # a random sample, not the first lines
    assert peer.dev_sample(dev, 0) == dev  # 0: the whole split
    assert peer.dev_sample(dev, 30) == dev  # as many as it has: the whole split


def test_blank_sources_are_not_decoded_and_get_an_empty_translation(peer: ModuleType) -> None:
    sources, kept = peer.decodable_sources(["Eins.", "", "  ", "Vier."])
    assert (sources, kept) == (["Eins.", "Vier."], [0, 3])
    assert peer.restore_order(["One.", "Four."], kept, 4) == ["One.", "", "", "Four."]
    with pytest.raises(ValueError, match="1 translations for 2 lines"):
        peer.restore_order(["One."], kept, 4)


def test_the_json_scores_are_sacrebleus_on_the_raw_references(peer: ModuleType) -> None:
    references = [
        "A dog runs across the green meadow.",
        "",  # an empty reference line, as test.nso has, stays in the scored set
        "Two men play football in the park, don't they?",
    ]
    sources, kept = peer.decodable_sources(["Ein Hund.", "", "Zwei Männer."])
    hypotheses = peer.restore_order(
        ["A dog runs over the green meadow.", "Two men play soccer in the park, don't they?"],
        kept,
        3,
    )
    scores = peer.scores(hypotheses, references)
    for name, metric in (
        ("bleu", BLEU()),
        ("bleu_intl", BLEU(tokenize="intl")),
        ("chrf", CHRF()),
        ("bleu_lc", BLEU(lowercase=True)),
    ):
        expected = metric.corpus_score(hypotheses, [references]).score
        assert scores[name] == round(expected, 2)
        assert scores[f"{name}_signature"] == str(metric.get_signature())
    assert "tok:13a" in scores["bleu_signature"]
    assert "tok:intl" in scores["bleu_intl_signature"]
    assert 0 < scores["bleu"] < 100


def test_an_epoch_is_counted_in_joeys_token_batches(peer: ModuleType) -> None:
    # pairs of 9 pieces cost 10 tokens each (with EOS): a batch of 30 tokens takes 3 of them;
    # 10 pairs make 3 full batches and one of a single pair, and 2 batches make an update
    lengths = [(9, 9)] * 10
    assert peer.updates_per_epoch(lengths, 30, 1, (512, 512), seed=1) == 4
    assert peer.updates_per_epoch(lengths, 30, 2, (512, 512), seed=1) == 2
    # pairs longer than max_length are filtered out of training, as Joey filters them
    assert peer.updates_per_epoch([*lengths, (600, 9)], 30, 1, (512, 512), seed=1) == 4
    # never zero: a corpus smaller than one update still validates after its first
    assert peer.updates_per_epoch([(9, 9)], 30, 4, (512, 512), seed=1) == 1


def test_joeys_validation_report_log_and_checkpoints_are_read(
    peer: ModuleType, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "validations.txt").write_text(
        "Steps: 15\tloss: 3.10000\tppl: 22.19\tbleu: 4.56000\tLR: 0.00000075\t*\n"
        "Steps: 30\tloss: 2.90000\tppl: 18.17\tbleu: 3.21000\tLR: 0.00000150\t\n",
        encoding="utf-8",
    )
    assert peer.validations(model) == [
        {"step": 15, "dev_bleu": 4.56},
        {"step": 30, "dev_bleu": 3.21},
    ]
    log = tmp_path / "train.out"
    log.write_text(
        "... - INFO - joeynmt.training - EPOCH 1\n... - INFO - joeynmt.training - EPOCH 2\n"
        "... - INFO - joeynmt.training - Interrupt at epoch 2, step 37.\n",
        encoding="utf-8",
    )
    assert peer.epochs_done(log) == 2
    for step in (15, 37):
        (model / f"{step}.ckpt").write_bytes(b"")
    os.symlink("37.ckpt", model / "latest.ckpt")
    assert peer.choose_checkpoint(model, "best")["which"] == "latest"  # no best.ckpt yet
    assert "no validation ran" in peer.choose_checkpoint(model, "best")["reason"]
    os.symlink("15.ckpt", model / "best.ckpt")
    assert peer.choose_checkpoint(model, "latest")["step"] == 37
    best = peer.choose_checkpoint(model, "best")
    assert (best["which"], best["step"]) == ("best", 15)


def test_cores_are_parsed_and_checked(peer: ModuleType) -> None:
    assert peer.parse_cores("0") == {0}
    assert peer.parse_cores(",".join(map(str, sorted(os.sched_getaffinity(0))))) == set(
        os.sched_getaffinity(0)
    )
    with pytest.raises(SystemExit, match="expected CPU numbers"):
        peer.parse_cores("first")
    with pytest.raises(SystemExit, match=r"CPUs \[4096\] are not available"):
        peer.parse_cores("4096")


def test_the_shipped_model_size_is_the_embedded_configs(peer: ModuleType) -> None:
    encoder = yaml.safe_load(peer.SHIPPED_YAML)["model"]["encoder"]
    assert peer.MODEL_SIZES["iwslt14_deen_sp"] == (
        encoder["hidden_size"],
        encoder["ff_size"],
        encoder["num_heads"],
        encoder["num_layers"],
    )


def test_the_clock_stops_joey_even_where_sigint_was_ignored(
    peer: ModuleType, tmp_path: Path
) -> None:
    """A script started with `&` by a shell script ignores SIGINT, and so would Joey."""
    trainer = [
        sys.executable,
        "-c",
        "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('saved')",
    ]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stopped = peer.train_for(trainer, 1.0, tmp_path / "train.out", dict(os.environ))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped["stopped_by"] == "clock" and stopped["stop_seconds"] < 30
    assert (tmp_path / "train.out").read_text().strip() == "saved"
