"""The server's routes: POST /translate (JSON), GET /health, GET /model (what the page shows
beside the maps), and the page at / with its files (static/). No route loads anything from
elsewhere: FastAPI's /docs and /redoc pages, which fetch their scripts from a CDN, are off, and
the schema stays at /openapi.json."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError

from seq2seq.analysis.attention import Attention, attention_of
from seq2seq.data.directions import check_target, target_languages
from seq2seq.decoding.backend import Backend
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.model_path import model_name
from seq2seq.decoding.torch_backend import TorchBackend
from seq2seq.decoding.translator import DecodedTranslation, Translation, Translator
from seq2seq.errors import ConfigError, Seq2SeqError
from seq2seq.model.transformer import Transformer
from seq2seq.serving.batching import Batcher, Job
from seq2seq.serving.config import ServeConfig
from seq2seq.serving.schema import TranslateRequest, validation_message

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
WHERE = "request"  # how messages about a sentence name it: "request, line 2"


@dataclass
class Work:
    """A request's part of a batch."""

    request: TranslateRequest
    decoding: DecodingConfig


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def attention_json(attention: Attention) -> dict[str, Any]:
    """Maps as nested lists, weights rounded to 5 decimals: (heads, Q, K), or (heads, T, S, T)
    with `per_prefix` for sites whose queries come from the source."""
    return {
        "source": attention.source,
        "target": attention.target,
        "maps": [
            {
                "site": m.site,
                "layer": m.layer,
                "query": str(m.query),
                "key": str(m.key),
                "per_prefix": m.weights.ndim == 4,
                "weights": np.round(m.weights.astype(np.float64), 5).tolist(),
            }
            for m in attention.maps
        ],
    }


class TranslationService:
    """Decodes the jobs of one group (seq2seq.serving.batching) with the backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        model = backend.model if isinstance(backend, TorchBackend) else None
        self.model = model if isinstance(model, Transformer) else None  # attention needs one

    def decode_group(self, jobs: list[Job]) -> list[Any]:
        """One result per job; a job that a model or input error rules out gets the error
        alone: the group is decoded again job by job."""
        try:
            return self.decode(jobs)
        except Seq2SeqError as e:
            if len(jobs) == 1:
                return [e]
        results: list[Any] = []
        for job in jobs:
            try:
                results.extend(self.decode([job]))
            except Seq2SeqError as e:
                results.append(e)
        return results

    def decode(self, jobs: list[Job]) -> list[dict[str, Any]]:
        requests = [job.work.request for job in jobs]
        lines = [s for r in requests for s in r.sentences]
        numbers = [i for r in requests for i in range(1, len(r.sentences) + 1)]
        prefixes = constraints = None
        if any(r.prefixes for r in requests):
            prefixes = [p for r in requests for p in r.prefixes or [""] * len(r.sentences)]
        if any(r.constraints for r in requests):
            constraints = [c for r in requests for c in r.constraints or [[]] * len(r.sentences)]
        translator = Translator(self.backend, self.backend.tokenizer, jobs[0].work.decoding)
        nbest = translator.translate_nbest(
            lines, WHERE, prefixes=prefixes, constraints=constraints, numbers=numbers
        )
        results, start = [], 0
        for request in requests:
            mine = nbest[start : start + len(request.sentences)]
            result: dict[str, Any] = {"translations": [self.listed(n) for n in mine]}
            if request.attention:
                result["attention"] = [
                    self.attention(translator, sentence, number, best)
                    for number, (sentence, [best, *_]) in enumerate(
                        zip(request.sentences, mine, strict=True), start=1
                    )
                ]
            results.append(result)
            start += len(request.sentences)
        return results

    @staticmethod
    def listed(nbest: list[Translation]) -> list[dict[str, Any]]:
        return [{"text": t.text, "score": round(t.score, 6)} for t in nbest]

    def attention(
        self, translator: Translator, sentence: str, number: int, best: DecodedTranslation
    ) -> dict[str, Any] | None:
        """The best translation's maps (none for an empty sentence, which is not decoded)."""
        [src_ids] = translator.source_ids([sentence], WHERE, [number])
        if not src_ids:
            return None
        maps = attention_of(self.model, self.backend.tokenizer, src_ids, best.tokens)
        return attention_json(maps)


def model_summary(backend: Backend, config: ServeConfig, attention: bool) -> dict[str, Any]:
    """What the page shows beside the maps: the model, its wiring, the server's decoding. The
    checkpoints by name (`final.ckpt` for a run directory, an export directory's name): their
    paths on the server's disk are not the clients' business."""
    training = backend.training_config
    return {
        "backend": backend.name,
        "checkpoints": [model_name(path) for path in (config.ckpt_path, *config.checkpoints)],
        "attention": attention,
        "model": dataclasses.asdict(training.model) if training else None,
        # a multilingual model's: what decoding.target_lang may ask for (none: one direction)
        "target_languages": target_languages(training.data) if training else [],
        "decoding": dataclasses.asdict(config.decoding),
        "limits": dataclasses.asdict(config.limits),
    }


def create_app(
    backend: Backend, config: ServeConfig, worker: ThreadPoolExecutor | None = None
) -> FastAPI:
    """The app; `worker`: the thread that decodes (batching.decoding_thread), best the one
    that loaded `backend`."""
    service = TranslationService(backend)
    wait_s = config.batch_wait_ms / 1000
    batcher = Batcher(service.decode_group, config.decoding.batch_size, wait_s, worker)
    summary = model_summary(backend, config, service.model is not None)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="seq2seq", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "backend": backend.name}

    @app.get("/model")
    async def model() -> dict[str, Any]:
        return summary

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        body = await limited_body(request, config.limits.body_bytes)
        if isinstance(body, JSONResponse):
            return body
        try:
            parsed = TranslateRequest.model_validate_json(body)
        except ValidationError as e:
            invalid_json = any(item["type"] == "json_invalid" for item in e.errors())
            if invalid_json:
                return error(400, f"the body is not JSON: {e.errors()[0]['msg']}")
            return error(422, validation_message(e))
        try:
            parsed.check(config.limits)
            decoding = parsed.decoding.applied_to(config.decoding)
            if backend.training_config is not None:  # refused before it waits for a batch
                check_target(backend.training_config.data, decoding.target_lang)
            if parsed.attention and service.model is None:
                raise ConfigError(
                    f"attention: this server decodes with {backend.name}; attention maps need "
                    "one checkpoint (.ckpt), not an export directory or an ensemble"
                )
        except ConfigError as e:
            return error(422, str(e))
        key = dataclasses.astuple(decoding)
        try:
            result = await asyncio.wait_for(
                batcher.submit(key, Work(parsed, decoding), len(parsed.sentences)),
                config.limits.timeout_s,
            )
        except asyncio.TimeoutError:
            return error(
                504,
                f"not decoded within {config.limits.timeout_s} s (limits.timeout_s): the server "
                "is busy, or the request too large; try again, or send fewer sentences",
            )
        except Seq2SeqError as e:
            return error(422, str(e))
        except Exception as e:  # a bug, not the request: the server goes on
            log.exception("decoding failed")
            return error(500, f"decoding failed: {type(e).__name__}: {e}")
        return JSONResponse({**result, "decoding": dataclasses.asdict(decoding)})

    @app.get("/")
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


async def limited_body(request: Request, limit: int) -> bytes | JSONResponse:
    """The body, or a 413 once it passes `limit` bytes (by its Content-Length, or as read)."""
    refused = error(
        413, f"the body is over {limit} bytes (limits.body_bytes): send fewer sentences"
    )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return refused
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return refused
    return bytes(body)
