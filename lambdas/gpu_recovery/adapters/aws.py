"""One boto3 session and client factory for every adapter.

Clients use the *standard* retry mode (exponential backoff with jitter on throttling
and 5xx). Local mode registers botocore event hooks on :func:`session` before any
client is created, which is how the simulated ECS data plane sees API calls.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config

MAX_RETRIES = 5  # botocore's client-config "max_attempts" counts retries: 6 attempts per call


def retry_config() -> Config:
    """A fresh Config per client: botocore rewrites the ``retries`` dict it is given."""
    return Config(
        retries={"mode": "standard", "max_attempts": MAX_RETRIES},
        connect_timeout=5,
        read_timeout=20,
    )

_lock = threading.Lock()
_session: boto3.session.Session | None = None
_clients: dict[str, Any] = {}


def session() -> boto3.session.Session:
    global _session
    with _lock:
        if _session is None:
            _session = boto3.session.Session()
        return _session


def client(service: str) -> Any:
    """A cached client; boto3 clients are thread-safe, sessions are not."""
    sess = session()
    with _lock:
        if service not in _clients:
            _clients[service] = sess.client(service, config=retry_config())
        return _clients[service]


def resource(service: str) -> Any:
    sess = session()
    with _lock:
        key = f"resource:{service}"
        if key not in _clients:
            _clients[key] = sess.resource(service, config=retry_config())
        return _clients[key]


def reset() -> None:
    """Forget the session and clients (tests and local mode start clean)."""
    global _session
    with _lock:
        _session = None
        _clients.clear()
