"""seq2seq.export: a model converted to CTranslate2 computes what ours computes, and a
Translator on the export directory (seq2seq.decoding.ctranslate2_backend) translates as ours does.

A tiny model trained for a few seconds on the toy corpus (so that greedy search ends sentences
with EOS), with a real SentencePiece tokenizer; teacher-forced log-probabilities compare every
position of every layer, greedy and beam strings the whole decoding path.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from helpers import (
    config_of,
    configured_model,
    teacher_forced_score,
    toy_corpus,
    toy_tokenizer,
    trained_toy_model,
    wired_model,
)

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from seq2seq.decoding.backend import Request
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import CheckpointError, ConfigError, DataError
from seq2seq.evaluate import evaluate_checkpoint
from seq2seq.model.transformer import Transformer

ctranslate2 = pytest.importorskip("ctranslate2", reason="needs the deploy extra: .[deploy]")
from seq2seq.decoding.ctranslate2_backend import (  # noqa: E402  (needs ctranslate2)
    CTranslate2Backend,
    check_cuda_libraries,
    export_model,
)

VOCAB = 60
SOURCES, TARGETS = toy_corpus(300)
LINES = [*SOURCES[:8], "a dog jumps over the red ball", "the"]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return toy_tokenizer(VOCAB)


def trained(tokenizer: Tokenizer, steps: int = 150, **fields) -> Transformer:
    return trained_toy_model(tokenizer, steps, **fields)


@pytest.fixture(scope="module", params=["pre", "post"])
def norm_model(request, tokenizer: Tokenizer) -> Transformer:
    return trained(tokenizer, norm=request.param)


def pieces(tokenizer: Tokenizer, lines: list[str]) -> list[list[str]]:
    """What a caller passes CTranslate2: the source pieces, without EOS (the model adds it)."""
    return [tokenizer.src.encode(line, out_type=str) for line in lines]


def ct2_greedy(directory: Path, tokenizer: Tokenizer, lines: list[str]) -> list[str]:
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    results = translator.translate_batch(
        pieces(tokenizer, lines), beam_size=1, max_decoding_length=64
    )
    return [tokenizer.tgt.decode(result.hypotheses[0]) for result in results]


def our_log_probs(model: Transformer, tokenizer: Tokenizer, line: str, target: list[str]):
    """Our teacher-forced log-probabilities of the target pieces and EOS."""
    ids = [tokenizer.tgt.piece_to_id(piece) for piece in target]
    src = torch.tensor([[*tokenizer.encode_src([line])[0], EOS_ID]])
    with torch.no_grad():
        logits = model(src, torch.tensor([[BOS_ID, *ids]]))
    return logits.log_softmax(-1)[0].gather(-1, torch.tensor([*ids, EOS_ID])[:, None])[:, 0]


def assert_same_log_probs(model: Transformer, tokenizer: Tokenizer, directory: Path) -> None:
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    targets = pieces(tokenizer, [t.lower() for t in TARGETS[:6]])  # any pieces will do
    results = translator.score_batch(pieces(tokenizer, SOURCES[:6]), targets)
    for line, target, result in zip(SOURCES[:6], targets, results, strict=True):
        assert result.tokens == [*target, tokenizer.tgt.id_to_piece(EOS_ID)]
        theirs = torch.tensor(result.log_probs)
        torch.testing.assert_close(
            theirs, our_log_probs(model, tokenizer, line, target), atol=1e-4, rtol=0
        )


def test_float32_gives_our_greedy_strings_and_log_probs(
    norm_model: Transformer, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    directory = export_model(norm_model, tokenizer, tmp_path / "ct2")
    greedy = config_of("decoding/greedy", DecodingConfig, max_len_a=0, max_len_b=60)
    ours = Translator(norm_model, tokenizer, greedy).translate(LINES)
    assert all(ours) and ct2_greedy(directory, tokenizer, LINES) == ours
    assert_same_log_probs(norm_model, tokenizer, directory)


# lengths well inside the model's 64 positions: every hypothesis ends with its own EOS, where
# ours and CTranslate2 agree (docs/deploy.md: at the length limit they may differ)
WITHIN_LIMIT = {"max_len_a": 0, "max_len_b": 60}


def ours_and_exported(
    model: Transformer, tokenizer: Tokenizer, directory: Path, **fields
) -> tuple[Translator, Translator]:
    decoding = config_of("decoding/beam", DecodingConfig, **WITHIN_LIMIT, **fields)
    exported = Translator.from_checkpoint(export_model(model, tokenizer, directory), decoding)
    assert isinstance(exported.backend, CTranslate2Backend)
    return Translator(model, tokenizer, decoding), exported


@pytest.mark.parametrize(
    ("beam_size", "length_penalty", "nbest"),
    [(1, 1.0, 1), (5, 0.0, 1), (5, 0.0, 3), (5, 0.6, 1), (5, 1.0, 5), (5, 1.4, 2)],
)
def test_export_directory_gives_our_hypotheses_and_scores(
    norm_model: Transformer,
    tokenizer: Tokenizer,
    tmp_path: Path,
    beam_size: int,
    length_penalty: float,
    nbest: int,
) -> None:
    """Greedy, beam and n-best through the export directory: the same strings, in the same
    order, and the same scores within 1e-4, on 210 lines."""
    ours, exported = ours_and_exported(
        norm_model,
        tokenizer,
        tmp_path / "ct2",
        beam_size=beam_size,
        length_penalty=length_penalty,
        nbest=nbest,
    )
    lines = [*SOURCES[:200], *LINES]
    expected, got = ours.translate_nbest(lines), exported.translate_nbest(lines)
    assert all(len(nbest_list) == nbest for nbest_list in expected)
    assert [[t.text for t in n] for n in got] == [[t.text for t in n] for n in expected]
    scores = [t.score for n in got for t in n]
    assert scores == pytest.approx([t.score for n in expected for t in n], abs=1e-4)


@pytest.mark.parametrize("beam_size", [1, 5])
def test_export_directory_forces_prefixes_as_ours(
    norm_model: Transformer, tokenizer: Tokenizer, tmp_path: Path, beam_size: int
) -> None:
    """CTranslate2's target_prefix gives our strings and scores, prefix tokens counted."""
    ours, exported = ours_and_exported(
        norm_model, tokenizer, tmp_path / "ct2", beam_size=beam_size, nbest=1
    )
    lines = [*SOURCES[:60], *LINES]
    prefixes = [TARGETS[i].split(" ")[0] if i % 3 else "" for i in range(len(lines))]
    texts = [n[0].text for n in ours.translate_nbest(lines, prefixes=prefixes)]
    assert all(text.startswith(p) for text, p in zip(texts, prefixes, strict=True))
    sources, targets = tokenizer.encode_src(lines), tokenizer.encode_tgt(prefixes)
    requests = [Request(s, i + 1, p) for i, (s, p) in enumerate(zip(sources, targets, strict=True))]
    expected = [n[0] for n in ours.backend.decode(requests, ours.decoding)]
    got = [n[0] for n in exported.backend.decode(requests, ours.decoding)]
    # outputs that reach the length limit differ as they do without prefixes (docs/deploy.md:
    # ours ends them with EOS, CTranslate2 one token later without): compared up to there
    limit = WITHIN_LIMIT["max_len_b"]
    ended = [
        i for i in range(len(lines)) if max(len(expected[i].tokens), len(got[i].tokens)) < limit
    ]
    assert len(ended) > 60 and sum(bool(prefixes[i]) for i in ended) > 40
    assert [got[i].tokens for i in ended] == [expected[i].tokens for i in ended]
    # the prefix's part comes from CTranslate2's score_batch, whose log-probabilities keep
    # the mass of PAD and BOS that search renormalises away: within 5e-4, not 1e-4
    assert [got[i].score for i in ended] == pytest.approx(
        [expected[i].score for i in ended], abs=5e-4
    )


def test_export_directory_samples_with_our_settings_and_warns_about_its_seed(
    norm_model: Transformer,
    tokenizer: Tokenizer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sampling restricted to the most probable token is greedy search in both backends (the
    settings reach CTranslate2); wider sampling gives nbest samples scored by the model, and a
    warning that CTranslate2's seed is not per sentence."""
    ours, exported = ours_and_exported(norm_model, tokenizer, tmp_path / "ct2")
    sample = config_of("decoding/sample", DecodingConfig, **WITHIN_LIMIT, top_k=1, nbest=2)
    ours.decoding = exported.decoding = sample
    lines = [*SOURCES[:50], *LINES]
    expected = ours.translate_nbest(lines)
    got = exported.translate_nbest(lines)
    assert [[t.text for t in n] for n in got] == [[t.text for t in n] for n in expected]
    assert [t.score for n in got for t in n] == pytest.approx(
        [t.score for n in expected for t in n], abs=1e-4
    )
    assert "CTranslate2 samples from one random generator" in caplog.text
    wide = config_of("decoding/sample", DecodingConfig, **WITHIN_LIMIT, nbest=4, temperature=2.0)
    sources = tokenizer.encode_src(lines)
    drawn = exported.backend.decode([Request(s, i + 1) for i, s in enumerate(sources)], wide)
    assert all(len(n) == 4 for n in drawn) and any(
        len({tuple(h.tokens) for h in n}) > 1 for n in drawn
    )
    # the model's scores, untempered, of every sample that ended with EOS (one that reached
    # the length limit has none in CTranslate2: docs/deploy.md)
    ended = [
        (source, h)
        for source, samples in zip(sources, drawn, strict=True)
        for h in samples
        if len(h.tokens) < WITHIN_LIMIT["max_len_b"]
    ]
    assert len(ended) > 100
    expected = [teacher_forced_score(norm_model, source, h.tokens) for source, h in ended]
    assert [h.score for _, h in ended] == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_export_directory_handles_empty_and_long_lines_as_ours(
    tokenizer: Tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty line gives k empty translations scored 0; a long one is truncated with a
    warning naming it (its translation runs to the length limit, where the two may differ),
    or refused with decoding.long_inputs=error."""
    model = trained(tokenizer)
    ours, exported = ours_and_exported(model, tokenizer, tmp_path / "ct2", nbest=2)
    long = " ".join(["dog"] * 100)  # more than the 63 source positions
    with caplog.at_level(logging.WARNING):
        got = exported.translate_nbest(["a dog", "", long], where="in.txt", first_line=7)
    assert "in.txt, line 9: 400 source tokens, truncated to 63" in caplog.text
    expected = ours.translate_nbest(["a dog", ""])
    assert [[t.text for t in n] for n in got[:2]] == [[t.text for t in n] for n in expected]
    assert got[1] == [("", 0.0), ("", 0.0)] and len(got[2]) == 2
    exported.decoding.long_inputs = "error"
    with pytest.raises(DataError, match="in.txt, line 2: .* decoding.long_inputs=truncate"):
        exported.translate(["a dog", long], where="in.txt")


def test_a_damaged_export_directory_is_named_with_the_fix(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    directory = export_model(wired_model(vocab=VOCAB), tokenizer, tmp_path / "ct2")
    with pytest.raises(
        CheckpointError,
        match=r"a directory of neither kind: .* an export directory holds "
        r"model.bin, config.json, src.model, tgt.model, seq2seq_export.json",
    ):
        Translator.from_checkpoint(tmp_path)  # holds the export's directory, not its files
    (directory / "config.json").rename(tmp_path / "config.json")
    with pytest.raises(
        CheckpointError,
        match=r"not a model exported by seq2seq.export \(missing: "
        r"model.bin, src.model, tgt.model, seq2seq_export.json\)",
    ):
        Translator.from_checkpoint(tmp_path)  # one of its files: a partial export
    (tmp_path / "config.json").rename(directory / "config.json")
    greedy = config_of("decoding/greedy", DecodingConfig)
    with pytest.raises(CheckpointError, match="records no training configuration"):
        evaluate_checkpoint(directory, greedy, {})  # export_model was given no metadata
    metadata = directory / "seq2seq_export.json"
    good = metadata.read_text()
    metadata.write_text(good.replace('"max_len"', "max_len", 1))
    with pytest.raises(CheckpointError, match=r"seq2seq_export.json, line 3: not valid JSON"):
        Translator.from_checkpoint(directory)
    metadata.write_text(json.dumps({"quantization": "float32"}))
    with pytest.raises(CheckpointError, match="no 'max_len'"):
        Translator.from_checkpoint(directory)
    metadata.write_text(good)
    source_model = (directory / "src.model").read_bytes()
    (directory / "src.model").write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="cannot read the SentencePiece models"):
        Translator.from_checkpoint(directory)
    (directory / "src.model").write_bytes(source_model)
    (directory / "model.bin").write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="cannot load the CTranslate2 model in .*export"):
        Translator.from_checkpoint(directory)
    (directory / "model.bin").unlink()
    with pytest.raises(CheckpointError, match=r"\(missing: model.bin\)"):
        Translator.from_checkpoint(directory)


@pytest.mark.parametrize("fields", [{"score": "dot"}, {"positions": "learned"}])
def test_dot_scores_and_learned_positions_map_exactly(
    fields: dict, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    model = trained(tokenizer, steps=10, **fields)
    assert_same_log_probs(model, tokenizer, export_model(model, tokenizer, tmp_path / "ct2"))


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_export_leaves_the_model_as_it_was(
    tokenizer: Tokenizer, tmp_path: Path, quantization: str | None
) -> None:
    """The benchmark exports the model it goes on timing: mode, device and weights unchanged
    (int8 quantization once wrote into the weights it was given)."""
    model = wired_model(vocab=VOCAB).train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export_model(model, tokenizer, tmp_path / "ct2", quantization)
    assert model.training
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


@pytest.mark.slow
def test_int8_loads_and_translates(tokenizer: Tokenizer, tmp_path: Path) -> None:
    model = trained(tokenizer)
    float32 = ct2_greedy(export_model(model, tokenizer, tmp_path / "f32"), tokenizer, LINES)
    int8 = ct2_greedy(export_model(model, tokenizer, tmp_path / "i8", "int8"), tokenizer, LINES)
    assert len(int8) == len(LINES) and all(int8)
    assert sum(a == b for a, b in zip(int8, float32, strict=True)) >= len(LINES) // 2
    size = (tmp_path / "i8" / "model.bin").stat().st_size
    assert size < 0.5 * (tmp_path / "f32" / "model.bin").stat().st_size


@pytest.mark.parametrize(
    ("wiring", "setting"),
    [
        ({"cross": ("source", "target")}, "model.attention.cross"),
        ({"decoder_self": ("target", "source")}, "model.attention.decoder_self"),
        ({"score": "additive"}, "model.attention.encoder_self.score"),
        ({"cross_heads": 2}, "model.attention.cross.heads"),
        ({"allow_future_leak": True}, "model.attention.allow_future_leak"),
        (["block.decoder.feed_forward.skip=last:1"], "model.block.decoder.feed_forward"),
        (["block.encoder.self_attention.residual=none"], "model.block.encoder.self_attention"),
        (["attention.layers=[{layers: [0], cross: {heads: 2}}]"], "model.attention.layers"),
    ],
)
def test_non_standard_wiring_is_refused(
    wiring: dict | list, setting: str, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    if isinstance(wiring, list):
        model = configured_model(*wiring, vocab=VOCAB)
    else:
        model = wired_model(vocab=VOCAB, **wiring)
    with pytest.raises(ConfigError, match=f"'{setting}'"):
        export_model(model, tokenizer, tmp_path / "ct2")
    assert os.listdir(tmp_path) == []


def test_directory_appears_only_complete(
    tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = wired_model(vocab=VOCAB)

    def crash(spec, directory: str) -> None:
        (Path(directory) / "model.bin").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(ctranslate2.specs.TransformerSpec, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        export_model(model, tokenizer, tmp_path / "ct2")
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    export_model(model, tokenizer, tmp_path / "ct2")
    assert {"model.bin", "config.json", "shared_vocabulary.json"} <= set(
        os.listdir(tmp_path / "ct2")
    )
    with pytest.raises(ConfigError, match="already exists"):
        export_model(model, tokenizer, tmp_path / "ct2")
    with pytest.raises(ConfigError, match="'export.quantization'"):
        export_model(model, tokenizer, tmp_path / "other", "int3")


def test_tokenizer_and_metadata_go_along_and_overwrite_is_explicit(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    model, directory = wired_model(vocab=VOCAB), tmp_path / "ct2"
    directory.mkdir()  # an empty directory may be written into
    export_model(model, tokenizer, directory, metadata={"best_val_bleu": 12.5})
    assert (directory / "src.model").read_bytes() == tokenizer.src_model
    assert (directory / "tgt.model").read_bytes() == tokenizer.tgt_model
    metadata = json.loads((directory / "seq2seq_export.json").read_text())
    assert metadata == {"quantization": "float32", "max_len": 256, "best_val_bleu": 12.5}
    with pytest.raises(ConfigError, match="export.overwrite=true"):
        export_model(model, tokenizer, directory, "int8")
    assert json.loads((directory / "seq2seq_export.json").read_text()) == metadata
    export_model(model, tokenizer, directory, "int8", overwrite=True)
    assert json.loads((directory / "seq2seq_export.json").read_text())["quantization"] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # nothing left beside it
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        export_model(model, tokenizer, tmp_path / "file")


def test_a_gpu_without_ctranslate2s_cuda_libraries_is_refused_with_the_fix() -> None:
    class SearchWithoutCublas:
        def translate_batch(self, batch: list[list[str]], max_decoding_length: int) -> None:
            assert (batch, max_decoding_length) == ([["<unk>"]], 1)
            raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded\nmore")

    with pytest.raises(
        CheckpointError,
        match=r"^CTranslate2 4.8.5 cannot translate on this GPU: Library libcublas.so.12 is not "
        r"found or cannot be loaded\. .*CUDA 12.*CUDA_VISIBLE_DEVICES= python -m seq2seq",
    ):
        check_cuda_libraries(SearchWithoutCublas(), "4.8.5")
