"""Several trained models decoded as one (fairseq's ensembles): each keeps its own incremental
state (KV caches), and a step's distribution is the mean of the models' probabilities, in log
space `logsumexp(log p_1, ..., log p_N) - log N`. Any attention wiring: the models only meet in
their output distributions, which is why they must share the target vocabulary, and the source
one, since they read the same ids."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.decoding.search import DecoderState, IncrementalDecoder
from seq2seq.errors import ConfigError


class EnsembleState:
    """The members' decoder states, reordered together."""

    def __init__(self, states: list[DecoderState]) -> None:
        self.states = states

    def reorder(self, index: Tensor) -> None:
        for state in self.states:
            state.reorder(index)


class Ensemble:
    """An IncrementalDecoder of `models`, which must share their special token ids (and, as
    the caller checks from their tokenizers, their vocabularies)."""

    def __init__(self, models: Sequence[IncrementalDecoder]) -> None:
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        ids = {(m.pad_id, m.bos_id, m.eos_id, m.never_ids) for m in models}
        if len(ids) != 1:
            raise ConfigError(f"the models of an ensemble use different special ids: {ids}")
        self.models = list(models)
        self.pad_id, self.bos_id, self.eos_id, self.never_ids = ids.pop()

    def start_decoding(self, src: Tensor, beam: int = 1) -> EnsembleState:
        return EnsembleState([m.start_decoding(src, beam) for m in self.models])

    def decode_step(self, state: EnsembleState, tokens: Tensor) -> Tensor:
        """Next-token log-probabilities (N, V) of the models' mean distribution."""
        steps = [
            m.decode_step(s, tokens).float() for m, s in zip(self.models, state.states, strict=True)
        ]
        if len(steps) == 1:
            return steps[0]
        return torch.stack(steps).logsumexp(dim=0) - math.log(len(steps))
