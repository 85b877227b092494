"""Greedy and beam search over any incremental decoder, batched over sentences.

The decoder is anything with `start_decoding(src, beam) -> state`, `decode_step(state, tokens)
-> log-probs (N, V)` (which search may change in place), `state.reorder(index)` and its special
token ids (`pad_id`, `bos_id`, `eos_id`, the tokenizer's): the Transformer, or a hand-built
model in tests. Only the loop over time steps is Python; sentences and beams are tensor
dimensions. A sentence that is done leaves the batch (`reorder` with fewer rows), as in fairseq,
so the last steps of a batch cost only what its unfinished sentences need.
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
    """PAD and BOS are never output; rows at their length limit (`at_limit`) may only end.
    In place: the (N, V) copy a masked_fill makes was a fifth of a beam search step
    (AMD EPYC; bf16 units: avx512_bf16)."""
    log_probs[..., [model.pad_id, model.bos_id]] = float("-inf")
    if at_limit.any():
        eos = log_probs[..., model.eos_id].clone()
        log_probs[at_limit] = float("-inf")
        log_probs[..., model.eos_id] = eos
    return log_probs


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
    horizon = int(max_len.max()) + 1
    state = model.start_decoding(src, beam=1)
    outputs = torch.full((src.shape[0], horizon), model.pad_id, dtype=torch.long, device=src.device)
    sentence = torch.arange(src.shape[0], device=src.device)  # of each row still decoding
    tokens = torch.full_like(sentence, model.bos_id)
    for t in range(horizon):
        log_probs = _constrain(model, model.decode_step(state, tokens), t >= max_len)
        tokens = log_probs.argmax(dim=-1)
        outputs[sentence, t] = tokens
        going = tokens != model.eos_id
        if not going.all():
            if not going.any():
                break
            rows = going.nonzero().squeeze(1)
            state.reorder(rows)
            sentence, tokens, max_len = sentence[rows], tokens[rows], max_len[rows]
    return _strip(model, outputs)


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
    horizon = int(max_len.max()) + 1
    result_score = torch.full((b, k), inf, device=device)
    result_seq = torch.full((b, k, horizon), model.pad_id, dtype=torch.long, device=device)
    # the sentences still searching (n of them), each with k rows in the decoder state
    sentence = torch.arange(b, device=device)
    alive_score = torch.full((b, k), inf, device=device)
    alive_score[:, 0] = 0.0  # all beams start as the same empty hypothesis: expand one
    alive_seq = torch.zeros((b, k, 0), dtype=torch.long, device=device)
    last = torch.full((b * k,), model.bos_id, dtype=torch.long, device=device)
    final_score = torch.full((b, k), inf, device=device)
    final_seq = torch.full((b, k, horizon), model.pad_id, dtype=torch.long, device=device)
    n_final = torch.zeros(b, dtype=torch.long, device=device)
    rank = torch.arange(2 * k, device=device)
    for t in range(horizon):
        n = len(sentence)
        log_probs = model.decode_step(state, last)  # (n*K, V)
        vocab = log_probs.shape[-1]
        at_limit = t >= max_len  # (n,)
        log_probs = _constrain(model, log_probs.view(n, k, vocab), at_limit[:, None].expand(n, k))
        candidates = (alive_score[..., None] + log_probs).view(n, k * vocab)
        top_score, top_index = candidates.topk(2 * k, dim=1)  # (n, 2K)
        source_beam, token = top_index // vocab, top_index % vocab

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

        # the best K candidates that did not end continue
        alive_score, pick = top_score.masked_fill(token == model.eos_id, inf).topk(k, dim=1)
        chosen_beam, last_token = source_beam.gather(1, pick), token.gather(1, pick)
        alive_seq = torch.cat(
            [alive_seq.gather(1, chosen_beam[..., None].expand(-1, -1, t)), last_token[..., None]],
            dim=2,
        )
        state.reorder((survivors[:, None] * k + chosen_beam).view(-1))  # rows before the drop
        last = last_token.view(-1)
    best = result_score.argmax(dim=1)
    return _strip(model, result_seq[torch.arange(b, device=device), best])
