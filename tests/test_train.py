"""End to end through the entry points: train (overfit), evaluate, translate, resume, errors."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from helpers import (
    assert_scores_of_the_files_named,
    compose_config,
    config_of,
    few_pairs_overrides,
    gradient_norms,
    python,
    random_batch,
    run,
    toy_tokenizer,
    write_lines,
)

from seq2seq.data.corpus import read_lines
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.decoding.backend import output_limits, source_batch
from seq2seq.decoding.checkpoint import read_checkpoint
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.training import cuda_graphs
from seq2seq.training.checkpoint import average_checkpoints
from seq2seq.training.module import TranslationModule
from seq2seq.training.run import train, trainer_arguments

PAIRS = 40


@dataclass
class FewPairs:
    directory: Path
    src: list[str]
    tgt: list[str]


@pytest.fixture(scope="module")
def few_pairs(shared_data: Path, tmp_path_factory) -> FewPairs:
    """The first 40 Multi30k en-de training pairs as train, val and test set."""
    directory = tmp_path_factory.mktemp("pairs")
    src = read_lines(shared_data / "multi30k" / "train.en.gz")[:PAIRS]
    tgt = read_lines(shared_data / "multi30k" / "train.de.gz")[:PAIRS]
    write_lines(directory / "pairs.src", src)
    write_lines(directory / "pairs.tgt", tgt)
    return FewPairs(directory, src, tgt)


@pytest.fixture(scope="module")
def overfit_run(few_pairs: FewPairs, tmp_path_factory) -> tuple[Path, list[str]]:
    """Overfit a tiny model on 40 pairs through `python -m seq2seq.train` (about 30 s on CPU)."""
    data = few_pairs.directory
    work = tmp_path_factory.mktemp("overfit")
    result = run(
        "train",
        work,
        *few_pairs_overrides(data, work / "cache"),
        "trainer.max_epochs=120",
        "trainer.check_val_every_n_epoch=40",
        "average_last=2",
        "hydra.run.dir=run",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # the start says the model's size once, without Lightning's summary and its "Total FLOPs: 0"
    assert "model transformer_tiny: " in result.stdout and "M parameters" in result.stdout
    assert "FLOPs" not in result.stdout + result.stderr
    return work / "run", few_pairs_overrides(data, work / "cache")


@pytest.mark.slow
def test_overfit_reaches_bleu_90_and_fills_the_run_dir(overfit_run) -> None:
    run_dir, _ = overfit_run
    checkpoints = run_dir / "checkpoints"
    for name in ("config.yaml", "tokenizer/src.model", "metrics.csv", "learning_curve.png"):
        assert (run_dir / name).is_file(), name
    assert any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    # epoch checkpoints are written every epoch, also between validations (every 40 epochs
    # here), so the average is of the last 2 epochs; 2 are kept
    for name in ("best.ckpt", "last.ckpt", "averaged.ckpt", "epoch118.ckpt", "epoch119.ckpt"):
        assert (checkpoints / name).is_file(), name
    assert not (checkpoints / "epoch079.ckpt").exists()
    summary = json.loads((run_dir / "run_summary.json").read_text())
    final = Path(summary["final_checkpoint"])
    assert final == checkpoints / "final.ckpt"  # a copy of the candidate chosen:
    assert summary["final_checkpoint_choice"]["chosen"] in ("averaged", "best")  # higher on val
    assert summary["test"]["test"]["bleu"] >= 90
    assert summary["epochs"] == 120 and summary["parameters"] > 0
    scores = json.loads(final.with_name(f"{final.stem}.test.greedy.scores.json").read_text())
    assert scores["test_sets"]["test"]["bleu"] == summary["test"]["test"]["bleu"]
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_training_loss_and_rate_are_logged_at_the_loggers_steps_only(overfit_run) -> None:
    """The module logs them only where Lightning writes its loggers (every
    trainer.log_every_n_steps = 20 updates): a tensor logged at every step would be read on
    the host at every step (a wait for a GPU). metrics.csv still has the loss at every such
    step."""
    run_dir, _ = overfit_run
    header, *rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().split()]
    column = {name: header.index(name) for name in ("step", "train/loss", "train/tok_s")}
    steps = [int(row[column["step"]]) for row in rows if row[column["train/loss"]]]
    last = max(int(row[column["step"]]) for row in rows)
    assert steps == list(range(19, last + 1, 20))
    # the rate needs the step before in the same epoch: an epoch's first step has none
    rates = [float(row[column["train/tok_s"]]) for row in rows if row[column["train/tok_s"]]]
    assert len(rates) >= len(steps) // 2 and all(rate > 0 for rate in rates)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_gradient_norm_before_clipping_is_logged_at_the_loggers_steps(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """train/grad_norm is the global L2 norm of the gradients before clipping: every logged
    value is the recomputed one, and above the clip value (a norm after clipping reads 0.05)."""
    logged, recomputed = gradient_norms(toy_files, tmp_path, monkeypatch, precision)
    assert sorted(recomputed) == list(range(7)) and list(logged) == [2, 5]
    assert logged == pytest.approx({step: recomputed[step] for step in logged}, rel=1e-5)
    assert min(logged.values()) > 0.05


@pytest.mark.slow
def test_evaluate_writes_hypotheses_and_scores(overfit_run, tmp_path: Path) -> None:
    run_dir, _ = overfit_run
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    result = run("evaluate", tmp_path, f"ckpt_path={ckpt}", "decoding.beam_size=3")
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads((ckpt.parent / "best.test.beam3-lp1.scores.json").read_text())["test_sets"]
    hypotheses = read_lines(ckpt.parent / "best.test.beam3-lp1.hyp")
    assert len(hypotheses) == PAIRS
    assert scores["test"]["bleu"] >= 90
    assert scores["test"]["bleu_signature"].startswith("nrefs:1|case:mixed")
    assert {"chrf", "bleu_lc", "chrf_signature", "bleu_lc_signature"} <= set(scores["test"])

    test_scores = (ckpt.parent / "best.test.beam3-lp1.scores.json").read_bytes()
    again = run(
        "evaluate", tmp_path, f"ckpt_path={ckpt}", "decoding.beam_size=3", "data.test_sets=[val]"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert (ckpt.parent / "best.val.beam3-lp1.scores.json").is_file()
    assert (ckpt.parent / "best.test.beam3-lp1.scores.json").read_bytes() == test_scores


@pytest.mark.slow
def test_evaluate_needs_the_checkpoint_and_the_test_files_only(
    overfit_run, few_pairs: FewPairs, tmp_path: Path
) -> None:
    """No tokenizer training, no cache, no training split: the checkpoint carries the rest.
    The checkpoint is rewritten with a config in the layout of earlier versions (no `logger`,
    `decoding.nbest`, `data.min_train_pairs` and `data.splits.*.tsv` keys) and an empty cache
    directory. The same test set as one tab-separated file (BOM, CRLF) scores the same."""
    run_dir, _ = overfit_run
    final = Path(json.loads((run_dir / "run_summary.json").read_text())["final_checkpoint"])
    checkpoint = torch.load(final, map_location="cpu", weights_only=True)
    cache = tmp_path / "empty_cache"
    cache.mkdir()
    saved = checkpoint["seq2seq"]["config"]
    saved["paths"]["cache_dir"] = str(cache)
    del saved["logger"], saved["decoding"]["nbest"], saved["data"]["min_train_pairs"]
    for files in saved["data"]["splits"].values():
        del files["tsv"]
    ckpt = tmp_path / "model" / "final.ckpt"
    ckpt.parent.mkdir()
    torch.save(checkpoint, ckpt)
    only_test = tmp_path / "only_test"
    only_test.mkdir()
    write_lines(only_test / "test.src", few_pairs.src)  # pairs.* (the training split) absent
    write_lines(only_test / "test.tgt", few_pairs.tgt)

    rows = "".join(f"{s}\t{t}\r\n" for s, t in zip(few_pairs.src, few_pairs.tgt, strict=True))
    (only_test / "test.tsv").write_bytes(b"\xef\xbb\xbf" + rows.encode())
    before = json.loads(final.with_name(f"{final.stem}.test.greedy.scores.json").read_text())
    same = ("bleu", "chrf", "bleu_lc", "bleu_signature", "chrf_signature", "sentences")
    forms = {  # the test set's files -> the references its scores name
        ("src=test.src", "tgt=test.tgt"): only_test / "test.tgt",
        ("tsv=test.tsv", "src=null", "tgt=null"): ckpt.parent / "final.test.ref",
    }
    for files, references in forms.items():
        split = [f"data.splits.test.{file}" for file in files]
        result = run(
            "evaluate", tmp_path, f"ckpt_path={ckpt}", "decoding=greedy", f"data.dir={only_test}",
            *split,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert not list(cache.iterdir())
        scores = json.loads((ckpt.parent / "final.test.greedy.scores.json").read_text())
        for key in same:
            assert scores["test_sets"]["test"][key] == before["test_sets"]["test"][key], key
        assert scores["test_sets"]["test"]["references"] == str(references)
        assert read_lines(references) == few_pairs.tgt
        assert read_lines(ckpt.parent / "final.test.greedy.hyp") == read_lines(
            final.with_name(f"{final.stem}.test.greedy.hyp")
        )


@pytest.mark.slow
def test_translate_keeps_lines_in_order_and_empty_lines_empty(
    overfit_run, few_pairs: FewPairs, tmp_path: Path
) -> None:
    run_dir, _ = overfit_run
    src = few_pairs.src
    text = "\n".join([src[3], "", src[0], "   ", src[7]]) + "\n"
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    result = run("translate", tmp_path, f"ckpt_path={ckpt}", "decoding.beam_size=2", stdin=text)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # a filter: no translate.log, nothing written
    out = result.stdout.split("\n")
    assert len(out) == 6 and out[-1] == ""  # five lines in, five out
    assert out[1] == "" and out[3] == ""
    two_beams = config_of("decoding/beam", DecodingConfig, beam_size=2)
    translator = Translator.from_checkpoint(ckpt, two_beams)
    assert [out[0], out[2], out[4]] == translator.translate([src[3], src[0], src[7]])


@pytest.mark.slow
def test_translate_splits_standard_input_at_every_line_end(
    overfit_run, few_pairs: FewPairs, tmp_path: Path
) -> None:
    """`\\r`, `\\r\\n` and `\\n` each end a line, as in the corpus reader: four sentences in, four
    translations out (a lone `\\r` used to merge two sentences into one)."""
    run_dir, _ = overfit_run
    sentences = [few_pairs.src[i] for i in (3, 0, 7, 1)]
    text = f"{sentences[0]}\r{sentences[1]}\r\n{sentences[2]}\n{sentences[3]}\r"
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    result = run("translate", tmp_path, f"ckpt_path={ckpt}", "decoding=greedy", stdin=text)
    assert result.returncode == 0, result.stderr[-3000:]
    greedy = config_of("decoding/greedy", DecodingConfig)
    expected = Translator.from_checkpoint(ckpt, greedy).translate(sentences)
    assert result.stdout == "".join(line + "\n" for line in expected)
    assert len(set(expected)) == 4  # four different translations: none merged


@pytest.mark.slow
def test_translator_api_reproduces_the_training_pairs(overfit_run, few_pairs: FewPairs) -> None:
    run_dir, _ = overfit_run
    translator = Translator.from_checkpoint(run_dir / "checkpoints" / "averaged.ckpt")
    outputs = translator.translate(few_pairs.src)
    assert sum(o == r for o, r in zip(outputs, few_pairs.tgt, strict=True)) >= PAIRS * 0.8


@pytest.mark.slow
def test_decoding_benchmark_deploys_the_checkpoint_with_the_same_translations(
    overfit_run, few_pairs: FewPairs, tmp_path: Path
) -> None:
    """scripts/decoding_benchmark.py, for its output, not its timings: the checkpoint converted
    to CTranslate2 float32, and exported to transformers, translates the overfit pairs exactly
    as ours does."""
    run_dir, _ = overfit_run
    report = tmp_path / "decoding.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "decoding_benchmark.py"
    command = [
        script,
        run_dir / "checkpoints" / "averaged.ckpt",
        f"--source={few_pairs.directory / 'pairs.src'}",
        f"--reference={few_pairs.directory / 'pairs.tgt'}",
        "--reps=1",
        "--transformers",
        f"--json={report}",
        "batch_size=16",
    ]
    result = python(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(report.read_text())
    systems = {"ours", "ctranslate2 float32", "ctranslate2 int8", "transformers"}
    assert set(results["measured"]) == systems
    assert results["same_as_ours"]["ctranslate2 float32"] == PAIRS
    assert results["same_as_ours"]["transformers"] == PAIRS
    assert results["transformers_differs"] == []
    assert results["bleu"]["ctranslate2 float32"] == results["bleu"]["ours"] >= 80
    assert "| ctranslate2 int8 |" in result.stdout
    sizes = results["weights_megabytes"]  # int8: a quarter of the float32 matrices, and scales
    assert sizes["ctranslate2 int8"] < 0.5 * sizes["ctranslate2 float32"] < sizes["ours"]


@pytest.mark.slow
def test_export_command_writes_a_model_that_translates_as_ours(
    overfit_run, few_pairs: FewPairs, tmp_path: Path
) -> None:
    import ctranslate2

    run_dir, _ = overfit_run
    ckpt = run_dir / "checkpoints" / "averaged.ckpt"
    result = run("export", tmp_path, f"ckpt_path={ckpt}", "export.dir=ct2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]  # and no export.log
    metadata = json.loads((tmp_path / "ct2" / "seq2seq_export.json").read_text())
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert metadata["checkpoint"] == str(ckpt.resolve())
    assert metadata["best_val_bleu"] == summary["best_val_bleu"]
    assert metadata["quantization"] == "float32" and metadata["config"]["model"]["d_model"] > 0
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "ct2" / "src.model"))
    engine = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    pieces = [sp.encode(line, out_type=str) for line in few_pairs.src[:8]]
    # 60 tokens before EOS, as in our search; CTranslate2 counts EOS in its length
    results = engine.translate_batch(pieces, beam_size=1, max_decoding_length=61)
    greedy = config_of("decoding/greedy", DecodingConfig, max_len_a=0, max_len_b=60)
    ours = Translator.from_checkpoint(ckpt, greedy).translate(few_pairs.src[:8])
    tgt_sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "ct2" / "tgt.model"))
    found = [r.hypotheses[0] for r in results]
    # one that reaches the limit ends there, where ours ends with a forced EOS (docs/deploy.md):
    # an overfit model repeats a piece to the limit on some CPUs
    assert [tgt_sp.decode(hypothesis[:60]) for hypothesis in found] == ours
    assert sum(len(hypothesis) <= 60 for hypothesis in found) >= 6  # most ended with EOS

    # the export directory in place of the checkpoint: translate (n-best) and evaluate
    text = "\n".join([few_pairs.src[3], "", few_pairs.src[0]]) + "\n"
    nbest = ("decoding.beam_size=3", "decoding.nbest=2")
    deployed = run("translate", tmp_path, "ckpt_path=ct2", *nbest, stdin=text)
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    ours = run("translate", tmp_path, f"ckpt_path={ckpt}", *nbest, stdin=text)
    rows = [line.split("\t") for line in deployed.stdout.splitlines()]
    expected = [line.split("\t") for line in ours.stdout.splitlines()]
    assert [(n, text) for n, _, text in rows] == [(n, text) for n, _, text in expected]
    assert [n for n, _, _ in rows] == ["1", "1", "2", "2", "3", "3"]
    assert rows[2][1:] == rows[3][1:] == ["0.0000", ""]  # the empty line: 2 empty texts
    scores = [float(score) for _, score, _ in rows]
    assert scores == pytest.approx([float(score) for _, score, _ in expected], abs=1e-3)
    assert scores[0] >= scores[1] and scores[4] >= scores[5] and rows[0][2]

    evaluated = run("evaluate", tmp_path, "ckpt_path=ct2", "decoding=greedy")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scores_json = json.loads((tmp_path / "ct2" / "test.greedy.scores.json").read_text())
    assert scores_json["backend"] == "ctranslate2 float32"
    # the batch's limit is its longest source's: a sentence that reaches its own may run on
    translator = Translator.from_checkpoint(ckpt, config_of("decoding/greedy", DecodingConfig))
    ours = [best for best, *_ in translator.translate_nbest(few_pairs.src)]
    sources = translator.source_ids(few_pairs.src, "test", list(range(len(few_pairs.src))))
    limits = output_limits(source_batch(sources), translator.decoding, translator.backend.max_len)
    reached = [len(best.tokens) == limit for best, limit in zip(ours, limits, strict=True)]
    deployed = read_lines(tmp_path / "ct2" / "test.greedy.hyp")
    for line, best, at_limit in zip(deployed, ours, reached, strict=True):
        assert line.startswith(best.text) if at_limit else line == best.text
    assert sum(reached) <= 2
    assert scores_json["test_sets"]["test"]["bleu"] >= 90

    again = run("export", tmp_path, f"ckpt_path={ckpt}", "export.dir=ct2")
    assert again.returncode == 1 and "export.overwrite=true" in again.stderr
    assert "Traceback" not in again.stderr
    int8 = run(
        "export",
        tmp_path,
        f"ckpt_path={ckpt}",
        "export.dir=ct2",
        "export.quantization=int8",
        "export.overwrite=true",
    )
    assert int8.returncode == 0, int8.stderr[-3000:]
    metadata = json.loads((tmp_path / "ct2" / "seq2seq_export.json").read_text())
    assert metadata["quantization"] == "int8"
    int8_text = run("translate", tmp_path, "ckpt_path=ct2", stdin=text)
    assert int8_text.returncode == 0 and len(int8_text.stdout.splitlines()) == 3

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # one file of an export: a partial one
    for command in ("translate", "evaluate"):
        result = run(command, tmp_path, f"ckpt_path={broken}", stdin=text)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "is not a model exported by seq2seq.export (missing: model.bin, src" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("epochs_before", [0, 3])
def test_max_steps_ends_a_run_like_max_time(
    few_pairs: FewPairs, tmp_path: Path, epochs_before: int
) -> None:
    """trainer.max_steps one step into epoch `epochs_before` (inside the first epoch, or a
    later one): a final validation, the checkpoints, averaging, the test scores, the summary,
    exit 0. It once died in EarlyStopping, which found no val/bleu."""
    overrides = few_pairs_overrides(few_pairs.directory, tmp_path / "cache")
    data = TranslationDataModule(compose_config(overrides))
    data.prepare_data()
    data.setup()
    steps_per_epoch = len(data.train_dataloader())
    assert steps_per_epoch >= 3  # so that the stop falls inside an epoch
    max_steps = epochs_before * steps_per_epoch + 2
    result = run(
        "train", tmp_path, *overrides, f"trainer.max_steps={max_steps}", "hydra.run.dir=run"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert summary["steps"] == max_steps and summary["best_val_bleu"] is not None
    assert 0 < summary["validation_seconds"] < summary["train_seconds"]
    assert_scores_of_the_files_named(summary["test"]["test"], PAIRS)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == max_steps
    assert read_checkpoint(checkpoints / "best.ckpt")["global_step"] == max_steps
    assert (checkpoints / f"epoch{epochs_before:03d}.ckpt").is_file()  # the partial epoch's
    assert (checkpoints / "averaged.ckpt").is_file() == (epochs_before > 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("epochs", "every"), [(3, 2), (2, 5)], ids=["validated_before_the_end", "never_validated"]
)
def test_last_ckpt_holds_the_last_epoch_between_validations(
    few_pairs: FewPairs, tmp_path: Path, epochs: int, every: int
) -> None:
    """With trainer.check_val_every_n_epoch > 1, last.ckpt is still written at every epoch
    end. Lightning's checkpoint without a monitor saved only after validations: a resume lost
    the epochs since, and a run that never validated ended with its last.ckpt missing."""
    overrides = few_pairs_overrides(few_pairs.directory, tmp_path / "cache")
    result = run(
        "train",
        tmp_path,
        *overrides,
        f"trainer.max_epochs={epochs}",
        f"trainer.check_val_every_n_epoch={every}",
        "average_last=0",
        "evaluate_after=false",
        "hydra.run.dir=run",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    last = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (epochs - 1, summary["steps"])
    if every > epochs:
        assert summary["best_val_bleu"] is None
        assert summary["final_checkpoint_choice"]["chosen"] == "last"


@pytest.mark.slow
def test_resuming_with_another_tokenizer_is_refused_naming_both(
    overfit_run, few_pairs: FewPairs, tmp_path: Path
) -> None:
    run_dir, _ = overfit_run
    last = run_dir / "checkpoints" / "last.ckpt"
    overrides = few_pairs_overrides(few_pairs.directory, tmp_path / "cache", vocab_size=300)
    result = run("train", tmp_path, *overrides, f"ckpt_path={last}", "hydra.run.dir=run")
    assert result.returncode == 1
    assert "tokenizer does not match" in result.stderr
    assert "bpe 400" in result.stderr and "bpe 300" in result.stderr
    assert "Traceback" not in result.stderr


def test_evaluate_requires_a_checkpoint(tmp_path: Path) -> None:
    result = run("evaluate", tmp_path)
    assert result.returncode == 1
    assert "error: config key 'ckpt_path'" in result.stderr
    assert "missing mandatory value" in result.stderr and "e.g. ckpt_path=" in result.stderr


def test_bad_checkpoint_paths(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(CheckpointError, match="is a directory"):
        read_checkpoint(tmp_path)
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint {broken}"):
        read_checkpoint(broken)
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, other)
    with pytest.raises(CheckpointError, match="not a seq2seq checkpoint"):
        read_checkpoint(other)


@pytest.mark.slow
def test_average_is_the_mean_of_the_parameters(overfit_run, tmp_path: Path) -> None:
    run_dir, _ = overfit_run
    paths = [run_dir / "checkpoints" / f"epoch{e:03d}.ckpt" for e in (118, 119)]
    averaged = read_checkpoint(average_checkpoints(paths, tmp_path / "avg.ckpt"))["state_dict"]
    first, second = (read_checkpoint(p)["state_dict"] for p in paths)
    for key, value in averaged.items():
        torch.testing.assert_close(value, (first[key] + second[key]) / 2)
    assert [p.name for p in tmp_path.iterdir()] == ["avg.ckpt"]


@pytest.mark.slow
def test_resume_restores_epoch_step_optimizer_and_schedule(
    few_pairs: FewPairs, tmp_path: Path
) -> None:
    base = [
        *few_pairs_overrides(few_pairs.directory, tmp_path / "cache"),
        "average_last=0",
        "evaluate_after=false",
    ]
    first = train(compose_config([*base, "trainer.max_epochs=2"]), tmp_path / "first")
    last = Path(first["final_checkpoint"]).parent / "last.ckpt"
    state = read_checkpoint(last)
    resumed_dir = tmp_path / "resumed"
    train(compose_config([*base, "trainer.max_epochs=3", f"ckpt_path={last}"]), resumed_dir)
    resumed = read_checkpoint(resumed_dir / "checkpoints" / "last.ckpt")
    steps_per_epoch = state["global_step"] // 2
    assert resumed["epoch"] == 2 and resumed["global_step"] == 3 * steps_per_epoch
    scheduler = resumed["lr_schedulers"][0]
    assert scheduler["last_epoch"] == 3 * steps_per_epoch  # the schedule went on, not restarted
    adam_steps = next(iter(resumed["optimizer_states"][0]["state"].values()))["step"]
    assert int(adam_steps) == 3 * steps_per_epoch


def test_training_steps_take_r_drops_loss_and_validation_the_plain_one() -> None:
    from seq2seq.data.batching import Batch

    config = compose_config(["model=transformer_tiny", "model.dropout=0.3", "optim.r_drop=1.5"])
    module = TranslationModule(config, toy_tokenizer(60))
    src, tgt = random_batch(60)
    tokens = int((tgt[:, 1:] != 0).sum())
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], torch.arange(3), tokens)
    model = module.model

    def seeded(loss_fn) -> torch.Tensor:
        torch.manual_seed(3)
        return loss_fn()

    summed = seeded(lambda: model.loss(src, tgt[:, :-1], tgt[:, 1:], 0.1, r_drop=1.5))
    assert seeded(lambda: module.loss(batch)[0]) == summed / tokens
    module.eval()
    plain = model.loss(src, tgt[:, :-1], tgt[:, 1:], 0.1)
    assert module.loss(batch)[0] == plain / tokens and module.r_drop == 1.5
    assert (
        compose_config().optim.r_drop == 0
        and TranslationModule(compose_config(), toy_tokenizer(60)).r_drop is None
    )  # off by default: one pass


@pytest.mark.parametrize("key", ["data.bpe_dropout=0.1", "data.bidirectional_epochs=2"])
def test_a_reload_setting_other_than_every_epoch_is_refused(key: str) -> None:
    """Both make epochs of different batch counts, which Lightning counts when it makes the
    loaders: every epoch, set unless the user set another value, which is refused."""
    assert trainer_arguments(compose_config([key]))["reload_dataloaders_every_n_epochs"] == 1
    assert "reload_dataloaders_every_n_epochs" not in trainer_arguments(compose_config())
    config = compose_config([key, "+trainer.reload_dataloaders_every_n_epochs=2"])
    name = key.split("=")[0]
    with pytest.raises(ConfigError, match=f"2, and {name} needs the training batches"):
        trainer_arguments(config)


def test_config_values_that_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'trainer.max_epoch': not an argument"):
        trainer_arguments(compose_config(["+trainer.max_epoch=3"]))
    with pytest.raises(ConfigError, match="'decoding.beam_size': must be >= 1"):
        compose_config(["decoding.beam_size=0"])
    with pytest.raises(ConfigError, match="'decoding.nbest': 3 hypotheses from a beam of 2"):
        compose_config(["decoding.beam_size=2", "decoding.nbest=3"])
    with pytest.raises(ConfigError, match="'model.heads'"):
        compose_config(["model.d_model=100", "model.heads=3"])
    with pytest.raises(CheckpointError, match="cannot resume"):
        train(compose_config([f"ckpt_path={tmp_path / 'nope.ckpt'}"]), tmp_path)
    graphs_on_cpu = TranslationModule(compose_config(["cuda_graphs=4"]), toy_tokenizer(60))
    with pytest.raises(ConfigError, match="'cuda_graphs': 4, and this run trains on cpu; CUDA"):
        graphs_on_cpu.on_fit_start()


@pytest.mark.parametrize("takes_mode", [True, False], ids=["as_argument", "as_graph_default"])
def test_cuda_graphs_are_captured_watching_the_capturing_thread_alone(
    monkeypatch: pytest.MonkeyPatch, takes_mode: bool
) -> None:
    """thread_local mode (the loader's pin-memory thread broke "global" captures, test_gpu.py):
    make_graphed_callables' argument where it takes one, else torch.cuda.graph's default
    during the call, restored after it."""
    seen = {}

    def with_mode(module, inputs, capture_error_mode="global", **kwargs):
        seen["mode"] = capture_error_mode
        return module

    def without_mode(module, inputs, **kwargs):
        seen["mode"] = inspect.signature(torch.cuda.graph).parameters["capture_error_mode"].default
        return module

    graph = torch.cuda.graph
    monkeypatch.setattr(
        torch.cuda, "make_graphed_callables", with_mode if takes_mode else without_mode
    )
    module = torch.nn.Identity()
    assert cuda_graphs.make_graphed_callables(module, (), allow_unused_input=True) is module
    assert seen["mode"] == "thread_local" and torch.cuda.graph is graph
