"""Schema of the `decoding` config group (conf/decoding/): how a checkpoint translates, for
every command that decodes (train's validation, evaluate, translate, visualize, serve).
"""

from __future__ import annotations

from dataclasses import dataclass

from seq2seq.errors import require


@dataclass
class DecodingConfig:
    search: str  # beam (beam_size 1: greedy) | sample
    beam_size: int
    length_penalty: float
    nbest: int  # hypotheses per sentence, best first: the best of the beam, or samples drawn
    max_len_a: float  # output tokens before EOS <= max_len_a * source tokens + max_len_b
    max_len_b: int
    batch_size: int  # sentences per decoding batch
    long_inputs: str  # longer than the model's positions: truncate (warn) | error
    temperature: float  # search=sample: the distribution's temperature
    top_k: int  # search=sample: draw among the k most probable tokens only (0: all)
    top_p: float  # search=sample: among the most probable tokens reaching p (1.0: all)
    seed: int  # search=sample: a sentence's draws come from (seed, its input line number)
    target_lang: str | None  # a multilingual model: the language to write (None: one-direction)

    def check(self) -> None:
        require(
            self.search in ("beam", "sample"),
            "decoding.search",
            f"'{self.search}': use beam or sample (decoding=beam, greedy or sample)",
        )
        require(self.beam_size >= 1, "decoding.beam_size", f"must be >= 1, got {self.beam_size}")
        require(
            1 <= self.nbest <= self.beam_size or (self.search == "sample" and self.nbest >= 1),
            "decoding.nbest",
            f"{self.nbest} hypotheses from a beam of {self.beam_size}: use 1 <= nbest <= "
            "beam_size (raise decoding.beam_size for more)",
        )
        require(
            self.temperature > 0, "decoding.temperature", f"must be > 0, got {self.temperature}"
        )
        require(self.top_k >= 0, "decoding.top_k", f"must be >= 0 (0: no limit), got {self.top_k}")
        require(
            0 < self.top_p <= 1,
            "decoding.top_p",
            f"must be in (0, 1] (1: no limit), got {self.top_p}",
        )
        require(
            self.long_inputs in ("truncate", "error"),
            "decoding.long_inputs",
            f"'{self.long_inputs}': use truncate or error",
        )
        require(self.batch_size >= 1, "decoding.batch_size", "must be >= 1")
        require(
            self.max_len_a >= 0 and self.max_len_b >= 1,
            "decoding.max_len_a",
            "max_len_a must be >= 0 and max_len_b >= 1",
        )
