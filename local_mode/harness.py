"""What every local app (the demo, the playground, the scenarios) does around the real
handlers it runs in this process: local traffic past any proxy, quiet handler loggers,
and handler caches built again for each emulator."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def environ_restored(keys: Iterable[str]) -> Iterator[None]:
    """The environment variables ``keys`` as they were (or unset) once the block ends."""
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def loopback_without_proxy() -> Iterator[None]:
    """urllib honours HTTP(S)_PROXY: local traffic must never go through a proxy."""
    with environ_restored(("no_proxy", "NO_PROXY")):
        for key in ("no_proxy", "NO_PROXY"):
            current = [p for p in (os.environ.get(key) or "").split(",") if p]
            os.environ[key] = ",".join([*current, "127.0.0.1", "localhost"])
        yield


def silence_handler_logs() -> None:
    logging.getLogger().setLevel(logging.CRITICAL)
    for name in ("ecs-task-handler", "dcgm-task-monitor", "ecs-instance-monitor", "recovery-sweep",
                 "node-api", "node-authorizer", "heartbeat-sweep", "jobs-api", "queue-scheduler",
                 "gpu-node-agent", "local_mode.server"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def reset_handler_caches() -> None:
    """Handlers cache services built from the environment; a new emulator needs new ones.
    (``jobs_api.reset`` also drops the boto3 session: call it outside ``LocalAws``.)"""
    from handlers import jobs_api

    jobs_api.reset()  # runtime.reset(): the heartbeat service too
