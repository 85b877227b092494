"""Checkpoints written before the encoder's self-attention became an AttentionSite and the
attention projections were renamed (commit 000c687 and earlier) still load: for inference,
averaging, visualizing and resuming training.

The old format is written out here, independently of the code that reads it: the parameter
names and shapes below were printed from a model of OLD_MODEL_CONFIG at commit 000c687.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers import CONF_DIR, SPECIAL_IDS, compose_config, run, toy_overrides
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from seq2seq.config import group_config, validate_config
from seq2seq.data.config import TokenizerConfig
from seq2seq.data.tokenizer import Tokenizer, train_sentencepiece
from seq2seq.decoding.checkpoint import load_trained, read_checkpoint, upgrade_state_dict
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator
from seq2seq.model.transformer import Transformer
from seq2seq.training.checkpoint import average_checkpoints
from seq2seq.training.module import TranslationModule
from seq2seq.training.run import train
from seq2seq.upgrade import upgrade_config

VOCAB = 40


WEIGHT_BIAS = ("weight", "bias")


def old_attention(prefix: str, additive: bool) -> list[tuple[str, tuple[int, ...]]]:
    """One attention module's parameters as named at commit 000c687 (d_model 16, 2 heads)."""
    energy = [(f"{prefix}.energy", (2, 8))] if additive else []
    return energy + [
        (f"{prefix}.{name}.{kind}", shape if kind == "weight" else shape[:1])
        for name, shape in (("query", (16, 16)), ("key_value", (32, 16)), ("output", (16, 16)))
        for kind in WEIGHT_BIAS
    ]


def old_block(prefix: str, blocks: tuple[str, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """A layer's feed-forward and layer-norm parameters as named at commit 000c687."""
    feed_forward = [
        (f"{prefix}.feed_forward.{name}.{kind}", shape if kind == "weight" else shape[:1])
        for name, shape in (("expand", (32, 16)), ("contract", (16, 32)))
        for kind in WEIGHT_BIAS
    ]
    norms = [
        (f"{prefix}.{block}.norm.{kind}", (16,)) for block in blocks for kind in ("weight", "bias")
    ]
    return feed_forward + norms


# state_dict() of Transformer(OLD_MODEL_CONFIG, 40, 40, joint_vocab=True) at commit 000c687, in
# its order: the encoder's self-attention was a MultiHeadAttention of its own, and every
# attention's projections were named query / key_value / output
OLD_STATE = [
    ("src_embedding.tokens.weight", (40, 16)),
    ("tgt_embedding.tokens.weight", (40, 16)),
    *old_attention("encoder_layers.0.self_attention", additive=True),
    *old_block("encoder_layers.0", ("attention_block", "feed_forward_block")),
    *old_attention("decoder_layers.0.self_attention.attention", additive=False),
    *old_attention("decoder_layers.0.cross_attention.attention", additive=True),
    *old_block("decoder_layers.0", ("self_block", "cross_block", "feed_forward_block")),
    ("encoder_norm.weight", (16,)),
    ("encoder_norm.bias", (16,)),
    ("decoder_norm.weight", (16,)),
    ("decoder_norm.bias", (16,)),
    ("output_projection.weight", (40, 16)),
]
TIED = ("src_embedding.tokens.weight", "tgt_embedding.tokens.weight", "output_projection.weight")

# asdict(config.model) at commit 000c687: the Enums of today were plain strings
OLD_MODEL_CONFIG = {
    "name": "transformer_tiny",
    "d_model": 16,
    "heads": 2,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "ffn_dim": 32,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "positions": "sinusoidal",
    "norm": "pre",
    "tie_embeddings": True,
    "max_len": 256,
    "attention": {
        "name": "standard",
        "encoder_self": {
            "query": "source",
            "key_value": "source",
            "score": "additive",
            "heads": None,
        },
        "decoder_self": {
            "query": "target",
            "key_value": "target",
            "score": "scaled_dot",
            "heads": None,
        },
        "cross": {"query": "target", "key_value": "source", "score": "additive", "heads": None},
        "allow_future_leak": False,
    },
}
# the same model as command-line overrides, for training one
OLD_MODEL_OVERRIDES = [
    "model=transformer_tiny",
    "model.d_model=16",
    "model.heads=2",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.ffn_dim=32",
    "model.dropout=0.0",
    "model.attention.encoder_self.score=additive",
    "model.attention.cross.score=additive",
]
SENTENCES = ["a dog runs", "the cat sleeps", "a man reads a book", "two children play"]


@pytest.fixture(scope="module")
def sentencepiece() -> bytes:
    """A joint 40-piece SentencePiece model, the vocabulary of OLD_STATE."""
    config = group_config("tokenizer/sentencepiece", TokenizerConfig)
    config.vocab_size, config.byte_fallback = VOCAB, False
    return train_sentencepiece(SENTENCES * 20, config)


def old_config() -> dict:
    """asdict(RootConfig) as 000c687 stored it: every value a plain Python value."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose("train", overrides=["tokenizer.vocab_size=40"])
    config = OmegaConf.to_container(composed, resolve=True)
    config["tokenizer"]["byte_fallback"] = False
    config["model"] = copy.deepcopy(OLD_MODEL_CONFIG)
    for key in ("nbest", "search", "temperature", "top_k", "top_p", "seed", "target_lang"):
        del config["decoding"][key]  # added since
    del config["data"]["directions"], config["data"]["corpora"], config["data"]["mix_temperature"]
    for files in config["data"]["splits"].values():  # file names held the languages
        for side, name in files.items():
            files[side] = name.replace("{src}", "en").replace("{tgt}", "de")
    del config["tokenizer"]["input_sentence_size"], config["tokenizer"]["num_threads"]
    del config["data"]["encode_processes"], config["data"]["bpe_dropout"]
    del config["data"]["pad_to_multiple"], config["data"]["bidirectional_epochs"]
    del config["data"]["val_subset"]
    del config["threads"], config["cuda_graphs"], config["prefer_checkpoint"]
    del config["derive_from_corpus"]
    del config["optim"]["decay"], config["optim"]["r_drop"], config["optim"]["ema_decay"]
    return config


def old_weights(seed: int) -> list[torch.Tensor]:
    """Random values for OLD_STATE, in its order; the three tied matrices are one tensor."""
    generator = torch.Generator().manual_seed(seed)
    values = [torch.randn(shape, generator=generator) * 0.3 for _, shape in OLD_STATE]
    tied = values[0]
    return [
        tied if name in TIED else value for (name, _), value in zip(OLD_STATE, values, strict=True)
    ]


def write_old_checkpoint(path: Path, seed: int, sentencepiece: bytes) -> Path:
    weights = zip(OLD_STATE, old_weights(seed), strict=True)
    state_dict = {f"model.{name}": value for (name, _), value in weights}
    checkpoint = {
        "state_dict": state_dict,
        "seq2seq": {"config": old_config(), "src_model": sentencepiece, "tgt_model": sentencepiece},
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": pl.__version__,
    }
    torch.save(checkpoint, path)
    return path


def direct_model(weights: list[torch.Tensor]) -> Transformer:
    """Today's model of the old config, its parameters set in registration order."""
    config = validate_config(OmegaConf.create(upgrade_config(old_config())))
    model = Transformer(config.model, VOCAB, VOCAB, True, **SPECIAL_IDS).eval()
    names = list(model.state_dict())
    assert len(names) == len(weights)
    model.load_state_dict(dict(zip(names, weights, strict=True)))
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 6))
    src[1, 4:] = SPECIAL_IDS["pad_id"]
    return src, torch.randint(4, VOCAB, (3, 5))


def test_old_names_map_to_todays_in_registration_order() -> None:
    """Adam's state in a checkpoint is a list in parameter order: the order must not change."""
    model = direct_model(old_weights(0))
    today = model.state_dict()
    old = {name: torch.empty(shape) for name, shape in OLD_STATE}
    upgraded = upgrade_state_dict(old)
    assert list(upgraded) == list(today)
    assert [tuple(v.shape) for v in today.values()] == [shape for _, shape in OLD_STATE]
    assert list(upgrade_state_dict(today)) == list(today)  # today's names stay
    parameters = [name for name in upgraded if name not in TIED[1:]]  # tied: counted once
    assert [name for name, _ in model.named_parameters()] == parameters


def test_load_trained_and_translator_read_an_old_checkpoint(
    sentencepiece: bytes, tmp_path: Path
) -> None:
    path = write_old_checkpoint(tmp_path / "old.ckpt", 0, sentencepiece)
    trained = load_trained(path)
    assert "token_replacement" not in OLD_MODEL_CONFIG
    assert trained.config.model.token_replacement == 0.0  # written before the key existed
    assert trained.config.data.bpe_dropout == 0.0  # likewise
    assert trained.config.data.pad_to_multiple == 1  # likewise: batches padded to their longest
    assert trained.config.data.bidirectional_epochs == 0  # likewise: the pairs as given
    assert trained.config.data.val_subset == 0  # likewise: validated on the whole split
    assert trained.config.cuda_graphs == 0  # likewise: trained eagerly
    assert trained.config.derive_from_corpus is False  # likewise: settings as configured
    data = trained.config.data  # likewise: one direction, no tags
    assert (data.directions, data.corpora, data.multilingual) == ([], {}, False)
    assert trained.config.decoding.target_lang is None
    assert trained.config.decoding.search == "beam" and trained.config.decoding.top_p == 1.0
    assert trained.config.optim.decay == "inverse_sqrt"  # the only schedule there was
    assert trained.config.optim.r_drop == 0.0  # one pass per batch, as then
    assert trained.config.optim.ema_decay == 0.0  # the trained weights, no moving average
    direct = direct_model(old_weights(0))
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(trained.model(src, tgt), direct(src, tgt))
    greedy = group_config("decoding/greedy", DecodingConfig)
    from_checkpoint = Translator.from_checkpoint(path, greedy)
    built = Translator(direct, Tokenizer(sentencepiece, sentencepiece), greedy)
    assert from_checkpoint.translate(SENTENCES) == built.translate(SENTENCES)
    beam = group_config("decoding/beam", DecodingConfig)
    expected = Translator(direct, built.tokenizer, beam).backend.search(src, beam)
    loaded = Translator.from_checkpoint(path, beam).backend
    assert [[h.tokens for h in n] for n in loaded.search(src, beam)] == [
        [h.tokens for h in n] for n in expected
    ]


def test_an_export_directory_with_an_old_config_loads(sentencepiece: bytes, tmp_path: Path) -> None:
    """seq2seq_export.json records the training config as the export's version wrote it."""
    from seq2seq.decoding.ctranslate2_backend import export_model, read_metadata, training_config

    directory = tmp_path / "ct2"
    tokenizer = Tokenizer(sentencepiece, sentencepiece)
    model = Transformer(compose_config().model, VOCAB, VOCAB, True, **SPECIAL_IDS)
    export_model(model, tokenizer, directory, metadata={"config": old_config()})  # old: additive
    config = training_config(directory, read_metadata(directory))
    assert config.optim.r_drop == 0.0 and config.optim.decay == "inverse_sqrt"
    assert config.optim.ema_decay == 0.0
    assert config.model.token_replacement == 0.0 and config.cuda_graphs == 0
    assert config.data.bpe_dropout == 0.0 and config.decoding.search == "beam"
    assert config.data.bidirectional_epochs == 0


def test_average_of_two_old_checkpoints(sentencepiece: bytes, tmp_path: Path) -> None:
    paths = [write_old_checkpoint(tmp_path / f"{s}.ckpt", s, sentencepiece) for s in (1, 2)]
    averaged = average_checkpoints(paths, tmp_path / "averaged.ckpt")
    mean = [(a + b) / 2 for a, b in zip(old_weights(1), old_weights(2), strict=True)]
    state = read_checkpoint(averaged)["state_dict"]
    for value, expected in zip(state.values(), mean, strict=True):
        torch.testing.assert_close(value, expected)
    src, tgt = batch()
    with torch.no_grad():
        expected = direct_model(mean)(src, tgt)
        torch.testing.assert_close(load_trained(averaged).model(src, tgt), expected)


def test_translation_module_loads_an_old_checkpoint(sentencepiece: bytes, tmp_path: Path) -> None:
    """What Lightning does on resume: on_load_checkpoint, then a strict load_state_dict."""
    checkpoint = torch.load(
        write_old_checkpoint(tmp_path / "old.ckpt", 0, sentencepiece), weights_only=True
    )
    config = validate_config(OmegaConf.create(upgrade_config(checkpoint["seq2seq"]["config"])))
    module = TranslationModule(config, Tokenizer(sentencepiece, sentencepiece)).eval()
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"])
    src, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(module.model(src, tgt), direct_model(old_weights(0))(src, tgt))


def test_visualize_reads_an_old_checkpoint(sentencepiece: bytes, tmp_path: Path) -> None:
    path = write_old_checkpoint(tmp_path / "old.ckpt", 0, sentencepiece)
    result = run("visualize", tmp_path, f"ckpt_path={path}", "text=a dog runs", "output=map.png")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "map.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.png", "old.ckpt"]  # no .log


@pytest.mark.slow
def test_lightning_resumes_from_a_checkpoint_with_old_names(
    toy_files: Path, tmp_path: Path
) -> None:
    """Train one epoch, rename the checkpoint's parameters to the old names (by position), and
    resume from it with the Trainer: model and Adam state are restored, training goes on."""
    base = [
        *toy_overrides(toy_files, tmp_path / "cache"),
        *OLD_MODEL_OVERRIDES,
        "trainer.num_sanity_val_steps=0",
        "decoding=greedy",
        "average_last=0",
        "evaluate_after=false",
    ]
    first = train(compose_config([*base, "trainer.max_epochs=1"]), tmp_path / "first")
    last = Path(first["final_checkpoint"]).parent / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    values = list(checkpoint["state_dict"].values())
    checkpoint["state_dict"] = {
        f"model.{name}": value for (name, _), value in zip(OLD_STATE, values, strict=True)
    }
    old = tmp_path / "old_names.ckpt"
    torch.save(checkpoint, old)
    resumed_dir = tmp_path / "resumed"
    train(compose_config([*base, "trainer.max_epochs=2", f"ckpt_path={old}"]), resumed_dir)
    resumed = read_checkpoint(resumed_dir / "checkpoints" / "last.ckpt")
    steps = checkpoint["global_step"]
    assert resumed["epoch"] == 1 and resumed["global_step"] == 2 * steps
    adam_steps = next(iter(resumed["optimizer_states"][0]["state"].values()))["step"]
    assert int(adam_steps) == 2 * steps  # Adam's moments were restored, not restarted
