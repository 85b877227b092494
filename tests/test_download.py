"""Downloads from a loopback HTTP server: verified before renaming, nothing left on failure."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import compose_config, split_file_overrides

from seq2seq.data.corpus import ensure_available
from seq2seq.errors import DataError

FILES = {
    "train.en.gz": b"A dog runs.\nA cat sleeps.\n",
    "train.de.gz": b"Ein Hund rennt.\nEine Katze schlaeft.\n",
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Serve a directory on 127.0.0.1; yields (url pattern, served directory)."""
    served = tmp_path / "served"
    served.mkdir()
    for name, text in FILES.items():
        (served / name).write_bytes(gzip.compress(text, mtime=0))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}/{{file}}", served
    finally:
        httpd.shutdown()
        httpd.server_close()


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checksums(directory: Path) -> dict[str, str]:
    return {p.name: sha256_of(p) for p in directory.iterdir()}


def data_config(url: str, sha256: dict[str, str], data_dir: Path):
    overrides = [
        f"paths.data_dir={data_dir}",
        f"data.download.url='{url}'",
        "data.val_split=train",
        "data.test_sets=[]",
    ]
    config = compose_config(overrides).data
    config.download.sha256 = sha256
    return config


def files_in(directory: Path) -> list[str]:
    """What a download left, but the lock files that processes downloading together share
    (seq2seq.concurrency.build_lock): temp files count."""
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_good_download_is_verified_and_kept(server, tmp_path: Path) -> None:
    url, served = server
    config = data_config(url, checksums(served), tmp_path / "data")
    [split] = ensure_available(config, ["train"])
    assert split.src.read_bytes() == (served / "train.en.gz").read_bytes()
    assert split.tgt.read_bytes() == (served / "train.de.gz").read_bytes()
    assert files_in(split.src.parent) == ["train.de.gz", "train.en.gz"]


def test_tampered_download_fails_and_leaves_nothing(server, tmp_path: Path) -> None:
    url, served = server
    expected = checksums(served)
    (served / "train.de.gz").write_bytes(gzip.compress(b"Ein Hund rennt NICHT.\nx\n"))
    got = sha256_of(served / "train.de.gz")
    config = data_config(url, expected, tmp_path / "data")
    with pytest.raises(DataError) as info:
        ensure_available(config, ["train"])
    message = str(info.value)
    assert "checksum mismatch for train.de.gz" in message
    assert expected["train.de.gz"] in message and got in message
    # the good file is kept; the tampered one and every temp file are gone
    assert files_in(tmp_path / "data" / "multi30k") == ["train.en.gz"]


def test_offline_names_every_missing_file_url_and_override(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}/raw/{{file}}"
    config = data_config(url, {}, tmp_path / "data")
    with pytest.raises(DataError) as info:
        ensure_available(config, ["train"])
    message = str(info.value)
    assert "2 data file(s) are missing" in message
    for name in ("train.en.gz", "train.de.gz"):
        assert str(tmp_path / "data" / "multi30k" / name) in message
        assert url.format(file=name) in message
    assert "paths.data_dir=" in message
    assert files_in(tmp_path / "data" / "multi30k") == []


def test_local_file_with_wrong_checksum_is_rejected(tmp_path: Path) -> None:
    directory = tmp_path / "data" / "multi30k"
    directory.mkdir(parents=True)
    for name, text in FILES.items():
        (directory / name).write_bytes(gzip.compress(text, mtime=0))
    sums = checksums(directory)
    sums["train.en.gz"] = "0" * 64
    config = data_config("http://127.0.0.1:9/{file}", sums, tmp_path / "data")
    with pytest.raises(DataError) as info:
        ensure_available(config, ["train"])
    message = str(info.value)
    assert str(directory / "train.en.gz") in message
    assert "expected sha256 " + "0" * 64 in message
    assert "got " + sha256_of(directory / "train.en.gz") in message
    config.verify_checksums = False
    assert ensure_available(config, ["train"])[0].src == directory / "train.en.gz"


def test_missing_user_files_name_the_setting(tmp_path: Path) -> None:
    overrides = [
        "data=parallel_files",
        f"data.dir={tmp_path}",
        *split_file_overrides(),
    ]
    config = compose_config(overrides).data
    with pytest.raises(DataError) as info:
        ensure_available(config, ["train", "val"])
    message = str(info.value)
    assert str(tmp_path / "train.src") in message and str(tmp_path / "val.tgt") in message
    assert "data.splits" in message
