"""The translation server (python -m seq2seq.serve) as a client sees it: started as users
start it, on 127.0.0.1, answered over HTTP. Its answers equal the Translator's and
attention_of's, concurrent clients each get their own answers, bad requests get a 4xx that
names the field and leave the server running, and SIGTERM stops it."""

from __future__ import annotations

import random
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import config_of, run, start_python, tiny_checkpoint, toy_corpus

from seq2seq.analysis.attention import attention_of
from seq2seq.decoding.config import DecodingConfig
from seq2seq.decoding.translator import Translator

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

SENTENCES = toy_corpus(40)[0][:12]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m seq2seq.serve` in a process of its own, until stopped."""

    def __init__(self, *overrides: str, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = ["-m", "seq2seq.serve", f"port={self.port}", *overrides]
        self.process = start_python(*command, cwd=cwd, env={"CUDA_VISIBLE_DEVICES": ""})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server stopped: {self.stderr()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("the server did not answer /health within 120 s")

    def post(self, body: object, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}/translate", json=body, timeout=60, **kwargs)

    def stderr(self) -> str:
        return self.process.output("stderr")

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        return self.process.returncode, self.stderr()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("model"), steps=20)


@pytest.fixture(scope="module")
def server(checkpoint: Path) -> Iterator[Server]:
    started = Server(f"ckpt_path={checkpoint}", "limits.sentences=16", "limits.body_bytes=20000")
    yield started
    started.stop()


def translator(checkpoint: Path, group: str = "beam", **fields) -> Translator:
    return Translator.from_checkpoint(
        checkpoint, config_of(f"decoding/{group}", DecodingConfig, **fields)
    )


def listed(nbest) -> list[list[dict]]:
    return [[{"text": t.text, "score": round(t.score, 6)} for t in n] for n in nbest]


@pytest.mark.slow
def test_health_and_the_model_summary(server: Server, checkpoint: Path) -> None:
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "backend": "seq2seq"}
    answer = httpx.get(f"{server.url}/model")
    summary = answer.json()
    # the checkpoint by name: the server's directories are not shown to clients
    assert checkpoint.is_absolute() and summary["checkpoints"] == [checkpoint.name]
    assert str(checkpoint.parent) not in answer.text
    assert summary["attention"] is True
    assert summary["model"]["attention"]["cross"]["query"] == "target"
    assert summary["decoding"]["beam_size"] == 5
    # nothing on the page or API comes from elsewhere: no CDN docs pages
    assert httpx.get(f"{server.url}/docs").status_code == 404
    page = httpx.get(f"{server.url}/").text
    assert "/static/page.js" in page and "http" not in page.replace("http-equiv", "")


@pytest.mark.slow
def test_translations_equal_the_translators(server: Server, checkpoint: Path) -> None:
    expected = translator(checkpoint, nbest=3).translate_nbest(SENTENCES)
    answer = server.post({"sentences": SENTENCES, "decoding": {"nbest": 3}}).json()
    assert answer["translations"] == listed(expected)
    assert answer["decoding"]["nbest"] == 3 and answer["decoding"]["beam_size"] == 5


@pytest.mark.slow
def test_samples_prefixes_and_constraints_as_the_translator_gives_them(
    server: Server, checkpoint: Path
) -> None:
    sample = {"search": "sample", "nbest": 2, "seed": 7, "top_p": 0.9, "beam_size": 1}
    expected = translator(checkpoint, "sample", nbest=2, seed=7, top_p=0.9).translate_nbest(
        SENTENCES[:4]
    )
    answer = server.post({"sentences": SENTENCES[:4], "decoding": sample}).json()
    assert answer["translations"] == listed(expected)

    prefixes, constraints = ["the", "", "a", ""], [["dog"], [], [], ["the cat"]]
    expected = translator(checkpoint, beam_size=6).translate_nbest(
        SENTENCES[:4], prefixes=prefixes, constraints=constraints
    )
    body = {
        "sentences": SENTENCES[:4],
        "decoding": {"beam_size": 6},
        "prefixes": prefixes,
        "constraints": constraints,
    }
    assert server.post(body).json()["translations"] == listed(expected)


@pytest.mark.slow
def test_attention_equals_a_teacher_forced_pass_over_the_output(
    server: Server, checkpoint: Path
) -> None:
    one = translator(checkpoint)
    [[best, *_]] = one.translate_nbest(SENTENCES[:1])
    [src_ids] = one.tokenizer.encode_src(SENTENCES[:1])
    expected = attention_of(one.backend.model, one.tokenizer, src_ids, best.tokens)
    [got] = server.post({"sentences": SENTENCES[:1], "attention": True}).json()["attention"]
    assert got["source"] == expected.source and got["target"] == expected.target
    assert [(m["site"], m["layer"]) for m in got["maps"]] == [
        (m.site, m.layer) for m in expected.maps
    ]
    for mine, theirs in zip(got["maps"], expected.maps, strict=True):
        np.testing.assert_allclose(np.array(mine["weights"]), theirs.weights, atol=1e-5)
    answer = server.post({"sentences": ["", SENTENCES[1]], "attention": True}).json()
    assert answer["attention"][0] is None and answer["attention"][1]["maps"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "the body is not JSON"),
        (
            {"sentences": ["a dog"], "decoding": {"beamsize": 5}},
            422,
            "decoding.beamsize: unknown option; the options are search, beam_size",
        ),
        (
            {"sentences": ["a dog"], "decoding": {"beam_size": "5"}},
            422,
            "decoding.beam_size: Input should be a valid integer",
        ),
        ({"sentence": "a dog"}, 422, "sentence: unknown option"),
        ({"sentences": []}, 422, "sentences: List should have at least 1 item"),
        (
            {"sentences": ["a"] * 17},
            422,
            "sentences: 17 in one request, the server takes at most 16 (limits.sentences)",
        ),
        (
            {"sentences": ["a " * 1200]},
            422,
            "sentences[0]: 2400 characters, the server takes at most 2000 (limits.characters)",
        ),
        (
            {"sentences": ["a"] * 16, "prefixes": ["x " * 1000] * 16},
            413,
            "over 20000 bytes (limits.body_bytes)",
        ),
        ({"sentences": ["a", "b"], "prefixes": ["x"]}, 422, "prefixes: 1 for 2 sentences"),
        ({"sentences": ["a"], "constraints": [[" "]]}, 422, "constraints[0]: an empty phrase"),
        (
            {"sentences": ["a"], "decoding": {"nbest": 9}},
            422,
            "config key 'decoding.nbest': 9 hypotheses from a beam of 5",
        ),
        (
            {
                "sentences": ["a"],
                "decoding": {"search": "sample", "beam_size": 1},
                "constraints": [["dog"]],
            },
            422,
            "decoding=sample cannot take constraints",
        ),
    ],
)
def test_bad_requests_get_a_4xx_naming_what_to_fix(
    server: Server, body: object, status: int, message: str
) -> None:
    if isinstance(body, bytes):
        response = httpx.post(f"{server.url}/translate", content=body, timeout=60)
    else:
        response = server.post(body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    assert server.post({"sentences": ["a dog"]}).status_code == 200  # still serving


@pytest.mark.slow
def test_a_bad_request_batched_with_good_ones_fails_alone(server: Server) -> None:
    """Sampled requests, one with constraints (which sampling refuses), sent at once: the
    batch they share is decoded again request by request, and only that one fails."""
    sample = {"search": "sample", "beam_size": 1, "seed": 1}
    bodies = [{"sentences": [s], "decoding": sample} for s in SENTENCES[:6]]
    bodies[3]["constraints"] = [["dog"]]
    answers: list = [None] * len(bodies)

    def send(i: int) -> None:
        answers[i] = server.post(bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.status_code for a in answers] == [200, 200, 200, 422, 200, 200]


@pytest.mark.slow
def test_concurrent_clients_each_get_their_own_answers(server: Server, checkpoint: Path) -> None:
    """8 clients x 50 requests of 1-3 sentences, with beam 5 or greedy: every answer is the
    Translator's for its own sentences; none is lost. Throughput is printed, not asserted."""
    decodings = {"beam": {}, "greedy": {"beam_size": 1}}
    expected = {
        name: dict(
            zip(SENTENCES, translator(checkpoint, **fields).translate(SENTENCES), strict=True)
        )
        for name, fields in decodings.items()
    }
    failures: list[str] = []
    answered = [0]
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=60) as http:
            for _ in range(50):
                name = rng.choice(list(decodings))
                sentences = rng.sample(SENTENCES, rng.randint(1, 3))
                body = {"sentences": sentences, "decoding": decodings[name]}
                response = http.post(f"{server.url}/translate", json=body)
                got = [n[0]["text"] for n in response.json()["translations"]]
                with lock:
                    answered[0] += 1
                    if got != [expected[name][s] for s in sentences]:
                        failures.append(f"{name} {sentences}: {got}")

    start = time.perf_counter()
    clients = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    seconds = time.perf_counter() - start
    assert failures == [] and answered[0] == 400
    print(f"400 requests from 8 clients in {seconds:.1f} s")


@pytest.mark.slow
def test_start_up_errors_and_sigterm(checkpoint: Path, tmp_path: Path) -> None:
    """A checkpoint that cannot be loaded stops start-up with translate's message; SIGTERM
    stops a running server once the request in flight is answered."""
    args = ["ckpt_path=nowhere.ckpt"]
    served, translated = run("serve", tmp_path, *args), run("translate", tmp_path, *args, stdin="")
    assert served.returncode == translated.returncode == 1
    assert served.stderr.splitlines()[-1] == translated.stderr.splitlines()[-1]
    assert "Traceback" not in served.stderr
    # a batch that waits 1.5 s for more requests: the one sent is in flight at the signal
    server = Server(f"ckpt_path={checkpoint}", "batch_wait_ms=1500", cwd=tmp_path)
    answer: list = []
    sender = threading.Thread(target=lambda: answer.append(server.post({"sentences": SENTENCES})))
    sender.start()
    time.sleep(0.5)
    status, _ = server.stop()
    sender.join()
    # uvicorn finishes the requests in flight, then ends by the signal it caught
    assert status in (0, -signal.SIGTERM)
    assert answer[0].status_code == 200 and len(answer[0].json()["translations"]) == 12
    assert not list(tmp_path.iterdir())  # no run directory, no log file


def test_hosts_beyond_localhost_are_named_in_a_warning() -> None:
    from seq2seq.serve import is_local

    assert is_local("127.0.0.1") and is_local("localhost") and is_local("::1")
    assert not is_local("0.0.0.0") and not is_local("192.168.1.5") and not is_local("example.org")


def test_every_decoding_key_of_a_request_is_a_decoding_setting() -> None:
    """A request's decoding keys are checked as decoding=... is (DecodingConfig.check)."""
    from seq2seq.serving.schema import DecodingOptions

    assert set(DecodingOptions.model_fields) <= set(DecodingConfig.__dataclass_fields__)


def test_the_batcher_groups_waiting_jobs_by_key_and_fails_only_the_failing_job() -> None:
    """Jobs sent together share batches of at most max_sentences, one group per key, in the
    order they came; an exception returned for a job reaches that job's caller only."""
    import asyncio

    from seq2seq.serving.batching import Batcher

    groups: list[list[tuple[str, int]]] = []

    def decode_group(jobs):
        groups.append([(job.key, job.work) for job in jobs])
        return [ValueError(job.work) if job.work == 3 else job.work * 10 for job in jobs]

    async def send() -> list:
        batcher = Batcher(decode_group, max_sentences=4, wait_s=0.05)
        batcher.start()
        keys = ["beam", "sample", "beam", "beam", "sample", "beam"]
        results = await asyncio.gather(
            *(batcher.submit(key, i, 1) for i, key in enumerate(keys)), return_exceptions=True
        )
        await batcher.stop()
        return results

    results = asyncio.run(send())
    assert results[:3] == [0, 10, 20] and isinstance(results[3], ValueError)
    assert results[4:] == [40, 50]
    assert groups == [
        [("beam", 0), ("beam", 2), ("beam", 3)],
        [("sample", 1)],
        [("sample", 4)],
        [("beam", 5)],
    ]


@pytest.mark.slow
def test_an_export_directory_translates_and_refuses_what_ctranslate2_cannot(
    checkpoint: Path, tmp_path: Path
) -> None:
    """Served from a CTranslate2 export directory: the same translations as the Translator on
    it; attention and constraints are refused with 422, naming why."""
    pytest.importorskip("ctranslate2")
    exported = run("export", tmp_path, f"ckpt_path={checkpoint}", f"export.dir={tmp_path / 'ct2'}")
    assert exported.returncode == 0, exported.stderr[-2000:]
    server = Server(f"ckpt_path={tmp_path / 'ct2'}")
    try:
        expected = translator(tmp_path / "ct2").translate_nbest(SENTENCES[:4])
        assert server.post({"sentences": SENTENCES[:4]}).json()["translations"] == listed(expected)
        refused = server.post({"sentences": ["a dog"], "attention": True})
        assert refused.status_code == 422
        assert "attention maps need one checkpoint (.ckpt)" in refused.json()["error"]
        refused = server.post({"sentences": ["a dog"], "constraints": [["dog"]]})
        assert refused.status_code == 422
        assert "CTranslate2 has no lexically constrained decoding" in refused.json()["error"]
        assert httpx.get(f"{server.url}/model").json()["attention"] is False
    finally:
        server.stop()
