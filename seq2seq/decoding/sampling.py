"""Sampling: `samples` draws per sentence from the model's next-token distributions, shaped by
temperature, top-k and top-p (nucleus sampling, Holtzman et al. 2020), each sentence with its
own seed.

Each (sentence, draw) row takes its random numbers from a generator of its own, seeded by the
caller's entropy for the sentence (the translator's: `decoding.seed` and the input line) and the
draw's number: the same seed and line give the same samples whatever the batch size and
whatever else is in the batch. A token is drawn by inverse CDF, the first whose cumulative
probability passes the row's uniform number, so a draw only depends on the row's own
distribution.

Scores are search's (seq2seq.decoding.search): the model's log-probabilities of the drawn
tokens and EOS (PAD and BOS renormalised away) over length**length_penalty. Temperature and
truncation shape the draws, not the scores, so a sample's score is comparable with a beam
hypothesis's. A sentence's n-best list is its draws, best score first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from seq2seq.decoding.search import (
    Hypothesis,
    IncrementalDecoder,
    never_output,
    prefix_table,
    restrict_outputs,
    strip_at_end,
)


def truncate(log_probs: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """The distribution to draw from (N, V), as probabilities: `log_probs` at `temperature`,
    then only the `top_k` most probable tokens (0: all), renormalised, then only the smallest
    set of the most probable whose probability reaches `top_p` (1.0: all), renormalised."""
    probs = (log_probs.float() / temperature).softmax(dim=-1)
    if 0 < top_k < probs.shape[-1]:
        kept = torch.zeros_like(probs, dtype=torch.bool)
        kept.scatter_(-1, probs.topk(top_k, dim=-1).indices, True)
        probs = probs.masked_fill(~kept, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if top_p < 1.0:
        ordered, order = probs.sort(dim=-1, descending=True)
        before = ordered.cumsum(dim=-1) - ordered  # probability of the more probable tokens
        kept = torch.zeros_like(probs, dtype=torch.bool)
        kept.scatter_(-1, order, before < top_p)  # the first token is always kept
        probs = probs.masked_fill(~kept, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Per row of `probs` (N, V), the token where the cumulative probability first exceeds
    the row's uniform number in [0, 1); never a token of probability 0. In float64, so a
    uniform just below 1 stays below the total."""
    cumulative = probs.double().cumsum(dim=-1)
    target = uniforms.double()[:, None] * cumulative[:, -1:]
    tokens = torch.searchsorted(cumulative, target, right=True).squeeze(1)
    last_possible = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(tokens, last_possible)


@torch.no_grad()
def sample_search(
    model: IncrementalDecoder,
    src: Tensor,
    max_len: Tensor,
    seeds: Sequence[Sequence[int]],
    samples: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    length_penalty: float = 1.0,
    prefixes: list[list[int]] | None = None,
) -> list[list[Hypothesis]]:
    """`samples` draws per sentence of `src` (B, S), best score first. `seeds[b]`: the
    entropy of sentence b's generators (one per draw, `[*seeds[b], draw]`); `max_len` (B,):
    output tokens before EOS; `prefixes`: target ids every draw starts with (forced, scored,
    and no random number is spent on them)."""
    prefix, max_len = prefix_table(prefixes, max_len)
    b, n, device = src.shape[0], samples, src.device
    if len(seeds) != b:
        raise ValueError(f"{len(seeds)} seeds for {b} sentences")
    generators = [np.random.default_rng([*seed, j]) for seed in seeds for j in range(n)]
    horizon = int(max_len.max()) + 1
    state = model.start_decoding(src, beam=n)  # rows sentence-major: b * n + j
    outputs = torch.full((b * n, horizon), model.pad_id, dtype=torch.long, device=device)
    step_scores = torch.zeros((b * n, horizon), device=device)
    never = never_output(model, device)
    row = torch.arange(b * n, device=device)  # of each row still drawing
    limit = max_len.repeat_interleave(n)
    tokens = torch.full_like(row, model.bos_id)
    for t in range(horizon):
        log_probs, remainder = restrict_outputs(
            model, model.decode_step(state, tokens), t >= limit, never
        )
        forced = torch.full_like(row, -1)
        if prefix is not None and t < prefix.shape[1]:
            forced = prefix[row // n, t]
        free = (forced < 0).nonzero().squeeze(1)  # rows past their prefix draw a token
        uniforms = torch.tensor(
            [generators[r].random() for r in row[free].tolist()],
            dtype=torch.float64,
            device=device,
        )
        tokens = forced.clone()
        tokens[free] = draw(truncate(log_probs[free], temperature, top_k, top_p), uniforms)
        outputs[row, t] = tokens
        step_scores[row, t] = log_probs.gather(1, tokens[:, None]).squeeze(1).float() - remainder
        going = tokens != model.eos_id
        if not going.all():
            if not going.any():
                break
            keep = going.nonzero().squeeze(1)
            state.reorder(keep)
            row, tokens, limit = row[keep], tokens[keep], limit[keep]
    rows = strip_at_end(model, outputs.tolist())
    scores = step_scores.sum(dim=1).tolist()
    hypotheses = [
        Hypothesis(tokens, score / (len(tokens) + 1) ** length_penalty)
        for tokens, score in zip(rows, scores, strict=True)
    ]
    return [
        sorted(hypotheses[i * n : (i + 1) * n], key=lambda h: h.score, reverse=True)
        for i in range(b)
    ]
