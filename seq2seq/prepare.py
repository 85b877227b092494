"""`python -m seq2seq.prepare [overrides]`: data and tokenizer only, then a summary."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.table import Table

from seq2seq.cli import entrypoint
from seq2seq.config import RootConfig
from seq2seq.data.datamodule import PreparedData, TranslationDataModule


def summary(config: RootConfig, prepared: PreparedData, module: TranslationDataModule) -> Table:
    tok = prepared.tokenizer
    vocab = (
        f"{tok.src_vocab_size} joint"
        if tok.joint
        else f"{tok.src_vocab_size} src / {tok.tgt_vocab_size} tgt"
    )
    table = Table(
        title=f"{config.data.name} {config.data.src_lang}->{config.data.tgt_lang}: "
        f"vocabulary {vocab} ({config.tokenizer.model_type}), "
        f"batches at data.max_tokens={config.data.max_tokens}"
        + (
            f", training lengths padded to multiples of {config.data.pad_to_multiple}"
            if config.data.pad_to_multiple > 1
            else ""
        )
    )
    for column in (
        "split",
        "pairs",
        "kept",
        "empty",
        "too long",
        "bad ratio",
        "src tokens mean/max",
        "tgt tokens mean/max",
        "batches",
        "shapes",
        "padding",
    ):
        table.add_column(column, justify="left" if column == "split" else "right")
    for name, split in prepared.splits.items():
        sampler = module.batch_sampler(name, shuffle=name == config.data.train_split)
        # training: an epoch after the bidirectional ones (evaluation batches have no epoch)
        sampler.set_epoch(config.data.bidirectional_epochs)
        c = split.counts
        table.add_row(
            name,
            str(c.total),
            str(c.kept),
            str(c.empty),
            str(c.too_long),
            str(c.bad_ratio),
            f"{np.mean(split.src_lens):.1f} / {split.src_lens.max()}",
            f"{np.mean(split.tgt_lens):.1f} / {split.tgt_lens.max()}",
            str(len(sampler)),
            str(sampler.shapes()),
            f"{100 * sampler.padding_fraction():.1f}%",
        )
    return table


@entrypoint(config_name="train")
def main(config: RootConfig) -> None:
    start = time.perf_counter()
    module = TranslationDataModule(config)
    module.setup()
    prepared = module.prepared
    elapsed = time.perf_counter() - start
    console = Console()
    if not console.is_terminal:  # logs and pipes: no wrapping of the table
        console = Console(width=160)
    console.print(summary(config, prepared, module))
    both = config.data.bidirectional_epochs
    if both:
        sampler = module.batch_sampler(config.data.train_split, shuffle=True)  # epoch 0
        console.print(
            f"{config.data.train_split}, epochs 0-{both - 1} (data.bidirectional_epochs={both}): "
            f"the pairs as given and reversed, {len(sampler)} batches, {sampler.shapes()} shapes, "
            f"{100 * sampler.padding_fraction():.1f}% padding"
        )
    built = ", ".join(prepared.built) or "nothing (all from cache)"
    console.print(f"ready in {elapsed:.2f}s; built: {built}; cache: {config.paths.cache_dir}")


if __name__ == "__main__":
    main()
