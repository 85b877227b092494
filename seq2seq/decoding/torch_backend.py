"""Our backend: greedy or beam search (seq2seq.decoding.search), or sampling
(seq2seq.decoding.sampling), on a trained Transformer."""

from __future__ import annotations

from pathlib import Path

import torch

from seq2seq.config import RootConfig
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.backend import Request, output_limits, source_batch
from seq2seq.decoding.checkpoint import load_trained
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.constraints import constrained_beam_search
from seq2seq.decoding.ensemble import Ensemble
from seq2seq.decoding.sampling import sample_search
from seq2seq.decoding.search import Hypothesis, beam_search, greedy_search
from seq2seq.errors import ConfigError
from seq2seq.model.transformer import Transformer


class TorchBackend:
    """A Transformer, or an Ensemble of them, in eval mode on `device`, decoded by our search."""

    def __init__(
        self,
        model: Transformer | Ensemble,
        tokenizer: Tokenizer,
        device: str | torch.device = "cpu",
        training_config: RootConfig | None = None,
    ) -> None:
        members = model.models if isinstance(model, Ensemble) else [model]
        for member in members:
            member.eval().to(device)
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_len = min(member.config.max_len for member in members)
        self.training_config = training_config
        self.name = "seq2seq" if len(members) == 1 else f"seq2seq ensemble of {len(members)}"

    @classmethod
    def from_checkpoint(cls, path: Path, device: str | torch.device = "cpu") -> TorchBackend:
        return cls.from_checkpoints([path], device)

    @classmethod
    def from_checkpoints(
        cls, paths: list[Path], device: str | torch.device = "cpu"
    ) -> TorchBackend:
        """One checkpoint, or several decoded as one ensemble: they must share the tokenizer
        (the vocabularies the models read and write). The first one's training config is the
        ensemble's (evaluate's test sets)."""
        trained = [load_trained(path) for path in paths]
        for path, other in zip(paths[1:], trained[1:], strict=True):
            if other.tokenizer.fingerprint != trained[0].tokenizer.fingerprint:
                raise ConfigError(
                    f"{paths[0]} and {path} were trained with different SentencePiece models: "
                    "the models of an ensemble must share one vocabulary; ensemble runs that "
                    "share paths.cache_dir and tokenizer settings"
                )
        models = [t.model for t in trained]
        model = models[0] if len(models) == 1 else Ensemble(models)
        return cls(model, trained[0].tokenizer, device, trained[0].config)

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
        constraints = [r.constraints for r in requests] if requests else []
        if any(constraints):
            if decoding.search == "sample":
                raise ConfigError(
                    "decoding=sample cannot take constraints: lexically constrained decoding "
                    "is a beam search (decoding=beam, decoding.beam_size >= phrase tokens + 1)"
                )
            return constrained_beam_search(
                self.model,
                src,
                max_len,
                decoding.beam_size,
                constraints,
                decoding.length_penalty,
                decoding.nbest,
                prefixes,
            )
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
