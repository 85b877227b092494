"""The server under load against the Translator in one process, on the same sentences.

    python scripts/serve_benchmark.py CKPT [--source FILE] [--sentences 1000] [--clients 8]
        [--per-request 1 8] [--reps 2] [--latency 200] [--json FILE]

Starts `python -m seq2seq.serve ckpt_path=CKPT` on 127.0.0.1 (beam 5, the default decoding) and
times, in alternating repetitions: the first `--sentences` lines of `--source`
(test_2016_flickr's English) through `Translator.translate` in this process (batches of
decoding.batch_size), and the same lines sent by `--clients` concurrent clients, each request
`--per-request` lines, each client taking the next lines left (sentences/s, and how many
answers equal the in-process translation); and in this process again at batches of `--clients`
sentences, the most a batch of the server holds when each client waits on one sentence. Then,
with the server otherwise idle, `--latency` single-sentence requests one after another: the
median and 95th percentile. The clients run on the same cores as the server (2 on the
development machine), and their HTTP work is part of the figure. Run it alone.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
from bench.report import environment, table, write_json

from seq2seq.data.corpus import read_lines
from seq2seq.decoding.translator import Translator

SOURCE = Path("../shared/data/multi30k/test_2016_flickr.en.gz")


def start_server(checkpoint: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "seq2seq.serve", f"ckpt_path={checkpoint}", f"port={port}"]
    process = subprocess.Popen(command, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not start")


def under_load(
    url: str, sentences: list[str], clients: int, per_request: int
) -> tuple[float, list[str]]:
    """Seconds for `clients` clients to translate every sentence, `per_request` at a time."""
    todo: queue.Queue[int] = queue.Queue()
    for start in range(0, len(sentences), per_request):
        todo.put(start)
    answers = [""] * len(sentences)

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            while True:
                try:
                    start = todo.get_nowait()
                except queue.Empty:
                    return
                mine = sentences[start : start + per_request]
                reply = http.post(f"{url}/translate", json={"sentences": mine})
                for i, nbest in enumerate(reply.json()["translations"], start=start):
                    answers[i] = nbest[0]["text"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, answers


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--source", type=Path, default=SOURCE, help="a text file, one per line")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-request", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sentences = read_lines(args.source)[: args.sentences]
    translator = Translator.from_checkpoint(args.checkpoint)
    expected = translator.translate(sentences)  # warm-up, and the reference answers
    # the most a batch can hold when each of the clients waits on one sentence
    small = Translator(translator.backend, translator.tokenizer, replace(translator.decoding))
    small.decoding.batch_size = args.clients
    process, url = start_server(args.checkpoint)
    try:
        under_load(url, sentences[:64], args.clients, 1)  # warm-up
        in_process: list[float] = []
        in_small_batches: list[float] = []
        served = {n: [] for n in args.per_request}
        equal = {n: [] for n in args.per_request}
        for _ in range(args.reps):
            start = time.perf_counter()
            translator.translate(sentences)
            in_process.append(time.perf_counter() - start)
            start = time.perf_counter()
            small.translate(sentences)
            in_small_batches.append(time.perf_counter() - start)
            for n in args.per_request:
                seconds, answers = under_load(url, sentences, args.clients, n)
                served[n].append(seconds)
                equal[n].append(sum(a == b for a, b in zip(answers, expected, strict=True)))
        latencies = []
        with httpx.Client(timeout=120) as http:
            for sentence in sentences[: args.latency]:
                start = time.perf_counter()
                http.post(f"{url}/translate", json={"sentences": [sentence]}).raise_for_status()
                latencies.append((time.perf_counter() - start) * 1000)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)

    def rate(seconds: list[float]) -> str:
        return f"{statistics.median(len(sentences) / s for s in seconds):.1f}"

    quantiles = statistics.quantiles(latencies, n=20)
    results = {
        **environment("serve_benchmark.py", argv),
        "sentences": len(sentences),
        "clients": args.clients,
        "in_process_seconds": in_process,
        "in_process_batches_of_clients_seconds": in_small_batches,
        "served_seconds": served,
        "served_answers_equal_to_in_process": equal,
        "latency_ms": latencies,
    }
    print(f"date: {results['date']}; machine: {results['machine']}")
    rows = [
        [
            f"Translator, in process, batches of {translator.decoding.batch_size}",
            rate(in_process),
            "",
        ],
        [f"Translator, in process, batches of {args.clients}", rate(in_small_batches), ""],
    ]
    rows += [
        [
            f"server, {args.clients} clients, {n} sentence(s) per request",
            rate(served[n]),
            f"{min(equal[n])} of {len(sentences)}",
        ]
        for n in args.per_request
    ]
    print(table(["", "sentences/s (median)", "answers equal to the Translator's"], rows))
    print(
        f"single-sentence latency, {len(latencies)} requests one after another: median "
        f"{statistics.median(latencies):.1f} ms, p95 {quantiles[18]:.1f} ms"
    )
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
