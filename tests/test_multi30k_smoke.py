"""The one real-data run in CI: the tiny preset on Multi30k through train, then README's
quickstart commands after its train step, as README prints them, on that run's directory:
evaluate, translate, the Python API, export, translate the export, serve and one request."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FP32, ROOT
from test_docs import segments

pytestmark = pytest.mark.slow

RUN_PLACEHOLDER = "outputs/<date>/<time>-<pid>"  # how README names the run directory
SERVER = "http://127.0.0.1:8000"  # where README's request goes


@pytest.fixture(scope="module")
def smoke_run(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("smoke")
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "seq2seq.train",
            f"paths.data_dir={shared_data}",
            f"paths.cache_dir={work / 'cache'}",
            "experiment=smoke",
            FP32,
            "trainer.max_epochs=2",
            "trainer.limit_train_batches=150",
            "optim.lr=2e-3",
            "optim.warmup_steps=100",
            "average_last=2",
            "prefer_checkpoint=last",
            "evaluate_after=false",
            "hydra.run.dir=run",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert train.stdout.splitlines()[-2:] == [
        "run directory: run",  # relative to where train was started, as README shows it
        "final checkpoint: run/checkpoints/final.ckpt",
    ]
    return work / "run"


def test_tiny_model_learns_multi30k_and_keeps_its_choice_as_final(smoke_run: Path) -> None:
    with open(smoke_run / "metrics.csv") as f:
        validation = [row for row in csv.DictReader(f) if row["val/bleu"]]
    losses = [float(row["val/loss"]) for row in validation]
    assert len(losses) == 2 and losses[1] < losses[0]
    summary = json.loads((smoke_run / "run_summary.json").read_text())
    choice = summary["final_checkpoint_choice"]
    assert set(choice["val_bleu"]) == {"best", "last", "averaged"}  # each decoded with beam 5
    assert set(choice["p_values"]) == {"best", "averaged"}  # each against the preferred last
    assert Path(choice["path"]).name == f"{choice['chosen']}.ckpt"
    final = Path(summary["final_checkpoint"])
    assert final == smoke_run / "checkpoints" / "final.ckpt"
    assert final.read_bytes() == Path(choice["path"]).read_bytes()


def quickstart_blocks() -> list[tuple[str, list[str]]]:
    """(language, lines) of each code block of README's Quickstart section, in order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for _, lines, is_code in segments(section):
        if is_code:
            blocks.append((lines[0].strip("`~ "), lines[1:-1]))
    return blocks


def commands_after_train() -> tuple[list[str], str]:
    """README's shell commands after the train step, and its Python example."""
    commands, python = [], ""
    for language, lines in quickstart_blocks():
        if language == "bash":
            commands += [line.split("  #")[0].strip() for line in lines if line.strip()]
        elif language == "python":
            python = "\n".join(lines)
    after = next(i for i, c in enumerate(commands) if "seq2seq.train experiment=" in c) + 1
    rest = [c for c in commands[after:] if "seq2seq.train" not in c]
    return rest, python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readmes_commands_run_on_the_run_directory(smoke_run: Path) -> None:
    commands, python_example = commands_after_train()
    kinds = [re.search(r"seq2seq\.(\w+)|^(curl)", c).group(1) or "curl" for c in commands]
    assert kinds == ["evaluate", "translate", "export", "translate", "serve", "curl"], commands
    work = smoke_run.parent
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    outputs = {}
    for command, kind in zip(commands, kinds, strict=True):
        command = command.replace(RUN_PLACEHOLDER, smoke_run.name)
        if kind == "serve":
            port = free_port()
            log = open(work / "serve.log", "w")  # noqa: SIM115 (the server's life)
            server = subprocess.Popen(
                [*shlex.split(command), f"port={port}"],
                cwd=work,
                env={**env, "CUDA_VISIBLE_DEVICES": ""},
                stderr=log,
            )
            continue
        if kind == "curl":
            outputs[kind] = request(command.replace(SERVER, f"http://127.0.0.1:{port}"), server)
            continue
        done = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        outputs.setdefault(kind, []).append(done.stdout)
    server.send_signal(signal.SIGTERM)  # uvicorn ends by the signal it caught
    assert server.wait(timeout=60) in (0, -signal.SIGTERM), (work / "serve.log").read_text()
    log.close()

    assert "test_2016_flickr" in outputs["evaluate"][0]
    assert list((smoke_run / "checkpoints").glob("final.test_2016_flickr.beam5-lp1.hyp"))
    ours, exported = (text.splitlines() for text in outputs["translate"])
    assert len(ours) == 1 and len(exported) == 1  # one line in, one out (the model is tiny)
    assert (work / "model_ct2" / "model.bin").is_file()
    answer = outputs["curl"]
    assert len(answer["translations"]) == 1 and answer["translations"][0][0]["text"] == ours[0]
    script = python_example.replace(RUN_PLACEHOLDER, smoke_run.name)
    script += "\nprint(len(translator.translate(['A dog runs.', 'Two men talk.'])))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=work, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr[-3000:]


def request(curl: str, server: subprocess.Popen) -> dict:
    """README's curl command, sent with httpx once the server answers: its URL and body."""
    httpx = pytest.importorskip("httpx")
    words = shlex.split(curl)
    url = next(word for word in words if word.startswith("http"))
    body = words[words.index("-d") + 1]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.poll() is None, "the server stopped: see serve.log"
        try:
            answer = httpx.post(
                url, content=body, timeout=60, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 200, answer.text
            return answer.json()
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("the server did not answer within 120 s")
