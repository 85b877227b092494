"""Greedy and beam search over any incremental decoder, batched over sentences.

The decoder is anything with `start_decoding(src, beam) -> state`, `decode_step(state, tokens)
-> log-probs (N, V)` (which search may change in place), `state.reorder(index)` and its special
token ids (`pad_id`, `bos_id`, `eos_id`, the tokenizer's): the Transformer, or a hand-built
model in tests. Only the loop over time steps is Python; sentences and beams are tensor
dimensions. A sentence that is done leaves the batch (`reorder` with fewer rows), as in fairseq,
so the last steps of a batch cost only what its unfinished sentences need.

Both return n-best lists, best first, of `Hypothesis(tokens, score)`: the score is the sum of
the log-probabilities of the tokens and EOS over length**length_penalty, the length counting
EOS. PAD, BOS and a multilingual model's tags are never output (`never_ids`), and each step's
distribution is renormalised over the tokens that can be: the log-probabilities of the
distribution the search draws from, as CTranslate2 computes them for its suppressed tokens, so
that an exported model gives the same hypotheses and scores (docs/deploy.md).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor


class DecoderState(Protocol):
    def reorder(self, index: Tensor) -> None: ...


class IncrementalDecoder(Protocol):
    pad_id: int
    bos_id: int
    eos_id: int
    never_ids: tuple[int, ...]  # never output: PAD, BOS and a multilingual model's tags

    def start_decoding(self, src: Tensor, beam: int = 1) -> DecoderState: ...

    def decode_step(self, state: DecoderState, tokens: Tensor) -> Tensor: ...


class Hypothesis(NamedTuple):
    tokens: list[int]  # without BOS and EOS
    score: float  # log-probability with EOS / (tokens + 1) ** length_penalty


def max_output_len(src: Tensor, a: float, b: int, limit: int, pad_id: int) -> Tensor:
    """Per-sentence budget of output tokens before EOS (output_len_limit) of a batch. `src`
    (B, S) holds source ids with EOS, padded with `pad_id`."""
    return output_len_limit((src != pad_id).sum(dim=1) - 1, a, b, limit)  # without EOS


def output_len_limit(src_len: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Output tokens before EOS allowed for sources of `src_len` tokens (without EOS): a *
    source tokens + b, within the model's `limit` positions (less one for BOS)."""
    return (a * src_len + b).long().clamp(max=limit - 1)


# the probability left to the other tokens when PAD and BOS take (almost) all: a model that
# broken gets finite scores, not infinite ones
LEAST_REMAINDER = 1e-6


def restrict_outputs(
    model: IncrementalDecoder, log_probs: Tensor, at_limit: Tensor, never: Tensor
) -> tuple[Tensor, Tensor]:
    """PAD, BOS and tags (the ids `never`) are never output; rows at their length limit
    (`at_limit`) may only end. Returns the masked log-probs and, per row, log(1 - P(never)):
    subtracted from a row's log-probs, it renormalises them over the tokens that can be output
    (a constant per row, so it goes to the scores, not over the (N, V) table). In place: the
    (N, V) copy a masked_fill makes was a fifth of a beam search step (AMD EPYC; bf16 units:
    avx512_bf16)."""
    excluded = log_probs.index_select(-1, never).float().exp().sum(dim=-1)
    remainder = (1 - excluded).clamp_(min=LEAST_REMAINDER).log_()
    log_probs.index_fill_(-1, never, float("-inf"))
    if at_limit.any():
        eos = log_probs[..., model.eos_id].clone()
        log_probs[at_limit] = float("-inf")
        log_probs[..., model.eos_id] = eos
    return log_probs, remainder


def never_output(model: IncrementalDecoder, device: torch.device) -> Tensor:
    return torch.tensor(model.never_ids, device=device)


def strip_at_end(model: IncrementalDecoder, rows: list[list[int]]) -> list[list[int]]:
    """Token rows cut at the first EOS or PAD."""
    ends = (model.eos_id, model.pad_id)
    out = []
    for row in rows:
        end = next((i for i, tok in enumerate(row) if tok in ends), len(row))
        out.append(row[:end])
    return out


def prefix_table(prefixes: list[list[int]] | None, max_len: Tensor) -> tuple[Tensor | None, Tensor]:
    """Forced target prefixes as a (B, L) table padded with -1 (None when no sentence has
    one), and `max_len` raised to each prefix's length: the limit counts the prefix, and a
    prefix longer than it is still output whole."""
    if not prefixes or not any(prefixes):
        return None, max_len
    table = torch.full((len(prefixes), max(map(len, prefixes))), -1, dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        table[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
    table = table.to(max_len.device)
    return table, torch.maximum(max_len, (table >= 0).sum(dim=1))


def force_prefix(
    log_probs: Tensor, remainder: Tensor, table: Tensor | None, rows: Tensor, t: int
) -> Tensor:
    """Rows whose sentence (`rows` (N,): rows of `table`) has a prefix token at step `t` may
    only output it. Its score (log-probability over the tokens that can be output) is returned
    per row (N,; 0 where nothing is forced) and left out of the search: the forced token's
    log-probability and the row's `remainder` (N,) become 0, so that hypotheses rank by their
    continuation, as CTranslate2's target_prefix does. In place on `log_probs` (N, V) and
    `remainder`."""
    forced_scores = torch.zeros_like(remainder)
    if table is None or t >= table.shape[1]:
        return forced_scores
    forced = table[rows, t]
    constrained = (forced >= 0).nonzero().squeeze(1)
    if len(constrained):
        tokens = forced[constrained]
        forced_scores[constrained] = log_probs[constrained, tokens].float() - remainder[constrained]
        log_probs[constrained] = float("-inf")
        log_probs[constrained, tokens] = 0.0
        remainder[constrained] = 0.0
    return forced_scores


@torch.no_grad()
def greedy_search(
    model: IncrementalDecoder,
    src: Tensor,
    max_len: Tensor,
    length_penalty: float = 1.0,
    prefixes: list[list[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Most probable next token at each step (one hypothesis per sentence). `max_len` (B,):
    output tokens before EOS; `length_penalty` only scales the reported scores; `prefixes`:
    target ids each sentence's output must start with (forced, and scored)."""
    prefix, max_len = prefix_table(prefixes, max_len)
    horizon = int(max_len.max()) + 1
    state = model.start_decoding(src, beam=1)
    outputs = torch.full((src.shape[0], horizon), model.pad_id, dtype=torch.long, device=src.device)
    step_scores = torch.zeros((src.shape[0], horizon), device=src.device)
    never = never_output(model, src.device)
    sentence = torch.arange(src.shape[0], device=src.device)  # of each row still decoding
    tokens = torch.full_like(sentence, model.bos_id)
    for t in range(horizon):
        log_probs, remainder = restrict_outputs(
            model, model.decode_step(state, tokens), t >= max_len, never
        )
        forced = force_prefix(log_probs, remainder, prefix, sentence, t)
        best, tokens = log_probs.max(dim=-1)
        outputs[sentence, t] = tokens
        step_scores[sentence, t] = best.float() - remainder + forced
        going = tokens != model.eos_id
        if not going.all():
            if not going.any():
                break
            rows = going.nonzero().squeeze(1)
            state.reorder(rows)
            sentence, tokens, max_len = sentence[rows], tokens[rows], max_len[rows]
    rows = strip_at_end(model, outputs.tolist())
    return [
        [Hypothesis(row, score / (len(row) + 1) ** length_penalty)]
        for row, score in zip(rows, step_scores.sum(dim=1).tolist(), strict=True)
    ]


@torch.no_grad()
def beam_search(
    model: IncrementalDecoder,
    src: Tensor,
    max_len: Tensor,
    beam: int,
    length_penalty: float = 1.0,
    nbest: int = 1,
    prefixes: list[list[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search; the `nbest` (<= beam) best finished hypotheses by score, best first.
    `prefixes`: target ids each sentence's hypotheses must start with. As with CTranslate2's
    target_prefix, hypotheses rank by their continuation's log-probability (over the whole
    length), only the best candidate may end right after the prefix, and the other beams
    that would have ended there stay empty for that step; the reported scores add the
    prefix's log-probability (so they are the model's score of the whole output).

    As in fairseq and CTranslate2: a hypothesis ends when an EOS candidate ranks among the top
    `beam` of the 2 x beam candidates of a step, and a sentence is done once it has `beam`
    finished hypotheses or reaches `max_len`. Without length penalty, scores only fall as a
    hypothesis grows, so (as CTranslate2 does) a sentence is done as soon as the best candidate
    of a step is an EOS and `nbest` have finished. With beam 1 this is exactly greedy search.
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest={nbest} must be between 1 and the beam size {beam}")
    b, k, device = src.shape[0], beam, src.device
    prefix, max_len = prefix_table(prefixes, max_len)
    state = model.start_decoding(src, beam=k)
    inf = float("-inf")
    horizon = int(max_len.max()) + 1
    result_score = torch.full((b, k), inf, device=device)
    result_seq = torch.full((b, k, horizon), model.pad_id, dtype=torch.long, device=device)
    # the sentences still searching (n of them), each with k rows in the decoder state
    sentence = torch.arange(b, device=device)
    alive_score = torch.full((b, k), inf, device=device)
    alive_score[:, 0] = 0.0  # all beams start as the same empty hypothesis: expand one
    alive_seq = torch.zeros((b, k, 0), dtype=torch.long, device=device)
    last = torch.full((b * k,), model.bos_id, dtype=torch.long, device=device)
    final_score = torch.full((b, k), inf, device=device)  # normalised, best first
    final_seq = torch.full((b, k, horizon), model.pad_id, dtype=torch.long, device=device)
    n_final = torch.zeros(b, dtype=torch.long, device=device)
    best_ended = torch.zeros(b, dtype=torch.bool, device=device)  # a step's best was an EOS
    rank = torch.arange(2 * k, device=device)
    never = never_output(model, device)
    prefix_score = torch.zeros(b, device=device)
    prefix_len = None if prefix is None else (prefix >= 0).sum(dim=1)
    for t in range(horizon):
        n = len(sentence)
        log_probs = model.decode_step(state, last)  # (n*K, V)
        vocab = log_probs.shape[-1]
        at_limit = t >= max_len  # (n,)
        log_probs, remainder = restrict_outputs(
            model, log_probs.view(n, k, vocab), at_limit[:, None].expand(n, k), never
        )
        forced = force_prefix(
            log_probs.view(n * k, vocab),
            remainder.view(-1),
            prefix,
            sentence.repeat_interleave(k),
            t,
        )
        prefix_score[sentence] += forced.view(n, k)[:, 0]  # during a prefix only beam 0 lives
        candidates = ((alive_score - remainder)[..., None] + log_probs).view(n, k * vocab)
        top_score, top_index = candidates.topk(2 * k, dim=1)  # (n, 2K)
        source_beam, token = top_index // vocab, top_index % vocab
        if prefix_len is not None and t > 0:
            top_score = after_prefix(top_score, token, model.eos_id, prefix_len[sentence] == t, k)

        # finish EOS candidates within the top K
        finishing = (token == model.eos_id) & (rank < k) & top_score.isfinite()
        if finishing.any():
            normalised = top_score / float(t + 1) ** length_penalty
            pool_score = torch.cat([final_score, normalised.masked_fill(~finishing, inf)], dim=1)
            ended = torch.full((n, 2 * k, horizon), model.pad_id, dtype=torch.long, device=device)
            ended[:, :, :t] = alive_seq.gather(1, source_beam[..., None].expand(-1, -1, t))
            final_score, keep = pool_score.topk(k, dim=1)
            final_seq = torch.cat([final_seq, ended], dim=1).gather(
                1, keep[..., None].expand(-1, -1, horizon)
            )
            n_final += finishing.sum(dim=1)
            best_ended |= finishing[:, 0]
        if length_penalty == 0:
            done = (best_ended & (n_final >= nbest)) | at_limit
        else:
            done = (n_final >= k) | at_limit
        survivors = torch.arange(n, device=device)
        if done.any():
            finished = sentence[done]
            result_score[finished], result_seq[finished] = final_score[done], final_seq[done]
            if done.all():
                break
            survivors = (~done).nonzero().squeeze(1)
            sentence, max_len, n_final = sentence[survivors], max_len[survivors], n_final[survivors]
            final_score, final_seq = final_score[survivors], final_seq[survivors]
            top_score, token = top_score[survivors], token[survivors]
            source_beam, alive_seq = source_beam[survivors], alive_seq[survivors]
            best_ended = best_ended[survivors]

        # the best K candidates that did not end continue
        alive_score, pick = top_score.masked_fill(token == model.eos_id, inf).topk(k, dim=1)
        chosen_beam, last_token = source_beam.gather(1, pick), token.gather(1, pick)
        alive_seq = torch.cat(
            [alive_seq.gather(1, chosen_beam[..., None].expand(-1, -1, t)), last_token[..., None]],
            dim=2,
        )
        state.reorder((survivors[:, None] * k + chosen_beam).view(-1))  # rows before the drop
        last = last_token.view(-1)
    scores, seqs = result_score[:, :nbest].tolist(), result_seq[:, :nbest].tolist()
    return [
        [
            Hypothesis(row, score + forced / (len(row) + 1) ** length_penalty)
            for row, score in zip(strip_at_end(model, rows), sentence_scores, strict=True)
            if score > inf
        ]
        for rows, sentence_scores, forced in zip(seqs, scores, prefix_score.tolist(), strict=True)
    ]


def after_prefix(
    top_score: Tensor, token: Tensor, eos_id: int, first_free: Tensor, k: int
) -> Tensor:
    """CTranslate2's rule for the first step after a target prefix (it keeps a short output
    from winning when there is no length penalty), on the (n, 2K) candidates of rows where
    `first_free` (n,): an EOS ends a hypothesis only as the best candidate; one below it
    leaves its beam empty for the step, and an ending best one is replaced by the (K+1)-th
    candidate only (empty too if that is an EOS). Those left out get -inf."""
    is_eos = token == eos_id
    rank = torch.arange(token.shape[1], device=token.device)
    replaces_best = (rank == k) & is_eos[:, :1]
    excluded = ((is_eos & (rank > 0)) | ((rank >= k) & ~replaces_best)) & first_free[:, None]
    return top_score.masked_fill(excluded, float("-inf"))
