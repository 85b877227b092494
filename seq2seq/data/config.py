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
    `tsv` (source<TAB>target per line). None: not this form (also for splits added with +).
    `{src}` and `{tgt}` in a name stand for the direction's languages (train.{src}.gz)."""

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
class CorpusConfig:
    """A further corpus of a multilingual run (data.corpora.<name>): its files, as the keys of
    the same names in `data`, and the directions trained on it."""

    dir: str
    languages: list[str] | None
    directions: list[str]  # "en-nso": source-target
    splits: dict[str, SplitFiles]
    train_split: str
    val_split: str
    test_sets: list[str]
    download: DownloadConfig | None
    verify_checksums: bool


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
    on_malformed: str  # a bitext line without exactly one tab: error | skip (counted by prepare)
    max_tokens: int
    num_workers: int
    encode_processes: int  # processes that encode a corpus; 0: one per CPU core
    bpe_dropout: float  # training split segmented anew each epoch, merges dropped at this rate
    pad_to_multiple: int  # training batches' lengths padded up to a multiple of this
    bidirectional_epochs: int  # first epochs that also train on the pairs reversed (0: off)
    directions: list[str]  # several ("en-de", "en-fr"): one multilingual model; []: src-tgt
    corpora: dict[str, CorpusConfig]  # further corpora of a multilingual run
    mix_temperature: float  # training pairs drawn per direction ~ (its pairs) ** (1 / T)

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
            self.on_malformed in ("error", "skip"),
            "data.on_malformed",
            f"'{self.on_malformed}': use error (stop at the first malformed line) or skip",
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
        ends = 2 if self.multilingual else 1  # EOS, and a multilingual source's tag
        longest = -(-(self.filter.max_len + ends) // self.pad_to_multiple) * self.pad_to_multiple
        require(
            self.max_tokens >= longest,
            "data.max_tokens",
            f"{self.max_tokens} cannot hold one training pair of data.filter.max_len="
            f"{self.filter.max_len} tokens plus BOS/EOS"
            + (" and the tag" if self.multilingual else "")
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
        self.check_directions()

    @property
    def multilingual(self) -> bool:
        """Whether the run trains more than one direction (its sources then lead with a tag)."""
        return (
            len(self.own_directions()) + sum(len(c.directions) for c in self.corpora.values()) > 1
        )

    def own_directions(self) -> list[str]:
        """The directions trained on this corpus: data.directions, or src_lang-tgt_lang."""
        return list(self.directions) or [f"{self.src_lang}-{self.tgt_lang}"]

    def check_directions(self) -> None:
        """Each direction once, in languages its corpus knows; a multilingual run (more than
        one direction) without what serves one direction's pairs only."""
        require(
            self.name not in self.corpora,
            f"data.corpora.{self.name}",
            f"has the name of this corpus (data.name={self.name}); name it otherwise",
        )
        seen: dict[tuple[str, str], str] = {}
        corpora = {self.name: (self.own_directions(), self.languages, "data.directions")} | {
            name: (corpus.directions, corpus.languages, f"data.corpora.{name}.directions")
            for name, corpus in self.corpora.items()
        }
        for corpus, (directions, languages, key) in corpora.items():
            for text in directions:
                pair = parse_direction(text, key)
                for lang in pair:
                    require(
                        languages is None or lang in languages,
                        key,
                        f"'{text}': unknown language '{lang}' for {corpus}; its languages are "
                        f"{', '.join(languages or [])}",
                    )
                require(
                    pair not in seen,
                    key,
                    f"'{text}' is also a direction of {seen.get(pair)}; give each direction one "
                    "corpus (join the files of two into one)",
                )
                seen[pair] = corpus
        for name, corpus in self.corpora.items():
            require(
                bool(corpus.directions),
                f"data.corpora.{name}.directions",
                "empty; name the directions to train on this corpus, e.g. [en-de]",
            )
            for split in (corpus.train_split, corpus.val_split, *corpus.test_sets):
                require(
                    split in corpus.splits,
                    f"data.corpora.{name}",
                    f"split '{split}' is not one of its splits ({', '.join(corpus.splits)})",
                )
            for split, files in corpus.splits.items():
                files.check(split)
        require(
            self.mix_temperature > 0,
            "data.mix_temperature",
            f"must be > 0 (1: in proportion to each direction's pairs; larger: nearer equal "
            f"shares), got {self.mix_temperature}",
        )
        if self.multilingual:
            for key, value, off in (
                ("data.bidirectional_epochs", self.bidirectional_epochs, 0),
                ("data.bpe_dropout", self.bpe_dropout, 0),
                # each epoch's mixture is drawn in the training process, which workers miss
                ("data.num_workers", self.num_workers, 0),
            ):
                require(
                    value == off,
                    key,
                    f"{value} in a multilingual run (several directions), which does not offer "
                    f"it; set {key}={off}",
                )


def parse_direction(text: str, key: str) -> tuple[str, str]:
    """("en", "de") from "en-de"; anything else is refused naming `key`."""
    parts = text.split("-")
    require(
        len(parts) == 2 and all(parts) and parts[0] != parts[1],
        key,
        f"'{text}' is not a direction: write source-target with two different languages, "
        "e.g. en-de",
    )
    return parts[0], parts[1]


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
