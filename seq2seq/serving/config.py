"""Schemas of what `serve` reads (conf/serve.yaml), beside the server they configure: a module
of its own so that the command checks its config without the serve extra (FastAPI) installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from seq2seq.decoding.config import DecodingConfig
from seq2seq.errors import require


@dataclass
class ServeLimits:
    body_bytes: int  # largest request body
    sentences: int  # most sentences in one request
    characters: int  # longest sentence, prefix or phrase
    timeout_s: float  # a request's time, waiting and decoding


@dataclass
class ServeConfig:
    """What `serve` reads (conf/serve.yaml): a model, where to listen, how to decode (each
    request may change the decoding), and the limits on a request."""

    ckpt_path: str
    checkpoints: list[str]  # more checkpoints, decoded with ckpt_path as one ensemble
    host: str
    port: int
    batch_wait_ms: float  # how long a batch waits for more requests
    limits: ServeLimits
    decoding: DecodingConfig

    def check(self) -> None:
        self.decoding.check()
        require(0 <= self.port <= 65535, "port", f"must be in 0-65535, got {self.port}")
        require(self.batch_wait_ms >= 0, "batch_wait_ms", f"must be >= 0, got {self.batch_wait_ms}")
        for key in ("body_bytes", "sentences", "characters", "timeout_s"):
            value = getattr(self.limits, key)
            require(value > 0, f"limits.{key}", f"must be > 0, got {value}")
