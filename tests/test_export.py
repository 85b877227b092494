"""seq2seq.export: a model converted to CTranslate2 computes what ours computes.

A tiny model trained for a few seconds on the toy corpus (so that greedy search ends sentences
with EOS), with a real SentencePiece tokenizer; teacher-forced log-probabilities compare every
position of every layer, greedy strings the whole decoding path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import config_of, toy_corpus, wired_model
from torch.nn.utils.rnn import pad_sequence

from seq2seq.config import DecodingConfig, TokenizerConfig, group_config
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, Tokenizer, train_sentencepiece
from seq2seq.errors import ConfigError
from seq2seq.export import export_model
from seq2seq.model.transformer import Transformer
from seq2seq.translator import Translator

ctranslate2 = pytest.importorskip("ctranslate2", reason="needs the deploy extra: .[deploy]")

VOCAB = 60
SOURCES, TARGETS = toy_corpus(300)
LINES = [*SOURCES[:8], "a dog jumps over the red ball", "the"]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    config = group_config("tokenizer/sentencepiece", TokenizerConfig)
    config.vocab_size, config.byte_fallback = VOCAB, False
    model = train_sentencepiece(SOURCES + TARGETS, config)
    return Tokenizer(model, model)


def trained(tokenizer: Tokenizer, steps: int = 150, **fields) -> Transformer:
    """A tiny model (1+2 layers, d 32) after `steps` Adam updates of 32 toy pairs."""
    torch.manual_seed(0)
    model = wired_model(vocab=VOCAB, max_len=64, **fields).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    src, tgt = tokenizer.encode_src(SOURCES), tokenizer.encode_tgt(TARGETS)
    for step in range(steps):
        batch = [(step * 32 + j) % len(src) for j in range(32)]
        source = pad_sequence([torch.tensor([*src[i], EOS_ID]) for i in batch], batch_first=True)
        tgt_in = pad_sequence([torch.tensor([BOS_ID, *tgt[i]]) for i in batch], batch_first=True)
        tgt_out = pad_sequence([torch.tensor([*tgt[i], EOS_ID]) for i in batch], batch_first=True)
        loss = model.loss(source, tgt_in, tgt_out, 0.0) / (tgt_out != 0).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


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


def test_beam_hypotheses_scored_as_ours(
    norm_model: Transformer, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """CTranslate2's beam-5 scores (unnormalised) are our log-probabilities of its hypotheses,
    EOS included, within 1e-2 (within 1e-4 by score_batch; its beam path differs slightly).
    Its strings may differ from ours: it normalises length without EOS and stops a sentence
    later than our fairseq-style search (docs/deploy.md)."""
    directory = export_model(norm_model, tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    results = translator.translate_batch(
        pieces(tokenizer, LINES), beam_size=5, length_penalty=0.0, return_scores=True
    )
    for line, result in zip(LINES, results, strict=True):
        ours = our_log_probs(norm_model, tokenizer, line, result.hypotheses[0]).sum().item()
        assert result.scores[0] == pytest.approx(ours, abs=1e-2)


@pytest.mark.parametrize("fields", [{"score": "dot"}, {"positions": "learned"}])
def test_dot_scores_and_learned_positions_map_exactly(
    fields: dict, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    model = trained(tokenizer, steps=10, **fields)
    assert_same_log_probs(model, tokenizer, export_model(model, tokenizer, tmp_path / "ct2"))


def test_export_leaves_the_model_as_it_was(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """The benchmark exports the model it goes on timing: mode, device and weights unchanged."""
    model = wired_model(vocab=VOCAB).train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export_model(model, tokenizer, tmp_path / "ct2")
    assert model.training
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


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
    ],
)
def test_non_standard_wiring_is_refused(
    wiring: dict, setting: str, tokenizer: Tokenizer, tmp_path: Path
) -> None:
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
    assert metadata == {"quantization": "float32", "best_val_bleu": 12.5}
    with pytest.raises(ConfigError, match="export.overwrite=true"):
        export_model(model, tokenizer, directory, "int8")
    assert json.loads((directory / "seq2seq_export.json").read_text()) == metadata
    export_model(model, tokenizer, directory, "int8", overwrite=True)
    assert json.loads((directory / "seq2seq_export.json").read_text())["quantization"] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # nothing left beside it
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        export_model(model, tokenizer, tmp_path / "file")
