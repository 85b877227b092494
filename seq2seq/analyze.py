"""`python -m seq2seq.analyze [ckpt_path=...] [checkpoints=[...]] [init=[standard,...]]`: the
rank-collapse probe (seq2seq.analysis.rank_collapse) of trained checkpoints and of presets of
seq2seq/conf/ablation/ at initialisation, as a table (.md, .csv) and a plot (.png).
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from seq2seq.analysis.rank_collapse import plot_ranks, probe, write_table
from seq2seq.cli import entrypoint
from seq2seq.config import CONF_DIR, AnalyzeConfig, config_to_dict, validate_config
from seq2seq.data.corpus import ensure_available, read_parallel
from seq2seq.data.datamodule import prepare
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.checkpoint import load_trained
from seq2seq.errors import ConfigError
from seq2seq.model.config import ModelConfig
from seq2seq.model.transformer import Transformer


def preset_model(config: AnalyzeConfig, preset: str) -> ModelConfig:
    """The model config with a preset of conf/ablation/ applied, as `+ablation=<preset>`."""
    path = CONF_DIR / "ablation" / f"{preset}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ConfigError(f"config key 'init': no preset '{preset}' in {path.parent}; use {names}")
    merged = OmegaConf.merge(config_to_dict(config.model), OmegaConf.load(path).get("model", {}))
    return validate_config(merged, ModelConfig)


def models(config: AnalyzeConfig) -> list[tuple[str, Transformer, Tokenizer]]:
    """(label, model, tokenizer): each checkpoint trained, then each preset at initialisation."""
    found = []
    for path in config.trained:
        trained = load_trained(Path(path))
        label = f"{trained.config.model.attention.name} trained ({Path(path).parent.parent.name})"
        found.append((label, trained.model, trained.tokenizer))
    if config.init:
        tokenizer = prepare(config).tokenizer
        for preset in config.init:
            torch.manual_seed(config.seed)
            model = Transformer.for_vocabulary(preset_model(config, preset), tokenizer)
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
