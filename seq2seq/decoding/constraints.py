"""Lexically constrained beam search: every hypothesis that ends contains each of its
sentence's phrases (token sequences), by dynamic beam allocation (Post and Vilar 2018, as in
Sockeye 2 and fairseq).

Which phrases an output contains is tracked by an Aho-Corasick automaton over the sentence's
phrases, so overlapping phrases count where they overlap ("red ball" and "ball" are both met
by "red ball") and a phrase counts wherever it appears, also when the model produced it
unasked. A hypothesis's progress is the number of tokens of the phrases it has met plus how
far it is into an unmet one. Each step the candidates are the best 2 x beam continuations,
each hypothesis's best token, and every token that advances a hypothesis towards an unmet
phrase; the beam is then shared among banks of equal progress (beam // (tokens + 1) slots
each, the rest to the most advanced), so hypotheses that took a constraint early are not
crowded out by ones that have not. EOS is only allowed once every phrase is met.

When no hypothesis can meet every phrase (a length limit too short for them, a beam too small
to keep the advanced hypotheses alive), the best hypothesis that ended anyway is returned and
the caller, which knows the line, says which phrases it misses. Sentences without phrases are
searched exactly as `beam_search` searches them (tested), only slower: the allocation runs
per sentence in Python, while the model steps stay batched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from seq2seq.decoding.search import (
    Hypothesis,
    IncrementalDecoder,
    force_prefix,
    never_output,
    prefix_table,
    restrict_outputs,
)


class PhraseMatcher:
    """An Aho-Corasick automaton over one sentence's phrases. A state is (met, node): the
    phrases met so far, as bits, and the automaton node (the longest suffix of the output
    that is a prefix of some phrase)."""

    def __init__(self, phrases: list[list[int]]) -> None:
        self.phrases = phrases
        self.all_met = (1 << len(phrases)) - 1
        self.children: list[dict[int, int]] = [{}]
        self.depth, self.ends, self.on = [0], [0], [0]  # ends/on: phrase bits
        for bit, phrase in enumerate(phrases):
            node = 0
            for token in phrase:
                if token not in self.children[node]:
                    self.children.append({})
                    self.depth.append(self.depth[node] + 1)
                    self.ends.append(0)
                    self.on.append(0)
                    self.children[node][token] = len(self.children) - 1
                node = self.children[node][token]
                self.on[node] |= 1 << bit
            self.ends[node] |= 1 << bit
        self.fail = [0] * len(self.children)
        queue = list(self.children[0].values())
        while queue:  # breadth first: a node's fail link is shallower than the node
            node = queue.pop(0)
            for token, child in self.children[node].items():
                fallback = self.fail[node]
                while fallback and token not in self.children[fallback]:
                    fallback = self.fail[fallback]
                target = self.children[fallback].get(token, 0)
                self.fail[child] = target if target != child else 0
                self.ends[child] |= self.ends[self.fail[child]]
                queue.append(child)

    def advance(self, met: int, node: int, token: int) -> tuple[int, int]:
        while node and token not in self.children[node]:
            node = self.fail[node]
        node = self.children[node].get(token, 0)
        return met | self.ends[node], node

    def progress(self, met: int, node: int) -> int:
        """Tokens of the met phrases, plus the depth into an unmet phrase along the output's
        suffix (the deepest such node on the fail chain)."""
        done = sum(len(p) for bit, p in enumerate(self.phrases) if met >> bit & 1)
        while node and not self.on[node] & ~met:
            node = self.fail[node]
        return done + self.depth[node]

    @property
    def total(self) -> int:
        return sum(len(p) for p in self.phrases)

    def advancing(self, met: int, node: int) -> set[int]:
        """The tokens that take the output further into an unmet phrase."""
        tokens = set()
        while True:
            tokens |= {t for t, c in self.children[node].items() if self.on[c] & ~met}
            if not node:
                return tokens
            node = self.fail[node]


@dataclass
class Alive:
    """A hypothesis still growing."""

    tokens: list[int]
    score: float  # the sum of its tokens' log-probabilities
    met: int = 0
    node: int = 0


@dataclass
class SentenceSearch:
    """One sentence's beam: its hypotheses, the finished ones, those ended without every
    phrase (the fallback), and its automaton."""

    matcher: PhraseMatcher
    alive: list[Alive]
    limit: int
    finished: list[Hypothesis] = field(default_factory=list)
    unmet: list[Hypothesis] = field(default_factory=list)
    best_ended: bool = False  # a step's best candidate was a finished hypothesis
    prefix_score: float = 0.0  # the forced prefix's log-probability, left out of the ranking


def allocate(candidates: list[tuple[float, int, Alive]], banks: int, k: int) -> list:
    """Up to `k` of `candidates` (score, progress, ...), best score first within each bank of
    equal progress: k // banks slots per bank, one more for the most advanced banks until k
    are given, and slots a bank cannot fill go to the best of the rest."""
    by_bank: dict[int, list] = {}
    for candidate in sorted(candidates, key=lambda c: -c[0]):
        by_bank.setdefault(candidate[1], []).append(candidate)
    quota = {bank: k // banks for bank in range(banks)}
    for bank in sorted(range(banks), reverse=True)[: k % banks]:
        quota[bank] += 1
    chosen = [c for bank, members in by_bank.items() for c in members[: quota.get(bank, 0)]]
    picked = {id(c) for c in chosen}
    rest = [c for c in sorted(candidates, key=lambda c: -c[0]) if id(c) not in picked]
    chosen += rest[: k - len(chosen)]
    return sorted(chosen, key=lambda c: -c[0])


@torch.no_grad()
def constrained_beam_search(
    model: IncrementalDecoder,
    src: Tensor,
    max_len: Tensor,
    beam: int,
    constraints: list[list[list[int]]],
    length_penalty: float = 1.0,
    nbest: int = 1,
    prefixes: list[list[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search whose finished hypotheses contain every phrase of `constraints[b]` (token
    lists) where the limits allow (module docstring); `nbest` best first."""
    b, k, device = src.shape[0], beam, src.device
    prefix, max_len = prefix_table(prefixes, max_len)
    state = model.start_decoding(src, beam=k)
    never = never_output(model, device)
    searches = [
        SentenceSearch(PhraseMatcher(phrases), [Alive([], 0.0)], int(limit))
        for phrases, limit in zip(constraints, max_len.tolist(), strict=True)
    ]
    sentence = list(range(b))  # the sentences still searching, k rows each in `state`
    last = torch.full((b * k,), model.bos_id, dtype=torch.long, device=device)
    for t in range(int(max_len.max()) + 1):
        n = len(sentence)
        at_limit = torch.tensor([t >= searches[s].limit for s in sentence], device=device)
        log_probs, remainder = restrict_outputs(
            model,
            model.decode_step(state, last).view(n, k, -1),
            at_limit[:, None].expand(n, k),
            never,
        )
        rows = torch.tensor(sentence, device=device).repeat_interleave(k)
        forced = force_prefix(log_probs.view(n * k, -1), remainder.view(-1), prefix, rows, t)
        # during a prefix only a sentence's first row lives
        for s, score in zip(sentence, forced.view(n, k)[:, 0].tolist(), strict=True):
            searches[s].prefix_score += score
        scores = (log_probs.float() - remainder[..., None]).cpu()
        totals = torch.full((n, k), float("-inf"))  # rows past a sentence's hypotheses: copies
        for i, s in enumerate(sentence):
            alive = searches[s].alive
            totals[i, : len(alive)] = torch.tensor([h.score for h in alive])
            scores[i, len(alive) :] = float("-inf")
        top = (scores + totals[..., None]).view(n, -1).topk(2 * k, dim=1)
        best = scores.max(dim=-1).indices
        reorder, next_tokens, keep = [], [], []
        for i, s in enumerate(sentence):
            search = searches[s]
            expansions = {
                (int(index) // scores.shape[-1], int(index) % scores.shape[-1])
                for index in top.indices[i]
            }
            for r, hypothesis in enumerate(search.alive):
                expansions.add((r, int(best[i, r])))
                met, node = hypothesis.met, hypothesis.node
                expansions |= {(r, tok) for tok in search.matcher.advancing(met, node)}
            candidates = []
            for r, token in expansions:
                if r >= len(search.alive):
                    continue
                value = float(scores[i, r, token])
                if value == float("-inf"):
                    continue
                hypothesis = search.alive[r]
                met, node = search.matcher.advance(hypothesis.met, hypothesis.node, token)
                if token == model.eos_id:
                    met, node = hypothesis.met, hypothesis.node
                progress = search.matcher.progress(met, node)
                total = hypothesis.score + value
                grown = Alive([*hypothesis.tokens, token], total, met, node)
                candidates.append((total, progress, r, grown))
            banks = search.matcher.total + 1
            # as in beam search, an EOS ends a hypothesis when it ranks among the k best, here
            # of the candidates that hold every phrase; one that lacks some ends in the fallback
            complete = [c for c in candidates if c[3].met == search.matcher.all_met]
            selected = sorted(complete, key=lambda c: -c[0])[:k]
            for total, _, _, grown in selected:
                if grown.tokens[-1] == model.eos_id:
                    score = total / float(t + 1) ** length_penalty
                    search.finished.append(Hypothesis(grown.tokens[:-1], score))
            for total, _, _, grown in candidates:
                if grown.tokens[-1] == model.eos_id and grown.met != search.matcher.all_met:
                    score = total / float(t + 1) ** length_penalty
                    search.unmet.append(Hypothesis(grown.tokens[:-1], score))
            growing = [c for c in candidates if c[3].tokens[-1] != model.eos_id]
            chosen = allocate(growing, banks, k)
            # without length penalty scores only fall: an ended hypothesis that is the best of
            # all candidates, those still short of a phrase included, stays the best
            best_candidate = max(candidates, key=lambda c: c[0], default=None)
            if best_candidate and best_candidate[3].tokens[-1] == model.eos_id:
                search.best_ended |= best_candidate[3].met == search.matcher.all_met
            settled = length_penalty == 0 and search.best_ended
            finished = len(search.finished)
            if finished >= k or (settled and finished >= nbest) or t >= search.limit or not chosen:
                continue  # done: its rows leave the batch
            search.alive = [c[3] for c in chosen]
            keep.append(s)
            for slot in range(k):  # rows past the hypotheses copy the last one (masked)
                _, _, r, grown = chosen[min(slot, len(chosen) - 1)]
                reorder.append(i * k + r)
                next_tokens.append(grown.tokens[-1])
        if not keep:
            break
        state.reorder(torch.tensor(reorder, device=device))
        last = torch.tensor(next_tokens, dtype=torch.long, device=device)
        sentence = keep
    return [best_of(search, nbest, length_penalty) for search in searches]


def best_of(search: SentenceSearch, nbest: int, length_penalty: float) -> list[Hypothesis]:
    """The `nbest` best finished hypotheses with every phrase, else the best without; ranked
    by their continuation of a prefix, scored whole (as beam search does)."""
    pool = search.finished or search.unmet
    return [
        Hypothesis(h.tokens, h.score + search.prefix_score / (len(h.tokens) + 1) ** length_penalty)
        for h in sorted(pool, key=lambda h: h.score, reverse=True)[:nbest]
    ]
