"""Our backend: greedy or beam search (seq2seq.decoding.search), or sampling
(seq2seq.decoding.sampling), on a trained Transformer."""

from __future__ import annotations

from pathlib import Path

import torch

from seq2seq.config import DecodingConfig, RootConfig
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.backend import Request, output_limits, source_batch
from seq2seq.decoding.checkpoint import load_trained
from seq2seq.decoding.sampling import sample_search
from seq2seq.decoding.search import Hypothesis, beam_search, greedy_search
from seq2seq.model.transformer import Transformer


class TorchBackend:
    """A Transformer in eval mode on `device`, decoded by our search."""

    name = "seq2seq"

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        device: str | torch.device = "cpu",
        training_config: RootConfig | None = None,
    ) -> None:
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_len = model.config.max_len
        self.training_config = training_config

    @classmethod
    def from_checkpoint(cls, path: Path, device: str | torch.device = "cpu") -> TorchBackend:
        trained = load_trained(path)
        return cls(trained.model, trained.tokenizer, device, trained.config)

    def decode(self, requests: list[Request], decoding: DecodingConfig) -> list[list[Hypothesis]]:
        src = source_batch([r.source for r in requests]).to(self.device)
        return self.search(src, decoding, requests)

    @torch.no_grad()
    def search(
        self, src: torch.Tensor, decoding: DecodingConfig, requests: list[Request] | None = None
    ) -> list[list[Hypothesis]]:
        """`src` (B, S): source ids with EOS, padded (`source_batch`); `requests`: what else
        each sentence asks for (its line number seeds sampling; default 1, 2, ...)."""
        src = src.to(self.device)
        max_len = output_limits(src, decoding, self.max_len)
        lines = [r.line for r in requests] if requests else list(range(1, len(src) + 1))
        prefixes = [r.prefix for r in requests] if requests else None
        if decoding.search == "sample":
            return sample_search(
                self.model,
                src,
                max_len,
                [(decoding.seed, line) for line in lines],
                decoding.nbest,
                decoding.temperature,
                decoding.top_k,
                decoding.top_p,
                decoding.length_penalty,
                prefixes,
            )
        if decoding.beam_size == 1:
            return greedy_search(self.model, src, max_len, decoding.length_penalty, prefixes)
        return beam_search(
            self.model,
            src,
            max_len,
            decoding.beam_size,
            decoding.length_penalty,
            decoding.nbest,
            prefixes,
        )
