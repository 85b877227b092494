"""export.format=hf: a model as a transformers directory (seq2seq.hub) loads with the Auto
classes offline, its tokenizer gives our ids, its weights compute our log-probabilities, and
`generate` with the exported generation_config.json gives our search's outputs; what cannot be
exported exactly is refused with the setting named.

A tiny model trained for a few seconds on the toy corpus (so that search ends sentences with
EOS), with real SentencePiece models of both types.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers import (
    SPECIAL_IDS,
    compose_config,
    run,
    small_model,
    toy_corpus,
    toy_overrides,
    toy_tokenizer,
    trained_toy_model,
    wired_model,
    write_lines,
)

from seq2seq.data.corpus import normalize
from seq2seq.data.tokenizer import EOS_ID, Tokenizer, train_sentencepiece
from seq2seq.decoding.translator import Translator
from seq2seq.errors import ConfigError
from seq2seq.model.transformer import Transformer

transformers = pytest.importorskip("transformers", reason="needs the hf extra: .[hf]")
from tokenizers import normalizers  # noqa: E402  (transformers' dependency)

from seq2seq.hub import directory as hub  # noqa: E402  (needs tokenizers)

VOCAB = 60
SOURCES, TARGETS = toy_corpus(300)
LINES = [*SOURCES[:8], "a dog jumps over the red ball", "the"]
CARD = {"summary": None, "run_dir": None, "license": "other", "data_license": None}


def toy_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, lo, hi in (("train", 0, 240), ("val", 240, 270), ("test", 270, 300)):
        write_lines(folder / f"{split}.src", SOURCES[lo:hi])
        write_lines(folder / f"{split}.tgt", TARGETS[lo:hi])
    return folder


def export(model: Transformer, tokenizer: Tokenizer, work: Path, *overrides: str) -> Path:
    """`model` exported with the config of a toy-corpus run (its val and test text checked)."""
    data = toy_data(work / "data")
    config = compose_config([*toy_overrides(data, work / "cache"), *overrides])
    config = dataclasses.replace(config, model=model.config)
    return hub.export_transformers(model, tokenizer, config, work / "hf", CARD, {})


def tokenizer_of(model_type: str, tags: tuple[str, ...] = ()) -> Tokenizer:
    config = compose_config([]).tokenizer
    config = dataclasses.replace(
        config, vocab_size=VOCAB, byte_fallback=False, model_type=model_type
    )
    model = train_sentencepiece(SOURCES + TARGETS, config, tags=tags)
    return Tokenizer(model, model)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return toy_tokenizer(VOCAB)


@pytest.fixture(scope="module")
def exported(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory):
    model = trained_toy_model(tokenizer)
    return model, export(model, tokenizer, tmp_path_factory.mktemp("export"))


def loaded(directory: Path, monkeypatch: pytest.MonkeyPatch):
    """The directory through the Auto classes, offline, without remote code."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    return hf_tokenizer, hf_model


def test_the_directory_loads_offline_with_the_auto_classes(
    exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, directory = exported
    hf_tokenizer, hf_model = loaded(directory, monkeypatch)
    assert type(hf_model).__name__ == "PegasusForConditionalGeneration"
    assert "Pegasus" not in type(hf_tokenizer).__name__  # tokenizer.json as written, not rebuilt
    assert hf_model.config.d_model == model.config.d_model
    assert hf_model.generation_config.suppress_tokens == [0, 2]
    config = json.loads((directory / "config.json").read_text())  # for 4.x's pipeline
    assert config["task_specific_params"]["translation"] == {
        "do_sample": False,
        "num_beams": 5,
        "length_penalty": 1.0,
        "early_stopping": True,
    }
    files = {path.name for path in directory.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= files
    assert {"tokenizer_config.json", "README.md", "src.model", "seq2seq_export.json"} <= files
    parity = json.loads((directory / "seq2seq_export.json").read_text())["tokenizer_parity"]
    assert parity["lines"] == len(hub.HOSTILE) + 4 * 30 and parity["encoded_differently"] == 0


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_the_tokenizer_gives_our_ids_on_every_line(
    model_type: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = tokenizer_of(model_type)
    directory = export(wired_model(vocab=VOCAB, max_len=64), tokenizer, tmp_path)
    hf_tokenizer, _ = loaded(directory, monkeypatch)
    lines = [*SOURCES, *TARGETS, *hub.HOSTILE, "  the   dog\u00a0runs "]
    ours = tokenizer.encode_src([normalize(line) for line in lines])
    assert hf_tokenizer(lines)["input_ids"] == [[*ids, EOS_ID] for ids in ours]
    assert hf_tokenizer.batch_decode(ours, skip_special_tokens=True) == tokenizer.decode_tgt(ours)
    assert "\u2047" in tokenizer.decode_tgt(ours)[-5]  # <unk> written as SentencePiece writes it
    # the known difference: a unigram model reads a special piece spelled out as that piece
    spelled = "the </s> dog <pad>"
    theirs = hf_tokenizer([spelled])["input_ids"][0]
    assert (theirs == [*tokenizer.encode_src([spelled])[0], EOS_ID]) == (model_type == "bpe")
    assert (theirs.count(EOS_ID) == 2) == (model_type == "unigram")


def test_the_exported_weights_compute_our_log_probabilities(
    exported, monkeypatch: pytest.MonkeyPatch, tokenizer: Tokenizer
) -> None:
    """Teacher-forced, over a padded batch: every position of every layer contributes."""
    model, directory = exported
    hf_tokenizer, hf_model = loaded(directory, monkeypatch)
    batch = hf_tokenizer(SOURCES[:6], return_tensors="pt", padding=True)
    targets = tokenizer.encode_tgt(TARGETS[:6])
    width = max(map(len, targets)) + 1
    tgt_in = torch.tensor([[2, *t] + [0] * (width - len(t) - 1) for t in targets])
    with torch.no_grad():
        ours = model(batch["input_ids"], tgt_in).log_softmax(-1)
        theirs = hf_model(**batch, decoder_input_ids=tgt_in).logits.log_softmax(-1)
    real = tgt_in != 0
    real[:, 0] = True
    assert torch.allclose(ours[real], theirs[real], atol=1e-5)


@pytest.mark.parametrize("beam", [1, 5])
def test_generate_with_the_exported_settings_gives_our_translations(
    beam: int, exported, monkeypatch: pytest.MonkeyPatch, tokenizer: Tokenizer
) -> None:
    """generation_config.json holds beam 5 (the run's decoding); greedy is num_beams=1."""
    model, directory = exported
    hf_tokenizer, hf_model = loaded(directory, monkeypatch)
    decoding = dataclasses.replace(compose_config([]).decoding, beam_size=beam)
    ours = Translator(model, tokenizer, decoding).translate(LINES)
    batch = hf_tokenizer(LINES, return_tensors="pt", padding=True)
    with torch.no_grad():
        output = hf_model.generate(**batch, **({"num_beams": 1} if beam == 1 else {}))
    assert hf_model.generation_config.num_beams == 5
    assert hf_tokenizer.batch_decode(output, skip_special_tokens=True) == ours
    assert any(line.strip() for line in ours)


@pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) >= 5,
    reason="transformers 5 removed pipeline('translation'); runs on transformers 4.x",
)
def test_the_translation_pipeline_translates_as_our_search(
    exported, monkeypatch: pytest.MonkeyPatch, tokenizer: Tokenizer
) -> None:
    model, directory = exported
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    translate = transformers.pipeline("translation", model=str(directory))
    ours = Translator(model, tokenizer, compose_config([]).decoding).translate(LINES)
    assert [out["translation_text"] for out in translate(LINES)] == ours


def test_a_multilingual_models_tag_is_read_from_the_text_and_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tag leads the text; a model whose output favours the tag writes it without the
    suppression, and never with it, as our search."""
    tokenizer = tokenizer_of("unigram", tags=("<2xx>", "<2yy>"))
    (tag_xx, tag_yy) = tokenizer.tag_ids
    vocab = tokenizer.src_vocab_size
    config = wired_model(vocab=vocab, max_len=64).config
    torch.manual_seed(0)
    model = Transformer(config, vocab, vocab, True, **SPECIAL_IDS, tag_ids=(tag_xx, tag_yy))
    with torch.no_grad():  # every decoder state becomes the tag's (tied) row: its logit leads
        model.output_projection.weight[tag_yy] *= 5
        model.decoder_norm.weight.zero_()
        model.decoder_norm.bias.copy_(model.output_projection.weight[tag_yy])
    model.eval()
    directory = export(model, tokenizer, tmp_path)
    hf_tokenizer, hf_model = loaded(directory, monkeypatch)
    ours = tokenizer.encode_src(["the dog runs"])[0]
    assert hf_tokenizer(["<2yy> the dog runs"])["input_ids"] == [[tag_yy, *ours, EOS_ID]]
    assert hf_tokenizer(["<2yy>the dog runs"])["input_ids"] == [[tag_yy, *ours, EOS_ID]]
    batch = hf_tokenizer(["<2yy> the dog runs", "<2xx> a cat"], return_tensors="pt", padding=True)
    with torch.no_grad():
        unmasked = hf_model.generate(**batch, num_beams=1, suppress_tokens=[0, 2], max_length=8)
        output = hf_model.generate(**batch, max_length=8)
    assert tag_yy in unmasked.tolist()[0]
    assert not {tag_xx, tag_yy} & {i for row in output.tolist() for i in row}
    assert set(hf_model.generation_config.suppress_tokens) == {0, 2, tag_xx, tag_yy}


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"norm": "post"}, "model.norm"),
        ({"tie_embeddings": False}, "model.tie_embeddings"),
    ],
)
def test_settings_transformers_cannot_compute_exactly_are_refused(
    fields: dict, key: str, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    model = wired_model(vocab=VOCAB, max_len=64, **fields)
    with pytest.raises(ConfigError, match=rf"'{key}'.*cannot be exported to transformers"):
        export(model, tokenizer, tmp_path)
    assert not (tmp_path / "hf").exists()


def test_additive_attention_and_separate_vocabularies_are_refused(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    model = wired_model(vocab=VOCAB, max_len=64, score="additive")
    with pytest.raises(ConfigError, match="additive attention cannot be exported: transformers"):
        export(model, tokenizer, tmp_path)
    other = tokenizer_of("unigram")
    with pytest.raises(ConfigError, match="'tokenizer.joint'.*one vocabulary"):
        export(
            wired_model(vocab=VOCAB, max_len=64),
            Tokenizer(tokenizer.src_model, other.src_model),
            tmp_path,
        )
    assert not (tmp_path / "hf").exists()


def test_a_tokenizer_that_reads_a_line_differently_is_refused(
    tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is written; the error names the first line read differently."""
    build = hub.fast_tokenizer

    def lowercasing(ours: Tokenizer):
        fast = build(ours)
        fast.normalizer = normalizers.Sequence([normalizers.Lowercase(), fast.normalizer])
        return fast

    monkeypatch.setattr(hub, "fast_tokenizer", lowercasing)
    with pytest.raises(
        ConfigError, match=r"reads [1-9]\d* of \d+ lines differently.*first: '  Two"
    ):
        export(wired_model(vocab=VOCAB, max_len=64), tokenizer, tmp_path)
    assert not (tmp_path / "hf").exists()


def test_the_export_command_writes_a_model_card_from_the_run(tmp_path: Path) -> None:
    data = toy_data(tmp_path / "data")
    run_dir = tmp_path / "run"
    trained = run(
        "train",
        tmp_path,
        *small_model(data, tmp_path / "cache"),
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.num_sanity_val_steps=0",
        "average_last=0",
        f"hydra.run.dir={run_dir}",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = tmp_path / "hf"
    result = run(
        "export",
        tmp_path,
        f"ckpt_path={run_dir}",
        "export.format=hf",
        f"export.dir={out}",
        "export.license=cc-by-4.0",
        "export.data_license='the toy corpus: public domain'",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, block, body = (out / "README.md").read_text().split("---\n", 2)
    meta = yaml.safe_load(block)
    assert meta["language"] == ["src", "tgt"] and meta["license"] == "cc-by-4.0"
    assert meta["pipeline_tag"] == "translation"
    (result,) = meta["model-index"][0]["results"]
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert result["metrics"][0]["value"] == summary["test"]["test"]["bleu"]
    assert summary["test"]["test"]["bleu_signature"] in body
    assert "python -m seq2seq.train" in body and "public domain" in body
    assert summary["hardware"] in body and "CPU" in summary["hardware"]


def test_quantization_and_unknown_formats_are_refused_by_name(tmp_path: Path) -> None:
    for setting, key in (
        (["export.format=hf", "export.quantization=int8"], "export.quantization"),
        (["export.format=onnx"], "export.format"),
    ):
        result = run("export", tmp_path, "ckpt_path=x.ckpt", f"export.dir={tmp_path}/o", *setting)
        assert result.returncode != 0 and f"'{key}'" in result.stderr


def test_ctranslate2s_own_converter_reads_the_export_as_our_ctranslate2_export(
    exported, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """ct2-transformers-converter on the directory, its decoder start set to <s> (its Pegasus
    loader starts from <pad>) and its unknown token named (the tokenizer declares none, so that
    <unk> decodes as SentencePiece writes it), translates as `python -m seq2seq.export` does
    (beam 5)."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="needs the deploy extra: .[deploy]")
    from seq2seq.decoding.ctranslate2_backend import export_model

    model, directory = exported
    converted = tmp_path / "converted"
    ctranslate2.converters.TransformersConverter(str(directory)).convert(str(converted))
    settings = json.loads((converted / "config.json").read_text())
    assert settings["decoder_start_token"] == "<pad>"
    settings |= {"decoder_start_token": "<s>", "bos_token": "<s>", "unk_token": "<unk>"}
    (converted / "config.json").write_text(json.dumps(settings))
    ours = export_model(model, tokenizer, tmp_path / "ours")
    pieces = [tokenizer.src.encode(normalize(line), out_type=str) for line in LINES]

    def translate(path: Path, source: list[list[str]]) -> list[list[str]]:
        translator = ctranslate2.Translator(str(path), device="cpu", intra_threads=1)
        results = translator.translate_batch(
            source, beam_size=5, suppress_sequences=[["<pad>"], ["<s>"]], max_decoding_length=60
        )
        return [result.hypotheses[0] for result in results]

    theirs = translate(converted, [[*p, "</s>"] for p in pieces])  # it adds no source EOS
    assert theirs == translate(ours, pieces)
    assert any(theirs)
