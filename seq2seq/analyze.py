"""`python -m seq2seq.analyze [ckpt_path=...] [checkpoints=[...]] [init=[standard,...]]`: the
rank-collapse probe (seq2seq.analysis.rank_collapse) of trained checkpoints and of presets of
seq2seq/conf/ablation/ (or ablation/ of a `--config-dir`) at initialisation, as a table (.md,
.csv) and a plot (.png).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from seq2seq.analysis.rank_collapse import plot_ranks, probe, write_table
from seq2seq.cli import entrypoint
from seq2seq.config import CONF_DIR, RootConfig, validate_config
from seq2seq.data.corpus import ensure_available, read_parallel
from seq2seq.data.datamodule import prepare
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.checkpoint import load_trained
from seq2seq.decoding.model_path import resolve_model
from seq2seq.errors import ConfigError, require
from seq2seq.model.config import ModelConfig
from seq2seq.model.transformer import Transformer


@dataclass
class AnalyzeConfig(RootConfig):
    """What `analyze` reads (conf/analyze.yaml): train's config (the data, and the model and
    tokenizer of the models at initialisation) and what to probe."""

    checkpoints: list[str]  # trained models, after ckpt_path
    init: list[str]  # presets of ablation/ (shipped or in a --config-dir), probed at init
    split: str
    sentences: int
    output: str  # <output>.md, .csv and .png

    @property
    def trained(self) -> list[str]:
        """`ckpt_path` (one checkpoint, as in evaluate and translate), then `checkpoints`."""
        return [self.ckpt_path, *self.checkpoints] if self.ckpt_path else list(self.checkpoints)

    def check(self) -> None:
        super().check()
        require(
            bool(self.trained or self.init),
            "checkpoints",
            "nothing to probe: give ckpt_path=<run>/checkpoints/best.ckpt, "
            "checkpoints=[<a>.ckpt,<b>.ckpt] and/or init=[standard,attention_only]",
        )
        require(
            self.split in self.data.splits,
            "split",
            f"'{self.split}' is not one of data.splits ({', '.join(self.data.splits)})",
        )
        require(self.sentences >= 1, "sentences", f"must be >= 1, got {self.sentences}")


def preset_model(preset: str) -> ModelConfig:
    """This command's model config with `+ablation=<preset>` in its overrides (in place of
    one given there), composed by Hydra as train composes it: a preset in a `--config-dir` is
    found as the shipped ones are."""
    presets = GlobalHydra.instance().config_loader().get_group_options("ablation")
    if preset not in presets:
        raise ConfigError(
            f"config key 'init': no preset '{preset}' in ablation/ of {CONF_DIR} or a "
            f"--config-dir; use {', '.join(presets)}"
        )
    command = HydraConfig.get()
    overrides = [
        override
        for override in command.overrides.task
        if override.lstrip("+~").partition("=")[0] != "ablation"
    ]
    composed = compose(command.job.config_name, [*overrides, f"+ablation={preset}"])
    return validate_config(composed, AnalyzeConfig).model


def models(config: AnalyzeConfig) -> list[tuple[str, Transformer, Tokenizer]]:
    """(label, model, tokenizer): each checkpoint trained, then each preset at initialisation."""
    found = []
    for path in config.trained:
        path = resolve_model(path)
        trained = load_trained(path)
        label = f"{trained.config.model.attention.name} trained ({path.parent.parent.name})"
        found.append((label, trained.model, trained.tokenizer))
    if config.init:
        presets = [(preset, preset_model(preset)) for preset in config.init]  # before the data
        tokenizer = prepare(config).tokenizer
        for preset, model_config in presets:
            torch.manual_seed(config.seed)
            model = Transformer.for_vocabulary(model_config, tokenizer)
            found.append((f"{preset} at init", model, tokenizer))
    return found


@entrypoint(config_name="analyze", schema=AnalyzeConfig)
def main(config: AnalyzeConfig) -> None:
    (split,) = ensure_available(config.data, [config.split])
    sources, targets = read_parallel(split)
    sources, targets = sources[: config.sentences], targets[: config.sentences]
    rows = [
        row
        for label, model, tokenizer in models(config)
        for row in probe(label, model, tokenizer, sources, targets)
    ]
    output = Path(config.output)
    write_table(rows, output)
    plot_ranks(rows, f"{config.data.name} {config.split}, {len(sources)} sentences", output)
    print(output.with_suffix(".md").read_text(), end="")
    print(f"written: {output.with_suffix('.md')}, .csv, .png")


if __name__ == "__main__":
    main()
