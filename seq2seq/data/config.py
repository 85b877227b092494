"""Schemas of the data pipeline's config groups, `paths`, `data` and `tokenizer` (conf/paths/,
conf/data/, conf/tokenizer/): their keys, types and the checks within each group. They live
beside the code they configure; checks across groups are RootConfig's (seq2seq/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from seq2seq.errors import require


@dataclass
class PathsConfig:
    """Where datasets and the tokenizer models and encoded arrays built from them live."""

    data_dir: str
    cache_dir: str


@dataclass
class SplitFiles:
    """Two files, line i of `src` translating line i of `tgt`, or one tab-separated bitext
    `tsv` (source<TAB>target per line). None: not this form (also for splits added with +)."""

    src: str | None = None
    tgt: str | None = None
    tsv: str | None = None

    def check(self, name: str) -> None:
        two_files = self.src is not None and self.tgt is not None
        require(
            two_files != (self.tsv is not None) and (self.src is None) == (self.tgt is None),
            f"data.splits.{name}",
            f"name either two files (data.splits.{name}.src=train.en "
            f"data.splits.{name}.tgt=train.de) or one tab-separated file "
            f"(data.splits.{name}.tsv=train.tsv), not both; got src={self.src} tgt={self.tgt} "
            f"tsv={self.tsv}",
        )


@dataclass
class DownloadConfig:
    url: str  # pattern with {file}
    sha256: dict[str, str]


@dataclass
class FilterConfig:
    """Limits for training pairs, in subword tokens; evaluation sets are never filtered."""

    max_len: int
    max_ratio: float
    ratio_min_len: int  # pairs shorter than this on both sides skip the ratio test

    def check(self) -> None:
        require(self.max_len >= 1, "data.filter.max_len", f"must be >= 1, got {self.max_len}")
        require(
            self.max_ratio >= 1.0, "data.filter.max_ratio", f"must be >= 1, got {self.max_ratio}"
        )


@dataclass
class DataConfig:
    name: str
    src_lang: str
    tgt_lang: str
    languages: list[str] | None  # allowed languages; None: any label
    dir: str
    splits: dict[str, SplitFiles]
    train_split: str
    val_split: str
    val_subset: int  # validation in training decodes a seeded sample of this many; 0: all
    test_sets: list[str]
    download: DownloadConfig | None
    verify_checksums: bool
    filter: FilterConfig
    min_train_pairs: int  # fewer training pairs left by the filters stop prepare
    max_tokens: int
    num_workers: int
    encode_processes: int  # processes that encode a corpus; 0: one per CPU core
    bpe_dropout: float  # training split segmented anew each epoch, merges dropped at this rate
    pad_to_multiple: int  # training batches' lengths padded up to a multiple of this
    bidirectional_epochs: int  # first epochs that also train on the pairs reversed (0: off)

    def check(self) -> None:
        if self.languages is not None:
            for key, lang in (("data.src_lang", self.src_lang), ("data.tgt_lang", self.tgt_lang)):
                require(
                    lang in self.languages,
                    key,
                    f"unknown language '{lang}' for {self.name}; choose one of "
                    f"{', '.join(self.languages)} (e.g. data.src_lang=en data.tgt_lang=de)",
                )
        require(
            self.src_lang != self.tgt_lang,
            "data.tgt_lang",
            f"source and target are both '{self.src_lang}'; pick two different languages",
        )
        for key, split in [
            ("data.train_split", self.train_split),
            ("data.val_split", self.val_split),
        ]:
            require(
                split in self.splits,
                key,
                f"'{split}' is not one of data.splits ({', '.join(self.splits) or 'none'})",
            )
        for name in self.test_sets:
            require(
                name in self.splits,
                "data.test_sets",
                f"'{name}' is not one of data.splits ({', '.join(self.splits) or 'none'})",
            )
        for name, files in self.splits.items():
            files.check(name)
        self.filter.check()
        require(
            self.min_train_pairs >= 1,
            "data.min_train_pairs",
            f"must be >= 1, got {self.min_train_pairs}",
        )
        require(
            self.val_subset >= 0,
            "data.val_subset",
            f"must be >= 0 (0: the whole validation split), got {self.val_subset}",
        )
        require(self.max_tokens >= 1, "data.max_tokens", f"must be >= 1, got {self.max_tokens}")
        require(
            self.pad_to_multiple >= 1,
            "data.pad_to_multiple",
            f"must be >= 1 (1: no padding beyond a batch's longest pair), got "
            f"{self.pad_to_multiple}",
        )
        longest = -(-(self.filter.max_len + 1) // self.pad_to_multiple) * self.pad_to_multiple
        require(
            self.max_tokens >= longest,
            "data.max_tokens",
            f"{self.max_tokens} cannot hold one training pair of data.filter.max_len="
            f"{self.filter.max_len} tokens plus BOS/EOS"
            + (f", padded to {longest}" if longest > self.filter.max_len + 1 else "")
            + "; raise data.max_tokens or lower the limit",
        )
        require(self.num_workers >= 0, "data.num_workers", "must be >= 0")
        require(self.encode_processes >= 0, "data.encode_processes", "must be >= 0")
        require(
            0 <= self.bpe_dropout < 1,
            "data.bpe_dropout",
            f"must be in [0, 1) (0: off; Provilkov et al. use 0.1), got {self.bpe_dropout}",
        )
        require(
            self.bidirectional_epochs >= 0,
            "data.bidirectional_epochs",
            f"must be >= 0 (0: off), got {self.bidirectional_epochs}",
        )
        require(
            self.bpe_dropout == 0 or self.num_workers == 0,
            "data.bpe_dropout",
            "segments the training split in the training process each epoch, which loader "
            f"workers do not see (data.num_workers={self.num_workers}); set "
            "data.num_workers=0",
        )
        require(
            self.bidirectional_epochs == 0 or self.bpe_dropout == 0,
            "data.bidirectional_epochs",
            f"{self.bidirectional_epochs} with data.bpe_dropout={self.bpe_dropout}: "
            "the two are not offered together; set one of them to 0",
        )


@dataclass
class TokenizerConfig:
    model_type: str
    vocab_size: int
    joint: bool
    character_coverage: float
    byte_fallback: bool
    seed: int
    input_sentence_size: int  # train on a seeded sample of this many sentences; 0: all
    num_threads: int

    def check(self) -> None:
        require(
            self.model_type in ("bpe", "unigram"),
            "tokenizer.model_type",
            f"'{self.model_type}' is not supported; use bpe or unigram",
        )
        require(
            self.vocab_size >= 300 if self.byte_fallback else self.vocab_size >= 8,
            "tokenizer.vocab_size",
            f"{self.vocab_size} is too small"
            + (" for byte_fallback (256 byte pieces + specials)" if self.byte_fallback else ""),
        )
        require(
            0.9 <= self.character_coverage <= 1.0,
            "tokenizer.character_coverage",
            f"must be in [0.9, 1.0], got {self.character_coverage}",
        )
        require(
            self.input_sentence_size >= 0,
            "tokenizer.input_sentence_size",
            f"must be >= 0 (0: every sentence), got {self.input_sentence_size}",
        )
        require(self.num_threads >= 1, "tokenizer.num_threads", "must be >= 1")
