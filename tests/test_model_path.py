"""One name for the trained model: train copies the candidate it chose to checkpoints/final.ckpt,
and every command that reads a model takes the run directory for it. Runs written before
final.ckpt existed resolve through their run_summary.json; a directory of neither kind, or a
run that has not finished, is refused with what each kind holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import run, tiny_run, toy_corpus

from seq2seq.decoding.checkpoint import load_trained, read_checkpoint
from seq2seq.decoding.model_path import FINAL_CHECKPOINT, model_name, resolve_model
from seq2seq.decoding.translator import Translator
from seq2seq.errors import CheckpointError
from seq2seq.export import export_checkpoint
from seq2seq.training.checkpoint import copy_checkpoint

LINES = toy_corpus(20)[0][:6]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run: its final.ckpt, and a run_summary.json as seq2seq.train writes it."""
    summary = tiny_run(
        tmp_path_factory.mktemp("model"), 4, "average_last=2", "trainer.max_epochs=2"
    )
    directory = Path(summary["final_checkpoint"]).parent.parent
    (directory / "run_summary.json").write_text(json.dumps(summary))
    return directory


def test_train_copies_the_chosen_candidate_to_final_ckpt(run_dir: Path) -> None:
    checkpoints = run_dir / "checkpoints"
    final = checkpoints / FINAL_CHECKPOINT
    summary = json.loads((run_dir / "run_summary.json").read_text())
    choice = summary["final_checkpoint_choice"]
    assert Path(summary["final_checkpoint"]) == final
    assert Path(choice["path"]) == checkpoints / f"{choice['chosen']}.ckpt"
    assert final.read_bytes() == Path(choice["path"]).read_bytes()
    assert not list(checkpoints.glob(f".{FINAL_CHECKPOINT}.*"))  # no temp file left


def test_a_run_directory_translates_as_its_final_checkpoint(run_dir: Path) -> None:
    final = run_dir / "checkpoints" / FINAL_CHECKPOINT
    assert resolve_model(run_dir) == final and model_name(run_dir) == FINAL_CHECKPOINT
    expected = Translator.from_checkpoint(final).translate(LINES)
    assert Translator.from_checkpoint(run_dir).translate(LINES) == expected
    # an ensemble list takes run directories too: two of the same model give its outputs
    assert Translator.from_checkpoint([run_dir, final]).translate(LINES) == expected


def test_a_run_of_an_earlier_version_resolves_through_its_summary(
    run_dir: Path, tmp_path: Path
) -> None:
    """No final.ckpt, and run_summary.json names the choice by the path the run had when it
    was written (here another machine's): the candidate of that name in this directory."""
    old = tmp_path / "moved_run"
    shutil.copytree(run_dir, old)
    (old / "checkpoints" / FINAL_CHECKPOINT).unlink()
    (old / "run_summary.json").write_text(
        json.dumps({"final_checkpoint": "/elsewhere/outputs/run/checkpoints/last.ckpt"})
    )
    assert resolve_model(old) == old / "checkpoints" / "last.ckpt"
    assert model_name(old) == "last.ckpt"
    assert load_trained(old).model.state_dict().keys()  # read_checkpoint takes it too


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        (None, "has not finished. Resume it"),
        ("{not json", "run_summary.json: not valid JSON"),
        ('{"epochs": 3}', "names no final_checkpoint"),
        ('{"final_checkpoint": "/x/checkpoints/averaged.ckpt"}', "averaged.ckpt as the final"),
    ],
)
def test_a_run_without_a_final_checkpoint_is_refused_with_the_fix(
    run_dir: Path, tmp_path: Path, summary: str | None, expected: str
) -> None:
    old = tmp_path / "run"
    (old / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", old / "checkpoints" / "last.ckpt")
    if summary is not None:
        (old / "run_summary.json").write_text(summary)
    with pytest.raises(CheckpointError, match=expected) as error:
        resolve_model(old)
    assert f"ckpt_path={old}/checkpoints/last.ckpt" in str(error.value)


def test_a_directory_of_neither_kind_names_what_each_holds(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError) as error:
        resolve_model(tmp_path)
    message = str(error.value)
    assert "run directory holds run_summary.json and checkpoints/" in message
    assert "export directory holds model.bin, config.json, src.model" in message
    with pytest.raises(CheckpointError, match="does not exist: name a run directory"):
        resolve_model(tmp_path / "missing")


def test_an_export_directory_is_told_from_a_run_directory(run_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason="needs the deploy extra: .[deploy]")
    exported = export_checkpoint(run_dir, tmp_path / "ct2")
    assert resolve_model(exported) == exported and model_name(exported) == "ct2"
    metadata = json.loads((exported / "seq2seq_export.json").read_text())
    assert metadata["checkpoint"] == str((run_dir / "checkpoints" / FINAL_CHECKPOINT).resolve())
    assert (
        Translator.from_checkpoint(exported).backend.name
        != Translator.from_checkpoint(run_dir).backend.name
    )  # CTranslate2's, and ours (their parity: tests/test_export.py)
    with pytest.raises(CheckpointError, match="is an export directory already"):
        export_checkpoint(exported, tmp_path / "again")
    with pytest.raises(CheckpointError, match="CTranslate2 export directory, and this needs"):
        read_checkpoint(exported)


def test_copy_checkpoint_keeps_the_previous_file_until_the_copy_is_whole(tmp_path: Path) -> None:
    destination = tmp_path / FINAL_CHECKPOINT
    destination.write_bytes(b"earlier run's choice")
    with pytest.raises(FileNotFoundError):
        copy_checkpoint(tmp_path / "missing.ckpt", destination)
    assert destination.read_bytes() == b"earlier run's choice"
    assert [p.name for p in tmp_path.iterdir()] == [FINAL_CHECKPOINT]  # no temp file left
    (tmp_path / "last.ckpt").write_bytes(b"this run's choice")
    copy_checkpoint(tmp_path / "last.ckpt", destination)
    assert destination.read_bytes() == b"this run's choice"


@pytest.mark.slow
def test_the_commands_take_a_run_directory(run_dir: Path, tmp_path: Path) -> None:
    """evaluate writes beside final.ckpt; translate and visualize read it too."""
    evaluate = run("evaluate", tmp_path, f"ckpt_path={run_dir}")
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert list((run_dir / "checkpoints").glob("final.test.*.hyp"))
    translate = run("translate", tmp_path, f"ckpt_path={run_dir}", stdin="\n".join(LINES) + "\n")
    assert translate.returncode == 0, translate.stderr[-3000:]
    expected = Translator.from_checkpoint(run_dir).translate(LINES)
    assert translate.stdout.splitlines() == expected
    picture = tmp_path / "cross.png"
    visualize = run("visualize", tmp_path, f"ckpt_path={run_dir}", f"text={LINES[0]}",
                    f"output={picture}")  # fmt: skip
    assert visualize.returncode == 0, visualize.stderr[-3000:]
    assert picture.read_bytes()[:4] == b"\x89PNG"
    refused = run("evaluate", tmp_path, f"ckpt_path={tmp_path}")
    assert refused.returncode == 1 and "a directory of neither kind" in refused.stderr
