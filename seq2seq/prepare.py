"""`python -m seq2seq.prepare [overrides]`: data and tokenizer only, then a summary."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from seq2seq.cli import entrypoint
from seq2seq.config import RootConfig
from seq2seq.data.corpus import SplitPaths, bitext_header, malformed_lines
from seq2seq.data.datamodule import PreparedData, TranslationDataModule
from seq2seq.data.directions import describe_data
from seq2seq.decoding.search import output_len_limit
from seq2seq.training.recipe import derive


def share(count: int, total: int) -> str:
    """A count with its percentage of `total` ("12 (0.4%)"), or "0"."""
    return f"{count} ({100 * count / total:.1f}%)" if count else "0"


def length_limits(config: RootConfig, positions: int) -> str:
    """The caption under the summary: each length limit, its setting and how to raise it."""
    decoding, max_len = config.decoding, config.model.max_len
    tag = "; a source one fewer, for its target-language tag" if config.data.multilingual else ""
    return "\n".join(
        [
            f"too long: training pairs with a side over data.filter.max_len="
            f"{config.data.filter.max_len} tokens, removed; raise data.filter.max_len to keep "
            "them.",
            f"truncated: evaluation pairs with a side over the model's {positions} positions "
            f"(model.max_len={max_len}, less BOS/EOS{tag}), cut to fit; raise model.max_len.",
            f"ref > out: evaluation references longer than decoding lets an output grow, "
            f"min({decoding.max_len_a:g} x source tokens + {decoding.max_len_b}, {positions}); "
            "no translation of them is whole. Raise decoding.max_len_a or decoding.max_len_b "
            "(and model.max_len).",
        ]
    )


@dataclass(frozen=True)
class LengthCuts:
    """The pairs of an evaluation split that the model's length limits cut, each counted
    wherever it falls: `truncated`, a side longer than the model's positions (served cut to
    them); `beyond_output`, a reference longer than decoding lets an output grow (no
    translation of it can be whole)."""

    truncated: int
    beyond_output: int


def length_cuts(module: TranslationDataModule, split: str) -> LengthCuts:
    """What model.max_len and decoding's output limit (decoding.max_len_a * source tokens
    + decoding.max_len_b, within the model's positions) cut of an evaluation split."""
    src_lens, tgt_lens = module.encoded_lengths(split)
    positions, config = module.model_positions(), module.config
    src_positions = module.source_positions()
    # the source as decoded: truncated, and led by its tag in a multilingual run
    served = torch.from_numpy(np.minimum(src_lens, src_positions) + module.multilingual)
    limit = output_len_limit(
        served, config.decoding.max_len_a, config.decoding.max_len_b, config.model.max_len
    )
    return LengthCuts(
        truncated=int(((src_lens > src_positions) | (tgt_lens > positions)).sum()),
        beyond_output=int((torch.from_numpy(tgt_lens) > limit).sum()),
    )


def summary(config: RootConfig, prepared: PreparedData, module: TranslationDataModule) -> Table:
    """Per split: pairs, what the filters removed, what the length limits cut, token lengths
    (as encoded, before any truncation) and the batches of an epoch."""
    tok = prepared.tokenizer
    vocab = (
        f"{tok.src_vocab_size} joint"
        if tok.joint
        else f"{tok.src_vocab_size} src / {tok.tgt_vocab_size} tgt"
    )
    caption = length_limits(config, module.model_positions())
    for key in module.validation_keys():
        sample = module.validation_sample(key)
        if sample is not None:
            caption += (
                f"\n{key}: validation in training decodes a seeded random sample of "
                f"{len(sample)} of its pairs (data.val_subset), and the final checkpoint is "
                "chosen on them."
            )
    table = Table(
        title=f"{describe_data(config.data)}: "
        f"vocabulary {vocab} ({config.tokenizer.model_type}), "
        f"batches at data.max_tokens={config.data.max_tokens}"
        + (
            f", training lengths padded to multiples of {config.data.pad_to_multiple}"
            if config.data.pad_to_multiple > 1
            else ""
        ),
        caption=caption,
        caption_justify="left",
    )
    for column in (
        "split",
        "pairs",
        "kept",
        "empty",
        "too long",
        "bad ratio",
        "truncated",
        "ref > out",
        "src tokens mean/max",
        "tgt tokens mean/max",
        "batches",
        "shapes",
        "padding",
    ):
        # at a narrow width only the lengths' headers wrap: counts and names stay whole
        table.add_column(
            column,
            justify="left" if column == "split" else "right",
            no_wrap="tokens" not in column,
        )
    mixed = module.multilingual  # its training batches mix the directions: below the table
    for name, split in prepared.splits.items():
        training = name in module.train_keys()
        sampler = module.batch_sampler(name, shuffle=training and not mixed)
        # training: an epoch after the bidirectional ones (evaluation batches have no epoch)
        sampler.set_epoch(config.data.bidirectional_epochs)
        c = split.counts
        # training pairs are filtered to data.filter.max_len, not truncated
        cuts = None if training else length_cuts(module, name)
        src_lens, tgt_lens = module.encoded_lengths(name)
        table.add_row(
            name,
            str(c.total),
            str(c.kept),
            str(c.empty),
            share(c.too_long, c.total),
            str(c.bad_ratio),
            "-" if cuts is None else share(cuts.truncated, len(split)),
            "-" if cuts is None else share(cuts.beyond_output, len(split)),
            f"{np.mean(src_lens):.1f}/{src_lens.max()}",
            f"{np.mean(tgt_lens):.1f}/{tgt_lens.max()}",
            *(
                ("-", "-", "-")
                if training and mixed
                else (
                    str(len(sampler)),
                    str(sampler.shapes()),
                    f"{100 * sampler.padding_fraction():.1f}%",
                )
            ),
        )
    return table


MALFORMED_NAMED = 5  # the first malformed lines prepare names; the rest are counted


def reading_lines(split: SplitPaths) -> list[str]:
    """What reading a bitext left out: its header, and with data.on_malformed=skip the lines
    without exactly one tab, counted and the first few named."""
    lines = []
    header = bitext_header(split)
    if header is not None:
        fields = " | ".join(header.split("\t"))
        lines.append(f"header: {split.src}, line 1 ({fields}) names the languages: skipped")
    malformed = malformed_lines(split) if split.skip_malformed else []
    if malformed:
        named = ", ".join(f"line {n} ({tabs} tabs)" for n, tabs in malformed[:MALFORMED_NAMED])
        more = (
            f" and {len(malformed) - MALFORMED_NAMED} more"
            if len(malformed) > MALFORMED_NAMED
            else ""
        )
        lines.append(
            f"malformed: {split.src}: {len(malformed)} line{'s' * (len(malformed) > 1)} "
            "without exactly one tab skipped "
            f"(data.on_malformed=skip): {named}{more}"
        )
    return lines


def mixture_line(config: RootConfig, module: TranslationDataModule) -> str:
    """A multilingual run's training epoch: each direction's pairs in it, and its batches."""
    mixture = module.dataset(config.data.train_split, shuffle=True)
    shares = ", ".join(
        f"{key.rsplit('.', 1)[1]} {count}"
        for key, count in zip(module.train_keys(), mixture.counts, strict=True)
    )
    sampler = module.batch_sampler(config.data.train_split, shuffle=True)
    return (
        f"training epoch (data.mix_temperature={config.data.mix_temperature:g}): "
        f"{len(mixture)} pairs ({shares}), {len(sampler)} batches, {sampler.shapes()} shapes, "
        f"{100 * sampler.padding_fraction():.1f}% padding"
    )


@entrypoint(config_name="train")
def main(config: RootConfig) -> None:
    start = time.perf_counter()
    config = derive(config)  # derive_from_corpus: settings from the training split's counts
    module = TranslationDataModule(config)
    module.setup()
    prepared = module.prepared
    elapsed = time.perf_counter() - start
    console = Console()
    if not console.is_terminal:  # logs and pipes: no wrapping of the table
        console = Console(width=160)
    console.print(summary(config, prepared, module))
    if module.multilingual:
        console.print(mixture_line(config, module))
    both = config.data.bidirectional_epochs
    if both:
        sampler = module.batch_sampler(config.data.train_split, shuffle=True)  # epoch 0
        console.print(
            f"{config.data.train_split}, epochs 0-{both - 1} (data.bidirectional_epochs={both}): "
            f"the pairs as given and reversed, {len(sampler)} batches, {sampler.shapes()} shapes, "
            f"{100 * sampler.padding_fraction():.1f}% padding"
        )
    bitexts = {split.src: split for split in prepared.files.values()}  # a file once
    for split in bitexts.values():
        for line in reading_lines(split):
            console.print(line)
    built = ", ".join(prepared.built) or "nothing (all from cache)"
    console.print(f"ready in {elapsed:.2f}s; built: {built}; cache: {config.paths.cache_dir}")


if __name__ == "__main__":
    main()
