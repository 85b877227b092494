"""What a request to POST /translate may hold, checked before anything is decoded: unknown
keys, wrong types and sizes over the server's limits are refused with a message that names
the field."""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seq2seq.decoding.config import DecodingConfig
from seq2seq.errors import ConfigError
from seq2seq.serving.config import ServeLimits


class DecodingOptions(BaseModel):
    """The decoding a request asks for; what it leaves out is the server's (decoding.*)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    search: Literal["beam", "sample"] | None = None
    beam_size: int | None = None
    nbest: int | None = None
    length_penalty: float | None = None
    max_len_a: float | None = None
    max_len_b: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    target_lang: str | None = None  # a multilingual model: the language to write

    def applied_to(self, decoding: DecodingConfig) -> DecodingConfig:
        """The server's decoding with these options; a bad combination is refused by the same
        check as decoding=... on the command line."""
        chosen = dataclasses.replace(decoding, **self.model_dump(exclude_none=True))
        chosen.check()
        return chosen


class TranslateRequest(BaseModel):
    """`sentences`, and per sentence (lists aligned with it) a prefix and phrases."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sentences: list[str] = Field(min_length=1)
    decoding: DecodingOptions = DecodingOptions()
    prefixes: list[str] | None = None  # text each translation starts with ("" for none)
    constraints: list[list[str]] | None = None  # phrases each translation contains
    attention: bool = False  # every site's weights for each sentence's best translation

    def check(self, limits: ServeLimits) -> None:
        """What the limits and alignment refuse, as a ConfigError naming the field."""
        count = len(self.sentences)
        if count > limits.sentences:
            raise ConfigError(
                f"sentences: {count} in one request, the server takes at most "
                f"{limits.sentences} (limits.sentences): send them in several requests"
            )
        for field in ("prefixes", "constraints"):
            aligned = getattr(self, field)
            if aligned is not None and len(aligned) != count:
                raise ConfigError(
                    f"{field}: {len(aligned)} for {count} sentences; give one per sentence "
                    f"({'an empty string' if field == 'prefixes' else 'an empty list'} for none)"
                )
        texts = [("sentences", i, s) for i, s in enumerate(self.sentences)]
        texts += [("prefixes", i, p) for i, p in enumerate(self.prefixes or [])]
        texts += [
            ("constraints", i, phrase)
            for i, phrases in enumerate(self.constraints or [])
            for phrase in phrases
        ]
        for field, index, text in texts:
            if len(text) > limits.characters:
                raise ConfigError(
                    f"{field}[{index}]: {len(text)} characters, the server takes at most "
                    f"{limits.characters} (limits.characters): split the sentence"
                )
        for index, phrases in enumerate(self.constraints or []):
            if any(not phrase.strip() for phrase in phrases):
                raise ConfigError(
                    f"constraints[{index}]: an empty phrase; every phrase needs a word"
                )


def validation_message(error: ValidationError) -> str:
    """Pydantic's errors as one line per field: where, and what to fix."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "body"
        if item["type"] == "extra_forbidden":
            model = DecodingOptions if item["loc"][0] == "decoding" else TranslateRequest
            options = ", ".join(model.model_fields)
            lines.append(f"{where}: unknown option; the options are {options}")
        else:
            lines.append(f"{where}: {item['msg']}")
    return "; ".join(lines)
