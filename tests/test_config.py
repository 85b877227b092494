"""Every config in seq2seq/conf/ composes; bad keys and values fail early, naming the key."""

from __future__ import annotations

import functools
import io
import itertools
import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from helpers import CONF_DIR, ROOT, compose_config, differing_settings, split_file_overrides
from omegaconf import OmegaConf
from pytorch_lightning.callbacks import EarlyStopping
from test_docs import anchors

from seq2seq.config import RootConfig, config_to_dict, validate_config
from seq2seq.data.batching import TokenBudgetBatchSampler
from seq2seq.data.corpus import split_paths
from seq2seq.errors import ConfigError
from seq2seq.evaluate import EvaluateConfig
from seq2seq.export import ExportConfig
from seq2seq.model.config import Score, Stream
from seq2seq.training.config import several_processes
from seq2seq.training.run import build_trainer
from seq2seq.translate import TranslateConfig
from seq2seq.upgrade import load_config
from seq2seq.visualize import VisualizeConfig

OPTIONAL_GROUPS = {"ablation"}  # not in the defaults list: selected with +ablation=...
EXPERIMENTS = CONF_DIR / "experiment"
PRESETS = sorted(path.stem for path in EXPERIMENTS.glob("*.yaml"))


def group_options() -> list[tuple[str, str]]:
    options = [
        (str(yaml.parent.relative_to(CONF_DIR)), yaml.stem)
        for yaml in sorted(CONF_DIR.rglob("*.yaml"))
        if yaml.parent != CONF_DIR
    ]
    assert len(options) >= 25, options
    return options


@pytest.mark.parametrize(("group", "option"), group_options())
def test_every_config_file_composes(group: str, option: str) -> None:
    extra = split_file_overrides() if (group, option) == ("data", "parallel_files") else []
    if (group, option) == ("optim", "adam_linear_decay"):
        extra = ["trainer.max_steps=100"]  # a budget to decay over
    plus = "+" if group in OPTIONAL_GROUPS else ""
    config = compose_config([f"{plus}{group}={option}", *extra])
    if group == "model":
        assert config.model.name == option
    if group == "data":
        assert config.data.name == option


@pytest.mark.parametrize(
    ("name", "schema", "overrides"),
    [
        ("evaluate", EvaluateConfig, ["ckpt_path=x.ckpt"]),
        ("translate", TranslateConfig, ["ckpt_path=x.ckpt"]),
        ("visualize", VisualizeConfig, ["ckpt_path=x.ckpt", "text=A dog."]),
        ("export", ExportConfig, ["ckpt_path=x.ckpt", "export.dir=ct2"]),
    ],
)
def test_root_configs_compose(name: str, schema: type, overrides: list[str]) -> None:
    config = compose_config(overrides, config_name=name, schema=schema)
    assert config.ckpt_path == "x.ckpt"
    if name == "export":
        assert config.export.quantization == "none" and config.export.overwrite is False
    else:
        assert config.decoding.beam_size == (1 if name == "visualize" else 5)
    with pytest.raises(ConfigError, match="'ckpt_path'"):
        compose_config(overrides[1:], config_name=name, schema=schema)


def test_defaults_are_multi30k_en_de() -> None:
    config = compose_config()
    assert (config.data.name, config.data.src_lang, config.data.tgt_lang) == (
        "multi30k",
        "en",
        "de",
    )
    assert split_paths(config.data, "train").src.name == "train.en.gz"
    assert split_paths(config.data, "test_2016_flickr").tgt.name == "test_2016_flickr.de.gz"
    languages = config.data.languages
    assert languages == ["en", "de", "fr", "cs"]
    assert set(config.data.download.sha256) == {
        f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in languages
    }
    assert config.ckpt_path is None  # optional for train (it resumes from it); evaluate requires it


def test_language_override_reaches_file_names() -> None:
    config = compose_config(["data.src_lang=fr", "data.tgt_lang=en"])
    val = split_paths(config.data, "val")
    assert (val.src.name, val.tgt.name) == ("val.fr.gz", "val.en.gz")


@functools.cache
def composed(*overrides: str) -> RootConfig:
    """compose_config, once per session for each list of overrides: tests only read it."""
    return compose_config(list(overrides))


def preset(name: str) -> RootConfig:
    return composed(f"experiment={name}")


def preset_file(name: str) -> dict:
    """An experiment preset's own settings, as its file states them."""
    return yaml.safe_load((EXPERIMENTS / f"{name}.yaml").read_text())


def test_experiment_preset_overrides_groups() -> None:
    """smoke swaps the model group and sets keys of two others; the composed config has them."""
    smoke = preset_file("smoke")
    config = preset("smoke")
    assert config.model.name == smoke["defaults"][0]["override /model"] != composed().model.name
    assert config.tokenizer.vocab_size == smoke["tokenizer"]["vocab_size"]
    assert config.trainer["max_epochs"] == smoke["trainer"]["max_epochs"]


@pytest.mark.parametrize("name", ["ablation_cpu", "multi30k_cpu_1h_wu2021"])
def test_experiment_preset_overrides_root_keys(name: str) -> None:
    """A preset's top-level keys beat train.yaml's defaults; the command line beats both."""
    average_last = preset_file(name)["average_last"]
    assert average_last != composed().average_last
    assert preset(name).average_last == average_last
    assert compose_config([f"experiment={name}", "average_last=7"]).average_last == 7


@pytest.mark.parametrize("name", PRESETS)
def test_experiment_preset_opens_with_its_purpose_budget_result_and_evidence(name: str) -> None:
    """The comment a preset opens with says what it is for, its budget and the result to
    expect, and links to the evidence: a docs file and a heading of it that exist. Run history
    (dates, run numbers, p-values) stays out of presets."""
    lines = (EXPERIMENTS / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"
    opening = itertools.takewhile(lambda line: line.startswith("#"), lines[1:])
    comment = " ".join(line[1:].strip() for line in opening)
    assert "Budget:" in comment and "Expect" in comment, comment
    link = re.search(r"\b((?:docs/)?[\w/.-]+\.md)#([\w-]+)", comment)
    assert link, f"{name}.yaml: no link to docs/<file>.md#<section> in its opening comment"
    target = ROOT / link.group(1)
    assert target.is_file(), f"{name}.yaml links to {link.group(1)}, which does not exist"
    assert link.group(2) in anchors(target.read_text(encoding="utf-8")), link.group(0)
    text = "\n".join(lines)
    assert not re.search(r"\b20\d\d-\d\d-\d\d|\bruns? \d|\bp [=<] 0|\bfamily \d", text), name


def test_wu2021_model_is_transformer_small_with_their_sizes_and_dropout() -> None:
    """model=transformer_wu2021 is the paper's model (Wu et al. 2021, 4+4 layers of d_model
    128); every setting the paper does not name is transformer_small's."""
    wu2021 = composed("model=transformer_wu2021")
    changed = differing_settings(composed("model=transformer_small"), wu2021)
    sizes = {"d_model", "ffn_dim", "encoder_layers", "decoder_layers", "dropout"}
    assert changed == {"model.name"} | {f"model.{key}" for key in sizes}
    model = wu2021.model
    published = {"encoder_layers": 4, "decoder_layers": 4, "d_model": 128, "heads": 4}
    published |= {"ffn_dim": 256, "dropout": 0.3}
    assert {key: getattr(model, key) for key in published} == published


CLOCK_IN_NAME = re.compile(r"_(\d+)(h|s)(?=_|$)")  # multi30k_cpu_1h_tuned, multi30k_gpu_90s


@pytest.mark.parametrize("name", [p for p in PRESETS if CLOCK_IN_NAME.search(p)])
def test_a_preset_named_for_its_clock_stops_by_it(name: str) -> None:
    """A name's "1h" or "90s" is its training clock: Lightning's Timer stops at that budget or
    a little before (the 90-s preset leaves fit's set-up and end a few seconds of it)."""
    amount, unit = CLOCK_IN_NAME.search(name).groups()
    budget = int(amount) * {"h": 3600, "s": 1}[unit]
    days, hours, minutes, seconds = map(int, preset(name).trainer["max_time"].split(":"))
    clock = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    assert 0.95 * budget <= clock <= budget


# multi30k_cpu_1h stops early by design (patience 10); every other preset trains a fixed budget
FIXED_BUDGET = [name for name in PRESETS if name != "multi30k_cpu_1h"]


@pytest.mark.parametrize("name", FIXED_BUDGET)
def test_fixed_budget_preset_never_stops_early(name: str, request: pytest.FixtureRequest) -> None:
    """Early stopping is off, or the budget ends the run before it has validated more times than
    the patience: a Multi30k epoch at the preset's batch size bounds the epochs its max_steps
    hold."""
    config = preset(name)
    patience, trainer = config.early_stopping_patience, config.trainer
    if patience is None:
        return
    epochs = trainer["max_epochs"] if trainer["max_epochs"] > 0 else math.inf
    if trainer["max_steps"] > 0:
        assert config.tokenizer == composed().tokenizer, (
            "counts the fixture's batches: its tokenizer"
        )
        batches = epoch_sampler(request.getfixturevalue("multi30k"), config)
        epochs = min(epochs, -(-trainer["max_steps"] // len(batches)))
    validations = epochs // trainer["check_val_every_n_epoch"] + 1  # + 1: a stop validates
    assert validations <= patience, f"{name}: up to {validations} validations, patience {patience}"


def epoch_sampler(prepared, config) -> TokenBudgetBatchSampler:
    """The training batches of an epoch of prepared Multi30k at `config`'s batch settings."""
    train = prepared.splits["train"]
    return TokenBudgetBatchSampler(
        train.src_lens,
        train.tgt_lens,
        config.data.max_tokens,
        True,
        pad_to_multiple=config.data.pad_to_multiple,
    )


def test_cuda_graphs_bound_covers_every_batch_shape_of_an_epoch(multi30k) -> None:
    """A preset that captures CUDA graphs has room for every batch shape of its epochs (the
    same shapes each epoch: the cut depends on the lengths alone); none trains eagerly."""
    capturing = [name for name in PRESETS if preset(name).cuda_graphs]
    assert "ablation_gpu" in capturing and "multi30k_gpu_wu2021" in capturing
    for name in capturing:
        config = preset(name)
        assert config.tokenizer == composed().tokenizer  # the fixture's batches are the preset's
        sampler = epoch_sampler(multi30k, config)
        shapes = sampler.shapes()
        sampler.set_epoch(1)
        assert sampler.shapes() == shapes
        assert shapes <= config.cuda_graphs, (
            f"{name}: {shapes} shapes, cuda_graphs={config.cuda_graphs}"
        )


def test_tuned_hour_preset_stops_at_the_clock_or_wu2021s_token_budget(multi30k) -> None:
    """Where the hour holds more, the tuned preset stops at Wu et al.'s 8,000 updates of
    2 x 4,096 tokens (as many tokens in updates of data.max_tokens): not at an epoch count
    first, and after warmup has ended."""
    config = preset("multi30k_cpu_1h_tuned")
    trainer = config.trainer
    assert trainer["max_time"] is not None
    assert trainer["max_steps"] * config.data.max_tokens == 8000 * 2 * 4096
    if trainer["max_epochs"] > 0:
        batches = len(epoch_sampler(multi30k, config))
        assert trainer["max_epochs"] * batches >= trainer["max_steps"]
    assert config.optim.warmup_steps < trainer["max_steps"]


# (preset, the one it is built from, the settings it changes): each preset stands in a file of
# its own, and these relations keep the copies of a recipe from drifting apart
RELATED_PRESETS = {
    # the settings validation chose (the whole hour, up to Wu et al.'s budget in tokens; a moving
    # average, its weights at the end preferred; the unigram tokenizer, bidirectional training)
    "tuned from wu2021": (
        "multi30k_cpu_1h_tuned",
        "multi30k_cpu_1h_wu2021",
        "trainer.max_epochs trainer.max_steps optim.ema_decay prefer_checkpoint "
        "tokenizer.model_type data.bidirectional_epochs",
    ),
    # several directions in one model: wider, less dropout, and no bidirectional epochs
    # (refused there)
    "multilingual from tuned": (
        "multi30k_multilingual_cpu_1h",
        "multi30k_cpu_1h_tuned",
        "data.directions data.bidirectional_epochs model.d_model model.ffn_dim model.dropout",
    ),
    # where and how long the recipe trains: their batch in one, their updates instead of the
    # hour, the GPU and its speed settings; not the model, tokenizer or optimizer
    "gpu from cpu": (
        "multi30k_gpu_wu2021",
        "multi30k_cpu_1h_wu2021",
        "data.max_tokens data.num_workers trainer.accelerator trainer.precision "
        "trainer.max_epochs trainer.max_steps trainer.max_time "
        "trainer.check_val_every_n_epoch cuda_graphs",
    ),
    # a schedule for the clock (linear decay to 0, its own warmup and peak), lengths padded
    # (fewer captures), validated less often, stopped by the clock
    "90s from gpu": (
        "multi30k_gpu_90s",
        "multi30k_gpu_wu2021",
        "optim.decay optim.lr optim.warmup_steps data.pad_to_multiple trainer.max_time "
        "trainer.check_val_every_n_epoch",
    ),
}


@pytest.mark.parametrize(("name", "base", "changes"), RELATED_PRESETS.values(), ids=RELATED_PRESETS)
def test_a_preset_changes_only_its_own_settings_of_the_recipe_it_builds_on(
    name: str, base: str, changes: str
) -> None:
    assert differing_settings(preset(base), preset(name)) == set(changes.split())


@pytest.mark.parametrize(
    "name",
    ["multi30k_cpu_1h_wu2021", "multi30k_cpu_1h_tuned", "multi30k_gpu_wu2021", "multi30k_gpu_90s"],
)
def test_wu2021_presets_train_their_model_as_published(name: str) -> None:
    assert preset(name).model == composed("model=transformer_wu2021").model


def test_gpu_preset_takes_wu2021s_two_batches_as_one() -> None:
    cpu, gpu = preset("multi30k_cpu_1h_wu2021"), preset("multi30k_gpu_wu2021")
    assert gpu.data.max_tokens == 2 * cpu.data.max_tokens


def test_every_preset_the_docs_name_composes() -> None:
    """Each `experiment=<name>` in README.md and docs/ (but for a user's own, under
    --config-dir) is a shipped preset, and composes."""
    named = {
        match
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line in path.read_text(encoding="utf-8").splitlines()
        if "--config-dir" not in line
        for match in re.findall(r"\bexperiment=(\w+)", line)
    }
    assert named and named <= set(PRESETS), named - set(PRESETS)
    for name in named:
        preset(name)


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["+data.max_token=10"], "data.max_token", "not in"),
        (["data.max_tokens=lots"], "data.max_tokens", "could not be converted"),
        (["model.heads=3"], "model.heads", "not divisible"),
        (["model.encoder_layers=0"], "model.encoder_layers", ">= 1"),
        (["model.token_replacement=1.0"], "model.token_replacement", "must be in [0, 1)"),
        (["optim.decay=cosine"], "optim.decay", "use inverse_sqrt or linear"),
        (["optim.r_drop=-1"], "optim.r_drop", "must be >= 0"),
        (["optim.r_drop=1", "model.dropout=0"], "optim.r_drop", "model.dropout > 0"),
        (["optim=adam_linear_decay"], "optim.decay", "set trainer.max_steps or trainer.max_time"),
        (["optim.ema_decay=1"], "optim.ema_decay", "must be in [0, 1)"),
        (
            ["optim.ema_decay=0.999", "+trainer.strategy=fsdp"],
            "optim.ema_decay",
            "trainer.strategy=fsdp shards them; use DDP",
        ),
        (["data.src_lang=xx"], "data.src_lang", "unknown language 'xx'"),
        (["data.tgt_lang=en"], "data.tgt_lang", "both 'en'"),
        (["data.test_sets=[test_2099]"], "data.test_sets", "'test_2099' is not one of"),
        (["data.max_tokens=64"], "data.max_tokens", "cannot hold one training pair"),
        (["data.pad_to_multiple=0"], "data.pad_to_multiple", "must be >= 1"),
        (
            ["data.max_tokens=130", "data.pad_to_multiple=64"],  # 128 + 1 padded to 192
            "data.max_tokens",
            "130 cannot hold one training pair of data.filter.max_len=128 tokens plus BOS/EOS, "
            "padded to 192",
        ),
        (["tokenizer.model_type=wordpiece"], "tokenizer.model_type", "not supported"),
        (["tokenizer.input_sentence_size=-1"], "tokenizer.input_sentence_size", "must be >= 0"),
        (["tokenizer.num_threads=0"], "tokenizer.num_threads", "must be >= 1"),
        (["data.encode_processes=-2"], "data.encode_processes", "must be >= 0"),
        (["data.bpe_dropout=1.0"], "data.bpe_dropout", "must be in [0, 1)"),
        (
            ["data.bpe_dropout=0.1", "tokenizer.model_type=unigram"],
            "data.bpe_dropout",
            "use tokenizer.model_type=bpe or data.bpe_dropout=0",
        ),
        (["data.bpe_dropout=0.1", "data.num_workers=2"], "data.bpe_dropout", "data.num_workers=0"),
        (["data.bidirectional_epochs=-1"], "data.bidirectional_epochs", "must be >= 0 (0: off)"),
        (
            ["data.bidirectional_epochs=3", "tokenizer.joint=false"],
            "data.bidirectional_epochs",
            "set tokenizer.joint=true or data.bidirectional_epochs=0",
        ),
        (
            ["data.bidirectional_epochs=3", "data.bpe_dropout=0.1"],
            "data.bidirectional_epochs",
            "not offered together; set one of them to 0",
        ),
        (["data=parallel_files"], "data.splits.train", "name either two files"),
        (
            ["data=parallel_files", "data.splits.train.src=a", "data.splits.train.tsv=b"],
            "data.splits.train",
            "not both; got src=a tgt=None tsv=b",
        ),
        (["data.min_train_pairs=0"], "data.min_train_pairs", "must be >= 1"),
        (
            ["model.attention.cross.query=sauce"],
            "model.attention.cross.query",
            "Invalid value 'sauce', expected one of [source, target]",
        ),
        (
            ["model.attention.decoder_self.score=cosine"],
            "model.attention.decoder_self.score",
            "expected one of [scaled_dot, dot, additive]",
        ),
        (["model.norm=mid"], "model.norm", "expected one of [pre, post]"),
        (["model.positions=rotary"], "model.positions", "expected one of [sinusoidal, learned]"),
        (["cuda_graphs=-1"], "cuda_graphs", "must be >= 0"),
        (
            ["cuda_graphs=8", "trainer.accumulate_grad_batches=2"],
            "cuda_graphs",
            "need one batch per update",
        ),
        (["cuda_graphs=8", "trainer.devices=2"], "cuda_graphs", "set trainer.devices=1"),
        (["cuda_graphs=8", 'trainer.devices="3"'], "cuda_graphs", "set trainer.devices=1"),
        (["cuda_graphs=8", "+trainer.strategy=ddp"], "cuda_graphs", "trainer.strategy=ddp"),
        (["cuda_graphs=8", 'trainer.devices="0,1"'], "cuda_graphs", "set trainer.devices=1"),
        (["cuda_graphs=8", "trainer.devices=-1"], "cuda_graphs", "set trainer.devices=1"),
        (["cuda_graphs=8", "compile=true"], "cuda_graphs", "set compile=false or cuda_graphs=0"),
    ],
)
def test_bad_config_names_the_key(overrides: list[str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    message = str(info.value)
    assert message.startswith(f"config key '{key}': ")
    assert words in message
    assert "\n" not in message


def test_cuda_graphs_accept_one_device_by_count_or_by_index() -> None:
    for devices in ("1", "[0]"):
        assert compose_config(["cuda_graphs=8", f"trainer.devices={devices}"]).cuda_graphs == 8


def test_config_to_dict_stores_enums_as_strings_and_round_trips() -> None:
    config = compose_config(["+ablation=swapped_cross"])
    assert config.model.attention.cross.query is Stream.source
    stored = config_to_dict(config)
    cross = stored["model"]["attention"]["cross"]
    assert cross == {"query": "source", "key_value": "target", "score": "scaled_dot", "heads": None}
    assert type(cross["query"]) is str and type(stored["model"]["norm"]) is str
    buffer = io.BytesIO()
    torch.save({"config": stored}, buffer)  # as in a checkpoint
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["config"]
    assert validate_config(OmegaConf.create(loaded)) == config
    assert loaded["model"]["attention"]["encoder_self"]["score"] == Score.scaled_dot.value


@pytest.mark.parametrize(
    ("devices", "several"),
    [
        (1, False),
        ("1", False),
        ("1,", False),
        ([0], False),
        ("auto", False),
        (2, True),
        ("3", True),
        ("0,1", True),
        ([0, 1], True),
        (-1, True),
        ("-1", True),
    ],
)
def test_several_processes_reads_devices_as_lightning_does(devices, several: bool) -> None:
    assert several_processes({"devices": devices}) is several
    assert several_processes({"devices": devices, "num_nodes": 2}) is True
    assert several_processes({"devices": devices, "strategy": "ddp_spawn"}) is True


def test_a_saved_sentinel_patience_keeps_its_value_and_null_stays_off() -> None:
    """Configs saved when a large patience stood for "never" load with that number (a run
    resumed from them stops as it would have); null, today's "off", loads as None."""
    saved = config_to_dict(compose_config(["experiment=multi30k_cpu_1h_wu2021"]))
    assert saved["early_stopping_patience"] is None
    assert load_config({**saved, "early_stopping_patience": 100}).early_stopping_patience == 100
    assert load_config(saved).early_stopping_patience is None


@pytest.mark.parametrize(("patience", "expected"), [("null", None), ("3", 3), ("100", 100)])
def test_early_stopping_patience_null_builds_no_early_stopping(
    patience: str, expected: int | None, tmp_path: Path
) -> None:
    config = compose_config([f"early_stopping_patience={patience}", "trainer.accelerator=cpu"])
    trainer, _ = build_trainer(config, tmp_path, None, "32-true")
    stoppers = [c for c in trainer.callbacks if isinstance(c, EarlyStopping)]
    assert [stopper.patience for stopper in stoppers] == ([] if expected is None else [expected])
    assert all(stopper.monitor == "val/bleu" and stopper.mode == "max" for stopper in stoppers)


def test_a_config_from_before_on_malformed_loads_and_a_bad_value_is_named() -> None:
    saved = config_to_dict(compose_config(["data.on_malformed=skip"]))
    del saved["data"]["on_malformed"]
    assert load_config(saved).data.on_malformed == "error"  # what reading did before the key
    with pytest.raises(ConfigError, match="config key 'data.on_malformed': 'drop': use error"):
        compose_config(["data.on_malformed=drop"])
