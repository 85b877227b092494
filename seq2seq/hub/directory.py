"""Writing the transformers model directory: config.json and model.safetensors (Pegasus),
generation_config.json (our decoding settings), tokenizer.json and tokenizer_config.json, the
model card, our SentencePiece models and seq2seq_export.json (where the model came from, and the
tokenizer's parity with ours on the run's validation and test text)."""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

from seq2seq.config import RootConfig
from seq2seq.data.corpus import normalize, read_parallel, split_paths
from seq2seq.data.directions import directions, tag
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.config import DecodingConfig
from seq2seq.errors import ConfigError, install_hint
from seq2seq.hub.card import model_card
from seq2seq.hub.pegasus import check_pegasus, pegasus_config, pegasus_state
from seq2seq.hub.tokenizer import fast_tokenizer, parity, tokenizer_config
from seq2seq.io import atomic_dir
from seq2seq.model.transformer import Transformer

log = logging.getLogger(__name__)

METADATA = "seq2seq_export.json"
# text SentencePiece and a re-implementation are most likely to read differently (but for the
# spelled-out special pieces a unigram tokenizer reads as pieces: see seq2seq.hub.tokenizer)
HOSTILE = [
    "",
    "  Two  spaces\tand a tab  ",
    "non\u00a0breaking\u2009thin\u3000ideographic",
    "a <b> c </b>",
    "\u2581already escaped \u2581",
    "ﬁnal ligature, ① circled, Ｆｕｌｌ width",
    "emoji 🦒 and 𝔣𝔯𝔞𝔨𝔱𝔲𝔯, Ωμέγα, 中文, العربية",
    "x\x1cy\x1fz",
]


def import_transformers() -> ModuleType:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ConfigError(
            f"export.format=hf needs the transformers package: {install_hint('hf')}"
        ) from None


def search_settings(decoding: DecodingConfig) -> dict[str, Any]:
    """Our search as generate's keywords: sampling, greedy, or the beam with its length
    penalty (both count EOS in the length)."""
    if decoding.search == "sample":
        return {
            "do_sample": True,
            "num_beams": 1,
            "temperature": decoding.temperature,
            "top_k": decoding.top_k,
            "top_p": decoding.top_p,
        }
    if decoding.beam_size == 1:
        return {"do_sample": False, "num_beams": 1}
    return {
        "do_sample": False,
        "num_beams": decoding.beam_size,
        "length_penalty": decoding.length_penalty,
        "early_stopping": True,
    }


def generation_config(model: Transformer, decoding: DecodingConfig) -> dict[str, Any]:
    """Our search's settings as transformers' generation config: our ids, the search, PAD, BOS
    and tags never output and the rest renormalised, as ours does; at most model.max_len - 1
    tokens and EOS (transformers counts the start token). Our per-sentence limit
    (decoding.max_len_a/b) has no equivalent."""
    return {
        "decoder_start_token_id": model.bos_id,
        "bos_token_id": model.bos_id,
        "eos_token_id": model.eos_id,
        "pad_token_id": model.pad_id,
        "forced_eos_token_id": model.eos_id,
        "max_length": model.config.max_len + 1,
        "suppress_tokens": list(model.never_ids),
        "renormalize_logits": True,
        "num_return_sequences": 1,
        **search_settings(decoding),
    }


def parity_lines(config: RootConfig, tokenizer: Tokenizer) -> tuple[list[str], list[list[int]]]:
    """Text to check the exported tokenizer on, and our ids of each (EOS included): both sides
    of each direction's validation and test sets where their files are here (a multilingual
    model's sources led by the direction's tag), and HOSTILE."""
    multilingual = config.data.multilingual

    def ours(texts: list[str]) -> list[list[int]]:
        return tokenizer.encode_src([normalize(line) for line in texts])

    lines, expected = (
        list(HOSTILE),
        [[*ids, tokenizer.eos_id] for ids in ours(HOSTILE)],
    )
    for direction in directions(config.data):
        for name in [direction.data.val_split, *direction.data.test_sets]:
            split = split_paths(direction.data, name)
            if not all(path.is_file() for path in split.files):
                continue
            sources, targets = read_parallel(split)
            encoded = ours(sources + targets)
            if multilingual:
                lead = f"{tag(direction.tgt)} "
                tag_id = tokenizer.piece_id(tag(direction.tgt))
                lines += [lead + line for line in sources] + targets
                expected += [[tag_id, *ids, tokenizer.eos_id] for ids in encoded[: len(sources)]]
                expected += [[*ids, tokenizer.eos_id] for ids in encoded[len(sources) :]]
            else:
                lines += sources + targets
                expected += [[*ids, tokenizer.eos_id] for ids in encoded]
    return lines, expected


def export_transformers(
    model: Transformer,
    tokenizer: Tokenizer,
    config: RootConfig,
    directory: Path,
    card: dict[str, Any],
    metadata: dict[str, Any],
    overwrite: bool = False,
) -> Path:
    """Write `model` as a transformers model directory (see the module docstring). `card`:
    model_card's arguments besides the config. The tokenizer must encode every checked line
    as ours does, or nothing is written."""
    transformers = import_transformers()
    check_pegasus(model, tokenizer)
    fast = fast_tokenizer(tokenizer)
    lines, expected = parity_lines(config, tokenizer)
    checked = parity(fast, tokenizer, lines, expected)
    if checked["encoded_differently"] or checked["decoded_differently"]:
        raise ConfigError(
            f"tokenizer.model_type={config.tokenizer.model_type}: transformers' tokenizer reads "
            f"{checked['encoded_differently']} of {checked['lines']} lines differently from "
            f"SentencePiece and decodes {checked['decoded_differently']} differently (first: "
            f"{checked['first_difference']!r}); nothing exported. Train with "
            "tokenizer.model_type=unigram (the recipes' choice), or export to CTranslate2"
        )
    hf_config = transformers.PegasusConfig(**pegasus_config(model, tokenizer.src_vocab_size))
    # transformers 4.x's translation pipeline starts from its own beam of 4 and takes the
    # search from here (a legacy key transformers 5 no longer reads)
    hf_config.task_specific_params = {"translation": search_settings(config.decoding)}
    hf_model = transformers.PegasusForConditionalGeneration(hf_config)
    state = pegasus_state(model)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    hf_model.generation_config = transformers.GenerationConfig(
        **generation_config(model, config.decoding)
    )
    with atomic_dir(directory, replace=True) as tmp:
        hf_model.save_pretrained(tmp)
        fast.save(str(tmp / "tokenizer.json"))
        settings = tokenizer_config(tokenizer, model.config.max_len)
        (tmp / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
        tokenizer.save(tmp)
        (tmp / "README.md").write_text(model_card(config, **card), encoding="utf-8")
        record = {"format": "hf", "tokenizer_parity": checked, **metadata}
        (tmp / METADATA).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return directory
