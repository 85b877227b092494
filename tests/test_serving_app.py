"""The server's app answered in this process (FastAPI's TestClient) on a small untrained model:
what test_serve.py checks of a started server, without starting one."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from helpers import compose_config, toy_corpus, toy_tokenizer, wired_model

from seq2seq.decoding.torch_backend import TorchBackend
from seq2seq.decoding.translator import Translator
from seq2seq.serving.config import ServeConfig

testclient = pytest.importorskip("fastapi.testclient")

SENTENCES = toy_corpus(20)[0][:3]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple]:
    from seq2seq.serving.app import create_app

    tokenizer = toy_tokenizer(60)
    backend = TorchBackend(wired_model(vocab=tokenizer.src_vocab_size, max_len=64), tokenizer)
    overrides = ["ckpt_path=/srv/models/run/best.ckpt", "limits.sentences=4"]
    config = compose_config([*overrides, "limits.body_bytes=2000"], "serve", ServeConfig)
    with testclient.TestClient(create_app(backend, config)) as client:
        yield client, backend, config


def test_translations_equal_the_translators_and_the_checkpoint_is_named_not_located(
    served,
) -> None:
    client, backend, config = served
    assert client.get("/health").json() == {"status": "ok", "backend": "seq2seq"}
    summary = client.get("/model").json()
    assert summary["checkpoints"] == ["best.ckpt"] and summary["attention"] is True
    expected = Translator(backend, backend.tokenizer, config.decoding).translate_nbest(SENTENCES)
    answer = client.post("/translate", json={"sentences": SENTENCES}).json()
    listed = [[{"text": t.text, "score": round(t.score, 6)} for t in n] for n in expected]
    assert answer["translations"] == listed
    assert answer["decoding"] == dataclasses.asdict(config.decoding)
    greedy = client.post("/translate", json={"sentences": SENTENCES, "decoding": {"beam_size": 1}})
    assert greedy.json()["decoding"]["beam_size"] == 1


def test_attention_comes_with_one_map_per_site_and_layer(served) -> None:
    client, backend, _ = served
    answer = client.post("/translate", json={"sentences": ["a dog"], "attention": True}).json()
    (maps,) = answer["attention"]
    layers = backend.model.config
    sites = {(m["site"], m["layer"]) for m in maps["maps"]}
    assert len(sites) == layers.encoder_layers + 2 * layers.decoder_layers


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"sentences": ["a dog"] * 5}, 422, "limits.sentences"),
        ({"sentences": ["a dog " * 400]}, 413, "limits.body_bytes"),
        ({"sentences": ["a dog"], "decoding": {"beam_sise": 2}}, 422, "beam_sise"),
        ("not json", 400, "not JSON"),
    ],
    ids=["too many sentences", "body too large", "unknown decoding key", "not JSON"],
)
def test_bad_requests_get_a_4xx_naming_what_to_fix(served, body, status: int, words: str) -> None:
    client, _, _ = served
    if isinstance(body, str):
        answer = client.post("/translate", content=body)
    else:
        answer = client.post("/translate", json=body)
    assert answer.status_code == status and words in answer.json()["error"]
    assert client.get("/health").status_code == 200
