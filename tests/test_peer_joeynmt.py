"""scripts/peer_joeynmt.py without Joey NMT: the two Joey configurations and the changes they
record, the warm-up fitted to a pace, what is read from Joey's log (training start, validation
seconds, the interrupt), the text and dev sample Joey is given, and the scores in its JSON."""

from __future__ import annotations

import argparse
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

# what configuration (a) changes: the corpus's files, languages and vocabulary, the machine,
# the benchmark model size and the output length; everything else stays as shipped
SHIPPED_CHANGES = (
    {"name", "model_dir", "use_cuda", "fp16", "data.train", "data.dev", "data.test"}
    | {"data.dataset_type", "data.dataset_cfg.name", "data.dataset_cfg.trust_remote_code"}
    | {"testing.max_output_length", "testing.sacrebleu_cfg.lowercase"}
    | {
        f"data.{side}.{key}"
        for side in ("src", "trg")
        for key in ("lang", "lowercase", "voc_limit", "voc_file", "tokenizer_cfg.model_file")
    }
    | {
        f"model.{stack}.{key}"
        for stack in ("encoder", "decoder")
        for key in ("embeddings.embedding_dim", "hidden_size", "ff_size", "num_heads")
    }
)

# a seq2seq run's resolved config.yaml, the parts configuration (b) reads
RUN_CONFIG = {
    "model": {
        "encoder_layers": 4,
        "decoder_layers": 3,
        "d_model": 128,
        "heads": 4,
        "ffn_dim": 256,
        "dropout": 0.3,
        "tie_embeddings": True,
    },
    "optim": {"lr": 0.005, "betas": [0.9, 0.98], "weight_decay": 0.0, "label_smoothing": 0.2},
    "data": {"max_tokens": 4096, "filter": {"max_len": 128}},
    "tokenizer": {"vocab_size": 8000},
    "trainer": {"gradient_clip_val": 1.0, "check_val_every_n_epoch": 3},
}

LOG = """\
2026-12-05 15:55:33,301 - INFO - joeynmt.model - Total params: 40704
2026-12-05 15:55:34,540 - INFO - joeynmt.training - Train config:
\tdevice: cpu
\tn_gpu: 0
2026-12-05 15:55:34,540 - INFO - joeynmt.training - EPOCH 1
2026-12-05 15:55:34,736 - INFO - joeynmt.prediction - Predicting 40 example(s)... (Greedy decoding)
2026-12-05 15:55:35,202 - INFO - joeynmt.prediction - Generation took 0.4654[sec].
2026-12-05 15:55:35,208 - INFO - joeynmt.prediction - Evaluation result (greedy): bleu:   0.00, \
loss:   4.02, ppl:  55.47, acc:   0.10, 0.0029[sec]
2026-12-05 15:55:35,300 - INFO - joeynmt.training - EPOCH 12
2026-12-05 15:55:36,680 - INFO - joeynmt.prediction - Generation took 1.5533[sec].
2026-12-05 15:55:36,686 - INFO - joeynmt.prediction - Evaluation result (greedy): bleu:  11.25, \
loss:   4.00, ppl:  54.48, acc:   0.12, 0.0025[sec]
2026-12-05 15:55:37,400 - INFO - joeynmt.training - Interrupt at epoch 12, step 114.
"""


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import peer_joeynmt

    return peer_joeynmt


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "outputs" / "run"
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(RUN_CONFIG), encoding="utf-8")
    return directory


def changes(peer: ModuleType, config: dict, reasons: dict) -> dict[str, dict]:
    return {change["key"]: change for change in peer.changed_keys(config, reasons)}


def test_shipped_changes_only_the_corpus_machine_and_model_size_keys(
    peer: ModuleType, tmp_path: Path
) -> None:
    config, reasons = peer.shipped_config(tmp_path / "run", "en", "nso", 4000, seed=42)
    changed = changes(peer, config, reasons)
    assert set(changed) == SHIPPED_CHANGES  # the shipped seed, 42, is no change
    assert all(change["reason"] for change in changed.values())
    assert changed["data.trg.voc_limit"]["shipped"] == 32000
    assert changed["data.trg.voc_limit"]["value"] == 4000
    assert changed["data.dataset_cfg.name"]["removed"] is True
    assert changed["testing.max_output_length"]["removed"] is True
    assert config["data"]["src"]["voc_file"] == str(tmp_path / "run" / "spm" / "sp.vocab")
    assert config["model"]["decoder"]["hidden_size"] == 256  # the IWSLT14 benchmark's
    # optimizer, schedule, dropout and batch as shipped
    training = config["training"]
    assert (training["optimizer"], training["scheduling"]) == ("adamw", "warmupinversesquareroot")
    assert (training["learning_rate"], training["learning_rate_warmup"]) == (0.0002, 4000)
    assert (training["batch_size"], training["batch_type"], training["batch_multiplier"]) == (
        8192,
        "token",
        4,
    )
    assert config["model"]["encoder"]["dropout"] == 0.1
    assert not config["fp16"] and not config["use_cuda"]
    seeded, reasons = peer.shipped_config(tmp_path / "run", "en", "nso", 4000, seed=7)
    assert set(changes(peer, seeded, reasons)) == SHIPPED_CHANGES | {"random_seed"}


def test_ours_is_the_runs_model_and_optimization_as_a_joey_config(
    peer: ModuleType, tmp_path: Path, run_dir: Path
) -> None:
    ours = peer.read_run(run_dir)
    assert ours.vocab_size == 8000 and ours.max_tokens == 4096 and ours.validate_every == 3
    config, reasons = peer.ours_config(tmp_path / "run", "en", "de", 1, ours, warmup=675)
    encoder, decoder = config["model"]["encoder"], config["model"]["decoder"]
    assert (encoder["num_layers"], decoder["num_layers"]) == (4, 3)
    for stack in (encoder, decoder):
        assert stack["hidden_size"] == stack["embeddings"]["embedding_dim"] == 128
        assert (stack["num_heads"], stack["ff_size"]) == (4, 256)
        assert stack["dropout"] == stack["embeddings"]["dropout"] == 0.3
    training = config["training"]
    assert training["scheduling"] == "warmupinversesquareroot"
    assert (training["learning_rate"], training["learning_rate_warmup"]) == (0.005, 675)
    assert (training["label_smoothing"], training["adam_betas"]) == (0.2, [0.9, 0.98])
    assert (training["batch_size"], training["batch_type"], training["batch_multiplier"]) == (
        4096,
        "token",
        1,
    )
    assert training["clip_grad_norm"] == 1.0
    assert config["data"]["src"]["max_length"] == config["data"]["trg"]["max_length"] == 128
    assert config["data"]["src"]["voc_limit"] == 8000
    changed = changes(peer, config, reasons)
    assert str(run_dir / "config.yaml") in changed["model.decoder.num_layers"]["reason"]
    assert "--warmup-share" in changed["training.learning_rate_warmup"]["reason"]
    # the data and machine keys change as in configuration (a), and nothing unexplained does
    assert set(changed) >= SHIPPED_CHANGES
    assert all(change["reason"] for change in changed.values())


def test_a_change_without_a_reason_is_refused(peer: ModuleType, tmp_path: Path) -> None:
    config, reasons = peer.shipped_config(tmp_path / "run", "en", "de", 4000, seed=42)
    config["training"]["batch_size"] = 1024
    with pytest.raises(KeyError, match="training.batch_size"):
        peer.changed_keys(config, reasons)


@pytest.mark.parametrize(
    ("per_epoch", "epochs", "validation_freq", "logging_freq"),
    [(1200, 1, 1200, 100), (7, 1, 7, 7), (150, 1, 150, 75), (37, 6, 222, 74)],
)
def test_validation_is_as_often_as_the_runs_and_logging_divides_it(
    peer: ModuleType,
    tmp_path: Path,
    per_epoch: int,
    epochs: int,
    validation_freq: int,
    logging_freq: int,
) -> None:
    config, reasons = peer.shipped_config(tmp_path / "run", "en", "de", 4000, seed=42)
    peer.set_validation_freq(config, reasons, per_epoch, epochs)
    assert config["training"]["validation_freq"] == validation_freq
    assert config["training"]["logging_freq"] == logging_freq
    assert f"every {epochs} epoch(s)" in reasons["training.validation_freq"]


def test_warmup_is_a_share_of_the_updates_the_clock_holds_at_joeys_pace(peer: ModuleType) -> None:
    fitted = peer.fit_warmup(0.75, 3600, 0.25)  # 2,700 updates in the hour
    assert fitted["expected_updates"] == 2700
    assert fitted["warmup"] == 675
    assert peer.fit_warmup(0.001, 60, 0.25)["warmup"] == 1  # never zero


def test_the_clock_starts_at_joeys_first_epoch(peer: ModuleType) -> None:
    before = LOG[: LOG.index("EPOCH 1")]
    assert not peer.training_started(before)  # loading, model building, "Train config"
    assert peer.training_started(LOG)
    # a later epoch alone (a log read from its middle) is not the start
    assert not peer.training_started(LOG[LOG.index("EPOCH 1") + 8 :])
    # the line split across two reads of the log is found once whole
    assert not peer.training_started(before + "EPOCH")


def test_validation_seconds_are_read_from_joeys_log(peer: ModuleType) -> None:
    assert peer.validation_seconds(LOG) == {"count": 2, "seconds": 2.0}
    # decoding the test set with a beam is no validation
    beam = "x - INFO - joeynmt.prediction - Evaluation result (beam search): bleu: 1.0, 9.0[sec]"
    assert peer.validation_seconds(beam) == {"count": 0, "seconds": 0}
    assert peer.interrupted_at(LOG) == (12, 114)
    assert peer.interrupted_at(LOG[: LOG.index("Interrupt")]) is None


def test_the_clock_stops_joey_even_where_sigint_was_ignored(
    peer: ModuleType, tmp_path: Path
) -> None:
    """Start-up is timed apart; a script started with `&` by a shell script ignores SIGINT,
    and so would Joey."""
    trainer = [
        sys.executable,
        "-c",
        "import time\ntime.sleep(0.5)\n"
        "print('t - INFO - joeynmt.training - EPOCH 1', flush=True)\n"
        "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('saved')",
    ]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stopped = peer.train_for(trainer, 1.0, tmp_path / "train.out", dict(os.environ))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped["stopped_by"] == "clock" and stopped["stop_seconds"] < 30
    assert stopped["startup_seconds"] >= 0.5
    assert 1.0 <= stopped["train_seconds"] < 5
    assert (tmp_path / "train.out").read_text().splitlines()[-1] == "saved"


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
    assert 0 < scores["bleu"] < 100


def test_an_epoch_is_counted_in_joeys_token_batches(peer: ModuleType) -> None:
    # pairs of 9 pieces cost 10 tokens each (with EOS): a batch of 30 tokens takes 3 of them;
    # 10 pairs make 3 full batches and one of a single pair, and 2 batches make an update
    lengths = [(9, 9)] * 10
    assert peer.updates_per_epoch(lengths, 30, 1, 512, seed=1) == 4
    assert peer.updates_per_epoch(lengths, 30, 2, 512, seed=1) == 2
    # pairs longer than max_length are filtered out of training, as Joey filters them
    assert peer.updates_per_epoch([*lengths, (600, 9)], 30, 1, 512, seed=1) == 4
    # never zero: a corpus smaller than one update still validates after its first
    assert peer.updates_per_epoch([(9, 9)], 30, 4, 512, seed=1) == 1


def test_joeys_validation_report_is_read(peer: ModuleType, tmp_path: Path) -> None:
    assert peer.dev_bleu(tmp_path) == []  # no validation before the stop
    (tmp_path / "validations.txt").write_text(
        "Steps: 15\tloss: 3.10000\tppl: 22.19\tbleu: 4.56000\tLR: 0.00000075\t*\n"
        "Steps: 30\tloss: 2.90000\tppl: 18.17\tbleu: 3.21000\tLR: 0.00000150\t\n",
        encoding="utf-8",
    )
    assert peer.dev_bleu(tmp_path) == [
        {"step": 15, "dev_bleu": 4.56},
        {"step": 30, "dev_bleu": 3.21},
    ]


def test_cores_are_parsed(peer: ModuleType) -> None:
    assert peer.parse_cores("0") == {0}
    assert peer.parse_cores("0,2-4") == {0, 2, 3, 4}
    with pytest.raises(SystemExit, match="expected CPU numbers"):
        peer.parse_cores("first")


def test_a_dev_trials_setting_is_a_dotted_key_and_a_yaml_value(peer: ModuleType) -> None:
    assert peer.setting("training.batch_multiplier=1") == ("training.batch_multiplier", 1)
    assert peer.setting("training.learning_rate=5e-4") == ("training.learning_rate", 5e-4)
    assert peer.setting("model.encoder.layer_norm=post") == ("model.encoder.layer_norm", "post")
    with pytest.raises(argparse.ArgumentTypeError, match="give KEY=VALUE"):
        peer.setting("training.batch_multiplier")
