"""From config to batches: files, tokenizer, encoded splits, and Lightning's DataModule."""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
from torch.utils.data import DataLoader

from seq2seq.concurrency import thread_budget, usable_cpus, worker_start_method
from seq2seq.config import RootConfig
from seq2seq.data.batching import ResumableLoader, TokenBudgetBatchSampler, collate
from seq2seq.data.bidirectional import BidirectionalSplit
from seq2seq.data.config import DataConfig
from seq2seq.data.corpus import (
    NORMALIZATION_VERSION,
    SplitPaths,
    bitext_reading,
    ensure_available,
    iter_parallel,
    normalize,
    read_parallel,
    side_lines,
)
from seq2seq.data.dataset import EncodedSplit, FilterCounts, load_or_encode
from seq2seq.data.directions import Direction, directions, tag, target_languages
from seq2seq.data.mixture import MixtureSplit, TaggedSplit
from seq2seq.data.subword_sampling import BPEDropoutSplit
from seq2seq.data.tokenizer import Tokenizer, balanced_sample, load_or_train, sample_sentences
from seq2seq.data.validation_sample import SplitSample, sample_indices
from seq2seq.errors import ConfigError, DataError
from seq2seq.io import sha256_file

log = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """The tokenizer and the encoded splits, by key: a one-direction run's split names, or a
    multilingual run's `<split>.<src>-<tgt>` (split_key)."""

    tokenizer: Tokenizer
    splits: dict[str, EncodedSplit]
    files: dict[str, SplitPaths]
    built: list[str] = field(default_factory=list)  # what this call computed (not from cache)
    direction: dict[str, Direction] = field(default_factory=dict)  # of each key


def split_key(split: str, direction: Direction, multilingual: bool) -> str:
    """The key of a direction's split: its name alone in a one-direction run."""
    return f"{split}.{direction.name}" if multilingual else split


def writable_dir(path: Path, key: str) -> Path:
    """`path`, created if missing; a clear error naming `key` if it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"{key}={path}: cannot create it ({e.strerror}); use another directory"
        ) from None
    if not os.access(path, os.W_OK):
        raise ConfigError(f"{key}={path}: not writable; use a directory you can write to")
    return path


def check_training_text(train: SplitPaths) -> None:
    """Stop before tokenizer training when no training pair has text on both sides (reading
    only up to the first that has)."""
    total = 0
    for source, target in iter_parallel(train):
        if source.strip() and target.strip():
            return
        total += 1
    raise DataError(
        f"split '{train.name}' ({train}): none of its {total} pairs has text on both sides "
        "(each is empty on one side or both); nothing to train the tokenizer or the model on. "
        "Check that the files are the ones meant (data.splits.<split>.src / .tgt / .tsv)"
    )


def check_kept(split: SplitPaths, counts: FilterCounts, data: DataConfig, training: bool) -> None:
    """Stop when the filters leave fewer training pairs than data.min_train_pairs, or an
    evaluation split has no pair at all, with the counts per filter and the settings."""
    needed = data.min_train_pairs if training else 1
    if counts.kept >= needed:
        return
    limits = data.filter
    raise DataError(
        f"split '{split.name}' ({split}): {counts.kept} of {counts.total} pairs kept, fewer than "
        f"{needed}{' (data.min_train_pairs)' if training else ''}: {counts.empty} empty on one "
        f"side, {counts.too_long} longer than data.filter.max_len={limits.max_len} subword "
        f"tokens, {counts.bad_ratio} with a length ratio above data.filter.max_ratio="
        f"{limits.max_ratio:g}. Raise those limits, lower data.min_train_pairs, or check the "
        "files (one sentence per line)"
    )


def split_inputs(split: SplitPaths, digest: dict[Path, str]) -> dict[str, str]:
    """What identifies a split's text in cache keys: its files' content and how it is read."""
    return {
        "src": digest[split.src],
        "tgt": digest[split.tgt],
        "normalization": NORMALIZATION_VERSION,
        **({"format": "tsv", **bitext_reading(split)} if split.tsv else {}),
    }


def load_or_train_tokenizer(
    config: RootConfig, train: SplitPaths, digest: dict[Path, str], cache_dir: Path
) -> tuple[Tokenizer, bool]:
    """The tokenizer of the training split for config.tokenizer, cached; also says if it
    trained one."""

    def training_text(sides: tuple[str, ...]) -> list[str]:
        check_training_text(train)
        lines = itertools.chain.from_iterable(side_lines(train, side) for side in sides)
        cfg = config.tokenizer
        return [normalize(x) for x in sample_sentences(lines, cfg.input_sentence_size, cfg.seed)]

    return load_or_train(
        cache_dir, config.tokenizer, split_inputs(train, digest), training_text, str(train)
    )


def load_or_train_joint_tokenizer(
    config: RootConfig,
    trains: list[tuple[Direction, SplitPaths]],
    digest: dict[Path, str],
    cache_dir: Path,
) -> tuple[Tokenizer, bool]:
    """A multilingual run's one SentencePiece model over its languages and the tags, cached.

    Its sample is balanced (balanced_sample): each language as many sentences as the others,
    and a side that several directions share (the English of Multi30k's aligned splits)
    counted once, by its file's content."""
    sides: dict[str, dict[str, tuple[SplitPaths, str]]] = {}  # language -> side's id -> side
    for direction, train in trains:
        for lang, side in ((direction.src, "src"), (direction.tgt, "tgt")):
            path = getattr(train, side)
            identity = f"{digest[path]}:{side}" if train.tsv else digest[path]
            sides.setdefault(lang, {})[identity] = (train, side)
    cfg = config.tokenizer

    def training_text(_: tuple[str, ...]) -> list[str]:
        for _, train in trains:
            check_training_text(train)
        texts = {
            lang: [partial(side_lines, train, side) for train, side in found.values()]
            for lang, found in sorted(sides.items())
        }
        sample = balanced_sample(texts, cfg.input_sentence_size, cfg.seed)
        return [normalize(x) for x in sample]

    inputs = {
        "languages": {lang: sorted(found) for lang, found in sorted(sides.items())},
        "normalization": NORMALIZATION_VERSION,
        "sample": "balanced",
    }
    where = "the training splits of " + ", ".join(d.name for d, _ in trains)
    tags = [tag(lang) for lang in target_languages(config.data)]
    return load_or_train(cache_dir, cfg, inputs, training_text, where, tags)


def load_or_train_run_tokenizer(
    config: RootConfig,
    trains: list[tuple[Direction, SplitPaths]],
    digest: dict[Path, str],
    cache_dir: Path,
) -> tuple[Tokenizer, bool]:
    """The run's tokenizer from its directions' training splits: the joint one of a multilingual
    run, or the one direction's; also says if it trained one."""
    if config.data.multilingual:
        return load_or_train_joint_tokenizer(config, trains, digest, cache_dir)
    ((_, train),) = trains
    return load_or_train_tokenizer(config, train, digest, cache_dir)


def prepare(config: RootConfig) -> PreparedData:
    """Make the data ready: fetch files, train or load the tokenizer, encode or load splits,
    for each direction of the run.

    Idempotent: a second call with the same files and settings only reads caches.
    """
    data = config.data
    cache_dir = writable_dir(Path(config.paths.cache_dir), "paths.cache_dir")
    runs, multilingual = directions(data), data.multilingual
    files: dict[str, SplitPaths] = {}
    owner: dict[str, Direction] = {}
    for direction in runs:
        view = direction.data
        names = list(dict.fromkeys([view.train_split, view.val_split, *view.test_sets]))
        for split in ensure_available(view, names):
            key = split_key(split.name, direction, multilingual)
            files[key], owner[key] = split, direction
    digest = {p: sha256_file(p) for s in files.values() for p in s.files}
    built = []
    trains = [key for key, d in owner.items() if files[key].name == d.data.train_split]
    pairs = [(owner[key], files[key]) for key in trains]
    tokenizer, trained = load_or_train_run_tokenizer(config, pairs, digest, cache_dir)
    if trained:
        built.append("tokenizer")
    processes = min(data.encode_processes or usable_cpus(), thread_budget(config.threads))
    splits = {}
    for key, split in files.items():
        view = owner[key].data
        training = key in trains
        splits[key], encoded = load_or_encode(
            cache_dir,
            f"{view.name}-{split.name}-{view.src_lang}-{view.tgt_lang}",
            split_inputs(split, digest),
            tokenizer,
            data.filter if training else None,
            lambda split=split: iter_parallel(split),
            processes,
        )
        if encoded:
            built.append(key)
        check_kept(split, splits[key].counts, view, training)
        counts = splits[key].counts
        log.info(
            "%s: %d pairs kept of %d (filtered: %d empty, %d longer than %d tokens, "
            "%d with length ratio > %.1f)",
            key,
            counts.kept,
            counts.total,
            counts.empty,
            counts.too_long,
            data.filter.max_len,
            counts.bad_ratio,
            data.filter.max_ratio,
        )
    return PreparedData(tokenizer, splits, files, built, owner)


class TranslationDataModule(pl.LightningDataModule):
    """Token-budget batches of the training and validation splits. `run_dir`: the training
    run's directory, where BPE-dropout keeps each epoch's segmentation for a resume."""

    def __init__(self, config: RootConfig, run_dir: Path | None = None) -> None:
        super().__init__()
        self.config = config
        self.run_dir = run_dir  # where each epoch's BPE-dropout draw is kept for a resume
        self.prepared: PreparedData | None = None
        self._raw: dict[str, tuple[list[str], list[str]]] = {}
        self._bpe_dropout: BPEDropoutSplit | None = None
        self._bidirectional: BidirectionalSplit | None = None
        self._mixture: MixtureSplit | None = None
        self.directions = directions(config.data)
        self.multilingual = config.data.multilingual  # sources then lead with a tag

    def prepare_data(self) -> None:
        # Lightning runs this in one process per node: downloads, training, writing caches.
        if self.prepared is None:
            self.prepared = prepare(self.config)

    def setup(self, stage: str | None = None) -> None:
        if self.prepared is None:  # the other processes: everything comes from the caches
            self.prepared = prepare(self.config)
        self._fit_model_length()

    def _fit_model_length(self) -> None:
        """Evaluation splits are not filtered: a pair longer than the model's positions is
        truncated with a warning, or stops the run (decoding.long_inputs=error)."""
        assert self.prepared is not None
        limit = self.source_positions()
        for name, split in self.prepared.splits.items():
            too_long = split.longer_than(limit)
            if split.max_len is not None or not len(too_long):
                continue
            files, first = self.prepared.files[name], int(too_long[0])
            where = f"{files}, line {int(split.line[first]) + 1}"
            tokens = max(int(split.src_lens[first]), int(split.tgt_lens[first]))
            if self.config.decoding.long_inputs == "error":
                raise DataError(
                    f"{where}: {tokens} tokens, more than the model's {limit} "
                    f"(model.max_len - 1{', less the tag' if self.multilingual else ''});"
                    " shorten or remove that pair, or set decoding.long_inputs=truncate"
                )
            log.warning(
                "%s: %d pairs longer than the model's %d tokens are truncated (first: %s)",
                name,
                len(too_long),
                limit,
                where,
            )
            split.truncate(limit)

    def train_keys(self) -> list[str]:
        """The training splits: data.train_split, or each direction's."""
        return [split_key(d.data.train_split, d, self.multilingual) for d in self.directions]

    def validation_keys(self) -> list[str]:
        """The splits validation decodes: data.val_split, or each direction's."""
        return [split_key(d.data.val_split, d, self.multilingual) for d in self.directions]

    def test_keys(self) -> list[str]:
        """The splits of data.test_sets (each direction's: its corpus's test sets)."""
        return [
            split_key(name, d, self.multilingual)
            for d in self.directions
            for name in d.data.test_sets
        ]

    def tag_id(self, key: str) -> int:
        """The id of the tag leading the sources of split `key` (a multilingual run's)."""
        return self.tokenizer.piece_id(tag(self.prepared.direction[key].tgt))

    def model_positions(self) -> int:
        """Tokens a side of a pair may have: model.max_len, less one for EOS (source) or for
        BOS/EOS (target)."""
        return self.config.model.max_len - 1

    def source_positions(self) -> int:
        """Tokens a source may have: the model's positions, less the tag a multilingual run's
        sources lead with."""
        return self.model_positions() - self.multilingual

    def encoded_lengths(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Source and target tokens of the split's pairs as encoded, before an evaluation
        split is truncated to the model's positions."""
        assert self.prepared is not None, "call setup() first"
        encoded = self.prepared.splits[split]
        return np.diff(encoded.src_offsets), np.diff(encoded.tgt_offsets)

    @property
    def tokenizer(self) -> Tokenizer:
        assert self.prepared is not None, "call setup() first"
        return self.prepared.tokenizer

    def raw_pairs(self, split: str) -> tuple[list[str], list[str]]:
        """Raw source and target lines of the split's pairs, in dataset order (read once)."""
        assert self.prepared is not None, "call setup() first"
        if split not in self._raw:
            sources, targets = read_parallel(self.prepared.files[split])
            kept = self.prepared.splits[split].line
            self._raw[split] = ([sources[i] for i in kept], [targets[i] for i in kept])
        return self._raw[split]

    def references(self, split: str) -> list[str]:
        """Raw target lines of the split's pairs in dataset order: what BLEU is computed on."""
        return self.raw_pairs(split)[1]

    def dataset(
        self, split: str, shuffle: bool
    ) -> EncodedSplit | BPEDropoutSplit | BidirectionalSplit | TaggedSplit | MixtureSplit:
        """What a loader of `split` serves: the cached encoding, or for training the split
        segmented anew each epoch (data.bpe_dropout > 0) or with its pairs also reversed in
        the first epochs (data.bidirectional_epochs > 0). A multilingual run's sources lead
        with their tag, and it trains on the directions' mixture (data.train_split)."""
        assert self.prepared is not None, "call setup() first"
        if self.multilingual and shuffle:
            if self._mixture is None:
                keys = self.train_keys()
                parts = [TaggedSplit(self.prepared.splits[k], self.tag_id(k)) for k in keys]
                self._mixture = MixtureSplit(
                    parts, self.config.data.mix_temperature, self.config.seed
                )
            return self._mixture
        encoded = self.prepared.splits[split]
        if self.multilingual:
            return TaggedSplit(encoded, self.tag_id(split))
        dropout = self.config.data.bpe_dropout
        if shuffle and self.config.data.bidirectional_epochs > 0:
            if self._bidirectional is None:
                self._bidirectional = BidirectionalSplit(
                    encoded, self.config.data.bidirectional_epochs
                )
            return self._bidirectional
        if not shuffle or dropout == 0:
            return encoded
        if self._bpe_dropout is None:
            sources, targets = read_parallel(self.prepared.files[split])
            self._bpe_dropout = BPEDropoutSplit(
                encoded,
                [normalize(sources[i]) for i in encoded.line],
                [normalize(targets[i]) for i in encoded.line],
                self.tokenizer,
                dropout,
                self.config.seed,
                self.config.data.filter.max_len,
                self.run_dir / "bpe_dropout" if self.run_dir is not None else None,
            )
        return self._bpe_dropout

    def validation_sample(self, name: str | None = None) -> SplitSample | None:
        """The pairs of validation split `name` (data.val_split) that validation during
        training decodes: a seeded random sample of data.val_subset (seq2seq/data/
        validation_sample.py), or None for all of them. The final checkpoint is chosen on the
        same pairs."""
        assert self.prepared is not None, "call setup() first"
        name = name or self.config.data.val_split
        count = self.config.data.val_subset
        split = self.prepared.splits[name]
        if count == 0:
            return None
        if count >= len(split):
            log.info(
                "data.val_subset=%d: '%s' has %d pairs; validation decodes all of them",
                count,
                name,
                len(split),
            )
            return None
        log.info(
            "validation decodes a seeded random sample of %d of the %d pairs of '%s' "
            "(data.val_subset)",
            count,
            len(split),
            name,
        )
        return SplitSample(self.dataset(name, False), sample_indices(len(split), count))

    def batch_sampler(
        self, split: str, shuffle: bool, sample: SplitSample | None = None
    ) -> TokenBudgetBatchSampler:
        """The training and validation batches are shared among the trainer's processes.
        `sample`: some pairs of the split, batched in place of all of them."""
        dataset = self.dataset(split, shuffle) if sample is None else sample
        if isinstance(dataset, MixtureSplit):
            src_lens, tgt_lens = dataset.lengths(0)  # drawn again for each epoch
        else:  # a tagged split's count the tag; the others', the cached encoding's
            tagged = isinstance(dataset, (TaggedSplit, SplitSample))
            lengths = dataset if tagged else self.prepared.splits[split]
            src_lens, tgt_lens = lengths.src_lens, lengths.tgt_lens
        trainer = self.trainer
        sampler = TokenBudgetBatchSampler(
            src_lens,
            tgt_lens,
            self.config.data.max_tokens,
            shuffle=shuffle,
            seed=self.config.seed,
            num_replicas=trainer.world_size if trainer else 1,
            rank=trainer.global_rank if trainer else 0,
            lengths_of_epoch=dataset.lengths
            if isinstance(dataset, (BPEDropoutSplit, BidirectionalSplit, MixtureSplit))
            else None,
            pad_to_multiple=self.pad_to_multiple(shuffle),
        )
        if trainer is not None:  # its length is then the epoch's, when Lightning asks
            sampler.set_epoch(trainer.current_epoch)
        return sampler

    def pad_to_multiple(self, shuffle: bool) -> int:
        """Training batches (shuffled) are padded to data.pad_to_multiple, for the few shapes
        of CUDA graphs; evaluation batches, which no graph runs, to their longest pair."""
        return self.config.data.pad_to_multiple if shuffle else 1

    def _loader(self, split: str, shuffle: bool, sample: SplitSample | None = None) -> DataLoader:
        loader = ResumableLoader if shuffle else DataLoader
        return loader(
            self.dataset(split, shuffle) if sample is None else sample,
            batch_sampler=self.batch_sampler(split, shuffle, sample),
            collate_fn=partial(collate, pad_to_multiple=self.pad_to_multiple(shuffle)),
            num_workers=self.config.data.num_workers,
            persistent_workers=self.config.data.num_workers > 0,
            multiprocessing_context=worker_start_method() if self.config.data.num_workers else None,
            # page-locked batches: Lightning's copy to a GPU then does not block the host
            pin_memory=self.trainer is not None
            and self.trainer.strategy.root_device.type == "cuda",
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.config.data.train_split, shuffle=True)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        loaders = [
            self._loader(key, shuffle=False, sample=self.validation_sample(key))
            for key in self.validation_keys()
        ]
        return loaders if self.multilingual else loaders[0]
