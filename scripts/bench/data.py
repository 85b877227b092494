"""What both systems see: the config, real Multi30k training batches and test sources, all
from our data module, so that neither system gets easier batches than the other."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra import compose, initialize_config_dir
from torch import Tensor

from seq2seq.config import CONF_DIR, RootConfig, validate_config
from seq2seq.data.batching import Batch, TokenBudgetBatchSampler, collate
from seq2seq.data.datamodule import prepare
from seq2seq.data.tokenizer import Tokenizer


def load_config(overrides: list[str]) -> RootConfig:
    """The training config with these overrides, as `python -m seq2seq.train` composes it."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return validate_config(compose("train", overrides))


@dataclass
class Workload:
    tokenizer: Tokenizer
    batches: list[Batch]  # the first training batches of an epoch (length-bucketed, shuffled)
    sources: list[Tensor]  # test sources sorted by length, in batches of decoding.batch_size


def load_workload(
    config: RootConfig, device: torch.device, train_batches: int, sentences: int
) -> Workload:
    """`train_batches` training batches and the first `sentences` test sources, on `device`."""
    prepared = prepare(config)
    train = prepared.splits[config.data.train_split]
    sampler = TokenBudgetBatchSampler(
        train.src_lens, train.tgt_lens, config.data.max_tokens, shuffle=True, seed=config.seed
    )
    batches = [
        collate([train[i] for i in indices]).to(device)
        for indices in sampler.batches()[:train_batches]
    ]
    test = prepared.splits[config.data.test_sets[0]]
    order = sorted(range(min(sentences, len(test))), key=lambda i: len(test[i][1]))
    size = config.decoding.batch_size
    sources = [
        collate([test[i] for i in order[start : start + size]]).src.to(device)
        for start in range(0, len(order), size)
    ]
    return Workload(prepared.tokenizer, batches, sources)
