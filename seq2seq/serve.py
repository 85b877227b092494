"""`python -m seq2seq.serve ckpt_path=...`: a translation server with a page that shows
attention (seq2seq.serving), on 127.0.0.1:8000 by default. Like translate it writes nothing:
no run directory, no log file. Ctrl-C or SIGTERM stops it after the requests in flight."""

from __future__ import annotations

import ipaddress
import logging

from seq2seq.cli import entrypoint
from seq2seq.decoding.translator import default_device, load_backend
from seq2seq.errors import ConfigError, install_hint
from seq2seq.serving.config import ServeConfig

log = logging.getLogger(__name__)


def is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@entrypoint(config_name="serve", schema=ServeConfig)
def main(config: ServeConfig) -> None:
    try:
        import uvicorn

        from seq2seq.serving.app import create_app
        from seq2seq.serving.batching import decoding_thread
    except ImportError as e:
        raise ConfigError(
            f"serve needs the serve extra ({e.name} is missing): {install_hint('serve')}"
        ) from None
    worker = decoding_thread()  # loads the model and runs it: torch on one thread only
    paths = [config.ckpt_path, *config.checkpoints]
    backend = worker.submit(load_backend, paths, default_device()).result()
    if not is_local(config.host):
        log.warning(
            "host=%s: the server is reachable beyond this machine, with no authentication; "
            "anyone who reaches port %d can use it (host=127.0.0.1 keeps it local)",
            config.host,
            config.port,
        )
    log.info("serving %s on http://%s:%d/", backend.name, config.host, config.port)
    uvicorn.run(
        create_app(backend, config, worker),
        host=config.host,
        port=config.port,
        log_level="warning",
        timeout_graceful_shutdown=config.limits.timeout_s,
    )


if __name__ == "__main__":
    main()
