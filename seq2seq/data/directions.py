"""The translation directions of a run: one (data.src_lang -> data.tgt_lang), or several for a
multilingual model (data.directions, and those of data.corpora).

A multilingual model is told which language to write by a tag in front of the source, "<2de>"
(Johnson et al. 2017), a SentencePiece control symbol: one piece in every exported vocabulary,
which no text encodes to and no decoding writes. Tags are added when a pair is served and when
a line is translated, never stored in the encoded splits: each direction's encoding is the
bilingual one, and stays cached as such.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from seq2seq.data.config import DataConfig, parse_direction
from seq2seq.errors import ConfigError


@dataclass(frozen=True)
class Direction:
    """One direction of a run, with `data`: its corpus seen as a one-direction data config
    (its splits' `{src}` and `{tgt}` read as this direction's languages)."""

    corpus: str
    src: str
    tgt: str
    data: DataConfig

    @property
    def name(self) -> str:
        return f"{self.src}-{self.tgt}"


def directions(data: DataConfig) -> list[Direction]:
    """Every direction of the run, this corpus's first, in the order the config lists them."""
    found = []
    for text in data.own_directions():
        src, tgt = parse_direction(text, "data.directions")
        view = dataclasses.replace(data, src_lang=src, tgt_lang=tgt, directions=[], corpora={})
        found.append(Direction(data.name, src, tgt, view))
    for name, corpus in data.corpora.items():
        for text in corpus.directions:
            src, tgt = parse_direction(text, f"data.corpora.{name}.directions")
            view = dataclasses.replace(
                data,
                name=name,
                src_lang=src,
                tgt_lang=tgt,
                languages=corpus.languages,
                dir=corpus.dir,
                splits=corpus.splits,
                train_split=corpus.train_split,
                val_split=corpus.val_split,
                test_sets=corpus.test_sets,
                download=corpus.download,
                verify_checksums=corpus.verify_checksums,
                directions=[],
                corpora={},
            )
            found.append(Direction(name, src, tgt, view))
    return found


def describe_data(data: DataConfig) -> str:
    """The corpus and direction ("multi30k en->de"), or a multilingual run's directions."""
    if data.multilingual:
        return "multilingual " + ", ".join(d.name for d in directions(data))
    return f"{data.name} {data.src_lang}->{data.tgt_lang}"


TAG = re.compile(r"<2[^<>\s]+>")  # a tag's piece


def tag(lang: str) -> str:
    """The piece in front of a source asking for `lang`."""
    return f"<2{lang}>"


def target_languages(data: DataConfig) -> list[str]:
    """The languages a multilingual model can be asked for (one tag each), sorted; none for a
    one-direction model, which takes no tag."""
    if not data.multilingual:
        return []
    return sorted({d.tgt for d in directions(data)})


def languages(data: DataConfig) -> list[str]:
    """Every language of the run's directions, sorted."""
    return sorted({lang for d in directions(data) for lang in (d.src, d.tgt)})


def check_target(data: DataConfig, target_lang: str | None) -> str | None:
    """The language to ask a model trained on `data` for: `target_lang` (decoding.target_lang),
    which a multilingual model needs and a one-direction model must not be given unless it is
    its own target."""
    targets = target_languages(data)
    if not targets:
        if target_lang not in (None, data.tgt_lang):
            raise ConfigError(
                f"config key 'decoding.target_lang': '{target_lang}', and this model translates "
                f"{data.src_lang}->{data.tgt_lang} only; leave decoding.target_lang unset"
            )
        return None
    if target_lang is None:
        raise ConfigError(
            "config key 'decoding.target_lang': unset, and this model writes "
            f"{', '.join(targets)}; choose one, e.g. decoding.target_lang={targets[0]}"
        )
    if target_lang not in targets:
        raise ConfigError(
            f"config key 'decoding.target_lang': '{target_lang}' is not a language this model "
            f"writes; choose one of {', '.join(targets)}"
        )
    return target_lang


def source_languages(data: DataConfig) -> list[str]:
    """The languages a model trained on `data` reads, sorted."""
    return sorted({d.src for d in directions(data)})


def zero_shot(data: DataConfig, src: str, tgt: str) -> bool:
    """Whether src->tgt was not trained, though the model read `src` and wrote `tgt` in other
    directions; a source it never read, or a target it never wrote, is refused: its score
    would say nothing about zero-shot translation."""
    sources = source_languages(data)
    if src not in sources:
        raise ConfigError(
            f"config key 'data.directions': {src}-{tgt}, and this model never read {src}: it "
            f"reads {', '.join(sources)} and writes {', '.join(target_languages(data))}; "
            "choose a direction between those"
        )
    check_target(data, tgt)
    return (src, tgt) not in {(d.src, d.tgt) for d in directions(data)}
