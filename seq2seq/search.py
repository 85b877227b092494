"""Greedy and beam search over any incremental decoder, batched over sentences.

The decoder is anything with `start_decoding(src, beam) -> state`, `decode_step(state, tokens)
-> log-probs (N, V)`, `state.reorder(index)` and its special token ids (`pad_id`, `bos_id`,
`eos_id`, the tokenizer's): the Transformer, or a hand-built model in tests. Only the loop over
time steps is Python; sentences and beams are tensor dimensions.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class DecoderState(Protocol):
    def reorder(self, index: Tensor) -> None: ...


class IncrementalDecoder(Protocol):
    pad_id: int
    bos_id: int
    eos_id: int

    def start_decoding(self, src: Tensor, beam: int = 1) -> DecoderState: ...

    def decode_step(self, state: DecoderState, tokens: Tensor) -> Tensor: ...


def max_output_len(src: Tensor, a: float, b: int, limit: int, pad_id: int) -> Tensor:
    """Per-sentence budget of output tokens before EOS: a * source tokens + b, within the
    model's `limit` positions. `src` (B, S) holds source ids with EOS, padded with `pad_id`."""
    src_len = (src != pad_id).sum(dim=1) - 1  # without EOS
    return (a * src_len + b).long().clamp(max=limit - 1)


def _constrain(model: IncrementalDecoder, log_probs: Tensor, at_limit: Tensor) -> Tensor:
    """PAD and BOS are never output; rows at their length limit (`at_limit`) may only end."""
    never = torch.zeros(log_probs.shape[-1], dtype=torch.bool, device=log_probs.device)
    never[[model.pad_id, model.bos_id]] = True
    not_eos = torch.ones_like(never)
    not_eos[model.eos_id] = False
    return log_probs.masked_fill(never | (at_limit[..., None] & not_eos), float("-inf"))


def _strip(model: IncrementalDecoder, rows: Tensor) -> list[list[int]]:
    """Token rows to lists, cut at the first EOS or PAD."""
    ends = (model.eos_id, model.pad_id)
    out = []
    for row in rows.tolist():
        end = next((i for i, tok in enumerate(row) if tok in ends), len(row))
        out.append(row[:end])
    return out


@torch.no_grad()
def greedy_search(model: IncrementalDecoder, src: Tensor, max_len: Tensor) -> list[list[int]]:
    """Most probable next token at each step. `max_len` (B,): output tokens before EOS."""
    batch = src.shape[0]
    state = model.start_decoding(src, beam=1)
    tokens = torch.full((batch,), model.bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    steps = []
    for t in range(int(max_len.max()) + 1):
        log_probs = _constrain(model, model.decode_step(state, tokens), t >= max_len)
        tokens = log_probs.argmax(dim=-1).masked_fill(finished, model.pad_id)
        steps.append(tokens)
        finished |= tokens == model.eos_id
        if finished.all():
            break
    return _strip(model, torch.stack(steps, dim=1))


@torch.no_grad()
def beam_search(
    model: IncrementalDecoder,
    src: Tensor,
    max_len: Tensor,
    beam: int,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """Beam search; the best finished hypothesis by score / length**length_penalty.

    As in fairseq: a hypothesis ends when an EOS candidate ranks among the top `beam` of the
    2 x beam candidates of a step, and a sentence is done once it has `beam` finished
    hypotheses or reaches `max_len`. With beam 1 this is exactly greedy search.
    """
    b, k, device = src.shape[0], beam, src.device
    state = model.start_decoding(src, beam=k)
    inf = float("-inf")
    alive_score = torch.full((b, k), inf, device=device)
    alive_score[:, 0] = 0.0  # all beams start as the same empty hypothesis: expand one
    alive_seq = torch.zeros((b, k, 0), dtype=torch.long, device=device)
    last = torch.full((b * k,), model.bos_id, dtype=torch.long, device=device)
    horizon = int(max_len.max()) + 1
    final_score = torch.full((b, k), inf, device=device)
    final_seq = torch.full((b, k, horizon), model.pad_id, dtype=torch.long, device=device)
    n_final = torch.zeros(b, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    rank = torch.arange(2 * k, device=device)
    offsets = (torch.arange(b, device=device) * k)[:, None]  # (B, 1)
    for t in range(horizon):
        log_probs = model.decode_step(state, last)  # (B*K, V)
        vocab = log_probs.shape[-1]
        at_limit = t >= max_len  # (B,)
        log_probs = _constrain(model, log_probs.view(b, k, vocab), at_limit[:, None].expand(b, k))
        candidates = (alive_score[..., None] + log_probs).view(b, k * vocab)
        top_score, top_index = candidates.topk(2 * k, dim=1)  # (B, 2K)
        source_beam, token = top_index // vocab, top_index % vocab
        source_seq = alive_seq.gather(1, source_beam[..., None].expand(-1, -1, t))  # (B, 2K, t)

        # finish EOS candidates within the top K of sentences still searching
        finishing = (token == model.eos_id) & (rank < k) & ~done[:, None] & top_score.isfinite()
        normalised = top_score / float(t + 1) ** length_penalty
        pool_score = torch.cat([final_score, normalised.masked_fill(~finishing, inf)], dim=1)
        padded = torch.full((b, 2 * k, horizon), model.pad_id, dtype=torch.long, device=device)
        padded[:, :, :t] = source_seq
        pool_seq = torch.cat([final_seq, padded], dim=1)
        final_score, keep = pool_score.topk(k, dim=1)
        final_seq = pool_seq.gather(1, keep[..., None].expand(-1, -1, horizon))
        n_final += finishing.sum(dim=1)
        done |= (n_final >= k) | at_limit
        if done.all():
            break

        # the best K candidates that did not end continue
        alive_score, pick = top_score.masked_fill(token == model.eos_id, inf).topk(k, dim=1)
        chosen_beam, last_token = source_beam.gather(1, pick), token.gather(1, pick)
        alive_seq = torch.cat(
            [alive_seq.gather(1, chosen_beam[..., None].expand(-1, -1, t)), last_token[..., None]],
            dim=2,
        )
        state.reorder((offsets + chosen_beam).view(-1))
        last = last_token.view(-1)
    best = final_score.argmax(dim=1)
    return _strip(model, final_seq[torch.arange(b, device=device), best])
