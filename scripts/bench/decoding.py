"""Decoding throughput: sentences/s on test sources, greedy and beam, with every hypothesis
forced to `length` tokens then EOS, so that all systems run length + 1 decoder steps a sentence.
Ours: EOS masked before that step and forced at it; Marian: min_new_tokens=length,
max_new_tokens=length + 1; CTranslate2 (bench/deployed.py): min/max_decoding_length."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from bench.measure import Isolated, Measured, interleaved
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from seq2seq.decoding.search import (
    DecoderState,
    Hypothesis,
    IncrementalDecoder,
    beam_search,
    greedy_search,
)
from seq2seq.model.transformer import Transformer

Search = Callable[[Tensor], list[list[int]]]  # source batch -> token ids per sentence
SearchFactory = Callable[[], Search]  # a search built for each timed pass (bench.measure.Isolated)


class FixedLength:
    """Our decoder with EOS masked before `length` tokens, so every hypothesis has that length
    (the search itself forces EOS at its `max_len`)."""

    def __init__(self, model: IncrementalDecoder, length: int) -> None:
        self.model, self.length = model, length
        self.pad_id, self.bos_id, self.eos_id = model.pad_id, model.bos_id, model.eos_id
        self.never_ids = model.never_ids

    def start_decoding(self, src: Tensor, beam: int = 1) -> DecoderState:
        return self.model.start_decoding(src, beam)

    def decode_step(self, state: DecoderState, tokens: Tensor) -> Tensor:
        log_probs = self.model.decode_step(state, tokens)
        if state.position <= self.length:  # this was step position - 1 < length
            log_probs[:, EOS_ID] = float("-inf")
        return log_probs


@torch.no_grad()
def greedy_without_cache(model: Transformer, src: Tensor, length: int) -> list[list[int]]:
    """Greedy search that reruns the decoder over the whole prefix at every step: what the KV
    cache saves."""
    memory, src_mask = model.encode(src)
    prefix = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long, device=src.device)
    for t in range(length + 1):
        states, _ = model.decode(prefix, memory, src_mask)  # (B, t + 1, d)
        log_probs = model.output_projection(states[:, -1]).log_softmax(dim=-1)
        log_probs[:, [PAD_ID, BOS_ID]] = float("-inf")
        if t < length:
            log_probs[:, EOS_ID] = float("-inf")
        else:
            log_probs[:, :EOS_ID] = float("-inf")
            log_probs[:, EOS_ID + 1 :] = float("-inf")
        prefix = torch.cat([prefix, log_probs.argmax(dim=-1, keepdim=True)], dim=1)
    return prefix[:, 1:-1].tolist()


def best(nbest_lists: list[list[Hypothesis]]) -> list[list[int]]:
    return [hypotheses[0].tokens for hypotheses in nbest_lists]


def our_searches(model: Transformer, length: int, beam: int, penalty: float) -> dict[str, Search]:
    """Ours, in eval mode: greedy and beam with the KV cache, and greedy without it."""
    model.eval()
    fixed = FixedLength(model, length)

    def budget(src: Tensor) -> Tensor:
        return torch.full((src.shape[0],), length, device=src.device)

    return {
        "ours greedy": lambda src: best(greedy_search(fixed, src, budget(src))),
        "ours greedy, no cache": lambda src: greedy_without_cache(model, src, length),
        f"ours beam {beam}": lambda src: best(beam_search(fixed, src, budget(src), beam, penalty)),
    }


def marian_searches(marian: nn.Module, length: int, beam: int, penalty: float) -> dict[str, Search]:
    """Marian's `generate`, in eval mode, greedy and beam."""
    marian.eval()

    def generate(src: Tensor, beams: int) -> list[list[int]]:
        return marian.generate(
            input_ids=src,
            attention_mask=src != PAD_ID,
            num_beams=beams,
            length_penalty=penalty,
            min_new_tokens=length,
            max_new_tokens=length + 1,
            do_sample=False,
        ).tolist()

    return {
        "marian greedy": lambda src: generate(src, 1),
        f"marian beam {beam}": lambda src: generate(src, beam),
    }


def decoding_pass(search: Search, sources: list[Tensor]) -> Callable[[], float]:
    """One repetition: every source batch; its work is the sentences decoded."""

    def run() -> float:
        for src in sources:
            search(src)
        return float(sum(s.shape[0] for s in sources))

    return run


def time_decoding(
    searches: dict[str, Search],
    deployed: dict[str, SearchFactory],
    sources: list[Tensor],
    reps: int,
    device: torch.device,
) -> dict[str, Measured]:
    """All searches interleaved; the `deployed` ones built for each pass, outside its time."""
    phases = {name: decoding_pass(s, sources) for name, s in searches.items()}
    for name, build in deployed.items():
        phases[name] = Isolated(lambda build=build: decoding_pass(build(), sources))
    with torch.inference_mode():
        return interleaved(phases, reps, device)


def same_greedy_rows(
    searches: dict[str, Search],
    deployed: dict[str, SearchFactory],
    tokenizer: Tokenizer,
    src: Tensor,
) -> str | None:
    """How many sentences of this batch CTranslate2 float32's greedy search decodes to our
    token ids (the same weights: all of them, up to float rounding in near-ties). Its token
    after the forced length (where ours is EOS) is not compared."""
    if "ctranslate2 float32 greedy" not in deployed:
        return None
    theirs = deployed["ctranslate2 float32 greedy"]()
    with torch.inference_mode():
        ours = searches["ours greedy"](src)
        converted = [[tokenizer.tgt.piece_to_id(p) for p in row] for row in theirs(src)]
        converted = [row[: len(mine)] for row, mine in zip(converted, ours, strict=True)]
    same = sum(a == b for a, b in zip(ours, converted, strict=True))
    return f"{same}/{len(ours)}"


def cache_equals_no_cache(searches: dict[str, Search], src: Tensor) -> bool:
    """Whether the KV cache leaves greedy search's output unchanged on this batch."""
    with torch.inference_mode():
        return searches["ours greedy"](src) == searches["ours greedy, no cache"](src)
