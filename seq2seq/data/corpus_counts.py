"""Counts of a split's raw text (pairs, words, characters, word types per side), taken before
any tokenizer exists: what the corpus-derived recipe (seq2seq/training/recipe.py) sizes the
vocabulary from. Words are whitespace-separated tokens of the normalised line. Cached beside
the tokenizers, keyed by the files' content.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from seq2seq.data.corpus import (
    NORMALIZATION_VERSION,
    SplitPaths,
    bitext_reading,
    iter_parallel,
    normalize,
)
from seq2seq.io import atomic_path

COUNTS_VERSION = 1  # bumped when what is counted changes, so that old caches are not reused


@dataclass(frozen=True)
class SideCounts:
    """One side (source or target) of a split."""

    words: int
    characters: int  # of the normalised lines, spaces included
    types: int  # distinct words
    longest_words: int  # words in the longest line


@dataclass(frozen=True)
class CorpusCounts:
    pairs: int  # lines, empty ones included
    src: SideCounts
    tgt: SideCounts

    @property
    def words(self) -> int:
        """Words on both sides: the amount of text a model learns from."""
        return self.src.words + self.tgt.words

    def describe(self) -> str:
        return (
            f"{self.pairs:,} pairs; source {self.src.words:,} words ({self.src.types:,} types, "
            f"longest line {self.src.longest_words}), target {self.tgt.words:,} words "
            f"({self.tgt.types:,} types, longest line {self.tgt.longest_words})"
        )

    @classmethod
    def from_dict(cls, saved: dict) -> CorpusCounts:
        return cls(saved["pairs"], SideCounts(**saved["src"]), SideCounts(**saved["tgt"]))


def count_split(split: SplitPaths) -> CorpusCounts:
    """One pass over the split's pairs."""
    pairs = 0
    words, characters, longest = [0, 0], [0, 0], [0, 0]
    types: tuple[set[str], set[str]] = (set(), set())
    for pair in iter_parallel(split):
        pairs += 1
        for side, line in enumerate(pair):
            text = normalize(line)
            tokens = text.split()
            words[side] += len(tokens)
            characters[side] += len(text)
            longest[side] = max(longest[side], len(tokens))
            types[side].update(tokens)
    src, tgt = (SideCounts(words[i], characters[i], len(types[i]), longest[i]) for i in (0, 1))
    return CorpusCounts(pairs, src, tgt)


def load_or_count(cache_dir: Path, split: SplitPaths, digests: dict[Path, str]) -> CorpusCounts:
    """The split's counts from the cache, or counted and cached; `digests`: sha256 per file."""
    reading = [f"{k}={int(v)}" for k, v in bitext_reading(split).items()] if split.tsv else []
    key = "-".join([*(digests[path][:16] for path in split.files), NORMALIZATION_VERSION, *reading])
    path = cache_dir / "counts" / f"{key}-{'tsv' if split.tsv else 'pair'}-v{COUNTS_VERSION}.json"
    if path.is_file():
        return CorpusCounts.from_dict(json.loads(path.read_text()))
    counts = count_split(split)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(asdict(counts)) + "\n")
    return counts
