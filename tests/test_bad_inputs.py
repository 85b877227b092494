"""Every entry point, fed bad inputs: a specific message, exit status 1, nothing half-written."""

from __future__ import annotations

import gzip
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    compose_config,
    run,
    small_model,
    tiny_checkpoint,
    toy_corpus,
    toy_tokenizer,
    write_lines,
)

from seq2seq.cli import check_paths
from seq2seq.config import RootConfig
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.errors import DataError

MULTI30K_FILES = [f"{split}.{lang}.gz" for split in ("train", "val") for lang in ("en", "de")]


def assert_fails(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    for text in expected:
        assert text in result.stderr, (text, result.stderr[-2000:])
    assert "Traceback" not in result.stderr


def assert_nothing_half_written(*folders: Path) -> None:
    for folder in folders:
        if folder.exists():
            partial = [p for p in folder.rglob("*") if p.name.endswith(".part")]
            assert not partial, partial
            assert not list(folder.rglob("*.ckpt")) and not list(folder.rglob("run_summary.json"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("model"))


def break_file(folder: Path, name: str, content: bytes) -> None:
    (folder / name).write_bytes(content)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: shutil.rmtree(d), ["data file(s) not found", "Check data.dir"]),
        (
            lambda d: write_lines(d / "train.tgt", toy_corpus()[1][:239]),
            ["split 'train' is not aligned", "has 240 lines but", "has 239"],
        ),
        (
            lambda d: break_file(d, "val.src", b"a dog\nthe cat\nun caf\xe9\n" * 10),
            ["val.src, line 3: not valid UTF-8 (byte 0xe9", "iconv"],
        ),
        (lambda d: break_file(d, "test.tgt", b"\n\n"), ["test.tgt is empty"]),
    ],
    ids=["missing data dir", "unequal line counts", "non-UTF-8 bytes", "empty file"],
)
def test_train_refuses_bad_data_files(change, expected, toy_files: Path, tmp_path: Path) -> None:
    change(toy_files)
    cache = tmp_path / "cache"
    result = run("train", tmp_path, *small_model(toy_files, cache), "hydra.run.dir=run")
    assert_fails(result, *expected)
    assert_nothing_half_written(tmp_path / "run", cache)


def test_train_refuses_a_file_whose_checksum_does_not_match(
    shared_data: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data" / "multi30k"
    data.mkdir(parents=True)
    for name in MULTI30K_FILES:
        shutil.copy(shared_data / "multi30k" / name, data / name)
    (data / "train.de.gz").write_bytes(gzip.compress(b"ein hund\n" * 29000))
    args = [f"paths.data_dir={tmp_path / 'data'}", f"paths.cache_dir={tmp_path / 'cache'}"]
    result = run("train", tmp_path, *args, "data.test_sets=[]", "hydra.run.dir=run")
    assert_fails(result, f"checksum mismatch for {data / 'train.de.gz'}", "verify_checksums")
    assert_nothing_half_written(tmp_path / "run", tmp_path / "cache")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.dmodel=256", ["Key 'dmodel' is not in struct", "model.dmodel"]),
        ("model.heads=3", ["config key 'model.heads'", "not divisible by model.heads=3"]),
        ("data.filter.max_len=80", ["'data.filter.max_len'", "model.max_len=64"]),
        ("decoding.long_inputs=drop", ["'decoding.long_inputs'", "use truncate or error"]),
        ("on_nonfinite=ignore", ["'on_nonfinite'", "use skip or stop"]),
        ("ckpt_path=nowhere.ckpt", ["cannot resume: checkpoint nowhere.ckpt does not exist"]),
    ],
    ids=[
        "unknown key",
        "heads not dividing d_model",
        "filter longer than positions",
        "unknown long_inputs",
        "unknown on_nonfinite",
        "missing resume checkpoint",
    ],
)
def test_train_refuses_config_values_that_cannot_work(
    override: str, expected: list[str], toy_files: Path, tmp_path: Path
) -> None:
    args = [*small_model(toy_files, tmp_path / "cache"), override, "hydra.run.dir=run"]
    assert_fails(run("train", tmp_path, *args), *expected)
    assert_nothing_half_written(tmp_path / "run")


def test_unwritable_output_directories(toy_files: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    args = small_model(toy_files, blocker / "cache")
    result = run("train", tmp_path, *args, "hydra.run.dir=run")
    assert_fails(result, f"paths.cache_dir={blocker / 'cache'}: cannot create it")
    assert_nothing_half_written(tmp_path / "run")
    # the run directory itself is Hydra's: it refuses, naming the path
    result = run(
        "train", tmp_path, *small_model(toy_files, tmp_path), f"hydra.run.dir={blocker}/run"
    )
    assert result.returncode == 1 and f"{blocker}/run" in result.stderr


@pytest.mark.slow
def test_resume_refuses_another_vocabulary(
    checkpoint: Path, toy_files: Path, tmp_path: Path
) -> None:
    args = [*small_model(toy_files, tmp_path / "cache"), "tokenizer.vocab_size=50"]
    result = run("train", tmp_path, *args, f"ckpt_path={checkpoint}", "hydra.run.dir=run")
    assert_fails(result, "the checkpoint's tokenizer does not match the data config")
    assert "checkpoint:" in result.stderr and "data config:" in result.stderr
    assert_nothing_half_written(tmp_path / "run")


@pytest.mark.slow
def test_evaluate_refuses_a_corrupted_checkpoint_and_missing_test_files(
    checkpoint: Path, tmp_path: Path
) -> None:
    corrupted = tmp_path / "corrupted.ckpt"
    corrupted.write_bytes(checkpoint.read_bytes()[:5000])
    result = run("evaluate", tmp_path, f"ckpt_path={corrupted}")
    assert_fails(result, f"cannot read checkpoint {corrupted}", "damaged")
    result = run("translate", tmp_path, f"ckpt_path={corrupted}", stdin="a dog\n")
    assert_fails(result, f"cannot read checkpoint {corrupted}", "damaged")
    result = run("translate", tmp_path, f"ckpt_path={tmp_path}", stdin="a dog\n")
    assert_fails(result, f"{tmp_path} is a directory of neither kind", "run directory holds")

    elsewhere = tmp_path / "elsewhere"
    result = run("evaluate", tmp_path, f"ckpt_path={checkpoint}", f"data.dir={elsewhere}")
    assert_fails(
        result, "test file(s) not found", str(elsewhere / "test.src"), "data.dir=/path/to/"
    )
    result = run("evaluate", tmp_path, f"ckpt_path={checkpoint}", "data.test_sets=[dev]")
    assert_fails(result, "config key 'data.test_sets': 'dev' is not one of data.splits")
    assert not list(checkpoint.parent.glob("*.scores.json"))


@pytest.mark.parametrize(
    ("command", "argument", "message"),
    [
        (
            "evaluate",
            "paths.data_dir=../shared/data",
            "paths.data_dir: this command takes its data config from the checkpoint, so it has "
            "no paths.* keys; to read the test files from another directory, name that "
            "directory itself: data.dir=<data_dir>/<dataset>, e.g. "
            "data.dir=../shared/data/multi30k",
        ),
        (
            "evaluate",
            "+paths.cache_dir=c",
            "paths.cache_dir: this command takes its data config from the checkpoint, so it has "
            "no paths.* keys; to read the test files from another directory, name that "
            "directory itself: data.dir=<data_dir>/<dataset>\n",
        ),
        ("translate", "paths.data_dir=d", "paths.data_dir: this command reads no data directory"),
    ],
)
def test_paths_given_to_a_command_without_them_names_the_key_that_does_the_job(
    command: str,
    argument: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    main = importlib.import_module(f"seq2seq.{command}").main
    monkeypatch.setattr(sys, "argv", [command, "ckpt_path=model.ckpt", argument])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 1
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}"), error
    assert error.count("\n") == 1


def test_train_and_prepare_take_paths_as_before() -> None:
    check_paths(RootConfig, ["paths.data_dir=../shared/data", "+paths.cache_dir=c"])
    assert compose_config(["paths.data_dir=elsewhere"]).data.dir == "elsewhere/multi30k"


@pytest.mark.slow
def test_translate_refuses_a_directory_as_input_or_output(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a dog\n")
    for args, expected in (
        ([f"input={tmp_path}"], f"input={tmp_path} is a directory"),
        ([f"input={tmp_path / 'none.txt'}"], "none.txt does not exist"),
        ([f"input={tmp_path / 'in.txt'}", f"output={tmp_path}"], "not a file in a writable"),
    ):
        assert_fails(run("translate", tmp_path, f"ckpt_path={checkpoint}", *args), expected)


@pytest.mark.slow
def test_translate_files_are_written_whole(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a dog\n\nthe cat runs\n")
    out = tmp_path / "out.txt"
    args = [f"ckpt_path={checkpoint}", f"input={tmp_path / 'in.txt'}", f"output={out}"]
    result = run("translate", tmp_path, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = out.read_text().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""

    (tmp_path / "bad.txt").write_bytes(b"a dog\n\xff\xfe\n")
    result = run(
        "translate",
        tmp_path,
        f"ckpt_path={checkpoint}",
        f"input={tmp_path / 'bad.txt'}",
        f"output={tmp_path / 'never.txt'}",
    )
    assert_fails(result, "bad.txt, line 2: not valid UTF-8 (byte 0xff at column 1)")
    assert not (tmp_path / "never.txt").exists()
    assert not list(tmp_path.glob(".never.txt.*"))


@pytest.mark.slow
def test_translate_starts_each_output_with_its_prefix_and_refuses_misaligned_prefixes(
    checkpoint: Path, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("a dog\n\nthe cat runs\nthe ball\n")
    (tmp_path / "prefixes.txt").write_text("THE DOG\nIGNORED\n\nBALL A\n")
    out = tmp_path / "out.txt"
    args = [f"ckpt_path={checkpoint}", f"input={tmp_path / 'in.txt'}", f"output={out}"]
    result = run("translate", tmp_path, *args, f"prefixes={tmp_path / 'prefixes.txt'}")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = out.read_text().split("\n")
    assert lines[0].startswith("THE DOG") and lines[1] == "" and lines[3].startswith("BALL A")

    for content, words in (
        ("THE DOG\n", "prefixes.txt ends at line 1, "),
        ("A\nB\nC\nD\nE\n", "prefixes.txt has more lines than "),
    ):
        (tmp_path / "prefixes.txt").write_text(content)
        result = run("translate", tmp_path, *args, f"prefixes={tmp_path / 'prefixes.txt'}")
        assert_fails(result, words)
    assert_fails(
        run("translate", tmp_path, *args, f"prefixes={tmp_path / 'none.txt'}"),
        "prefixes=" + str(tmp_path / "none.txt") + " is not a file",
    )
    (tmp_path / "terms.txt").write_text("DOG\n\nCAT\t\tRUNS\nBALL\n")
    result = run("translate", tmp_path, *args, f"constraints={tmp_path / 'terms.txt'}")
    assert_fails(result, "terms.txt, line 3: an empty phrase (two tabs in a row")
    (tmp_path / "terms.txt").write_text("DOG\n\nCAT\tRUNS\nBALL\n")
    terms = f"constraints={tmp_path / 'terms.txt'}"
    result = run("translate", tmp_path, *args, terms, "decoding.beam_size=16")  # room for them
    assert result.returncode == 0, result.stderr[-2000:]
    outputs = out.read_text().split("\n")
    assert "DOG" in outputs[0] and "CAT" in outputs[2] and "RUNS" in outputs[2]


@pytest.mark.slow
def test_evaluate_takes_prefix_and_constraint_files_and_names_its_files_after_them(
    checkpoint: Path, tmp_path: Path
) -> None:
    """Files aligned with the (one) test set: the scores go to files tagged with their
    digests, with the share of phrases met; a file of another length or with an empty phrase
    is refused, naming it (and the line)."""
    terms, prefixes = tmp_path / "terms.txt", tmp_path / "prefixes.txt"
    terms.write_text("DOG\n" + "\n" * 28 + "CAT\tRUNS\n")  # the toy test set: 30 lines
    prefixes.write_text("THE\n" * 30)
    args = [f"ckpt_path={checkpoint}", "decoding.beam_size=16"]  # room for the phrases
    result = run("evaluate", tmp_path, *args, f"constraints={terms}", f"prefixes={prefixes}")
    assert result.returncode == 0, result.stderr[-2000:]
    [scores] = checkpoint.parent.glob(
        f"{checkpoint.stem}.test.beam16-lp1+prefix-*+constraints-*.scores.json"
    )
    test = json.loads(scores.read_text())["test_sets"]["test"]
    assert test["constraints_met"] == 1.0
    assert all(h.startswith("THE") for h in Path(test["hypotheses"]).read_text().splitlines())

    terms.write_text("DOG\n")
    assert_fails(
        run("evaluate", tmp_path, *args, f"constraints={terms}"), "has 1 lines and the test set 30"
    )
    terms.write_text("DOG\n\nCAT\t\tRUNS\n" + "\n" * 27)
    assert_fails(
        run("evaluate", tmp_path, *args, f"constraints={terms}"),
        f"{terms}, line 3: an empty phrase (two tabs in a row",
    )


@pytest.mark.slow
def test_an_ensemble_decodes_as_one_model_and_needs_one_vocabulary_of_checkpoints(
    checkpoint: Path, tmp_path: Path
) -> None:
    """The checkpoint with itself scores as the checkpoint alone, in files of its own; a
    checkpoint with another SentencePiece model, or an export directory, is refused by name."""
    alone = run("evaluate", tmp_path, f"ckpt_path={checkpoint}")
    assert alone.returncode == 0, alone.stderr[-2000:]
    twice = run("evaluate", tmp_path, f"ckpt_path={checkpoint}", f"checkpoints=[{checkpoint}]")
    assert twice.returncode == 0, twice.stderr[-2000:]
    [single] = checkpoint.parent.glob(f"{checkpoint.stem}.test.beam5-lp1.scores.json")
    [ensemble] = checkpoint.parent.glob(f"{checkpoint.stem}.test.ensemble2-*.beam5-lp1.scores.json")
    scores = [json.loads(p.read_text())["test_sets"]["test"] for p in (single, ensemble)]
    assert scores[0]["bleu"] == scores[1]["bleu"]
    assert Path(scores[1]["hypotheses"]).read_text() == Path(scores[0]["hypotheses"]).read_text()

    saved = torch.load(checkpoint, weights_only=False)
    other = toy_tokenizer(60)  # the same size, trained on other lines
    assert other.src_model != saved["seq2seq"]["src_model"]
    saved["seq2seq"]["src_model"] = saved["seq2seq"]["tgt_model"] = other.src_model
    torch.save(saved, tmp_path / "other.ckpt")
    (tmp_path / "in.txt").write_text("a dog\n")
    args = [f"ckpt_path={checkpoint}", f"input={tmp_path / 'in.txt'}"]
    result = run("translate", tmp_path, *args, f"checkpoints=[{tmp_path / 'other.ckpt'}]")
    assert_fails(result, f"{checkpoint} and {tmp_path / 'other.ckpt'} were trained with different")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "model.bin").write_bytes(b"")  # what tells an export directory
    result = run("translate", tmp_path, *args, f"checkpoints=[{tmp_path / 'export'}]")
    assert_fails(result, "is an export directory, and CTranslate2 decodes one model at a time")


@pytest.mark.slow
def test_long_inputs_are_truncated_with_a_warning_or_refused(
    checkpoint: Path, tmp_path: Path
) -> None:
    long_line = " ".join(["the big dog runs over the small ball"] * 20)
    stdin = f"a dog\n{long_line}\nthe cat\n"
    result = run("translate", tmp_path, f"ckpt_path={checkpoint}", stdin=stdin)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.split("\n")) == 4
    assert "standard input, line 2:" in result.stderr and "truncated to 63" in result.stderr

    strict = run(
        "translate", tmp_path, f"ckpt_path={checkpoint}", "decoding.long_inputs=error", stdin=stdin
    )
    assert_fails(strict, "standard input, line 2:", "more than the model's 63 (model.max_len - 1)")
    assert strict.stdout == ""


def test_a_long_pair_in_an_evaluation_split_is_truncated_or_refused(
    toy_files: Path, tmp_path: Path, caplog
) -> None:
    src, tgt = toy_corpus()
    write_lines(toy_files / "val.src", [*src[240:250], " ".join(["the dog"] * 60), *src[251:270]])
    overrides = small_model(toy_files, tmp_path / "cache")
    data = TranslationDataModule(compose_config(overrides))
    data.setup()
    assert "val: 1 pairs longer than the model's 63 tokens are truncated" in caplog.text
    assert f"{toy_files / 'val.src'} and {toy_files / 'val.tgt'}, line 11" in caplog.text
    assert max(len(data.prepared.splits["val"][i][1]) for i in range(30)) == 63

    strict = TranslationDataModule(compose_config([*overrides, "decoding.long_inputs=error"]))
    with pytest.raises(DataError, match=r"val.tgt, line 11: \d+ tokens, more than the model's 63"):
        strict.setup()
