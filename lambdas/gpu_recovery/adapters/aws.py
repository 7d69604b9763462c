"""One boto3 session and client factory for every adapter.

Clients use the *standard* retry mode (exponential backoff with jitter on throttling
and 5xx), except where a call sent again could act twice (:data:`NOT_RESENT_ONCE_SENT`).
Local mode registers botocore event hooks on :func:`session` before any client is created,
which is how the simulated ECS data plane sees API calls.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ConnectionError as NotConnected

MAX_RETRIES = 5  # botocore's client-config "max_attempts" counts retries: 6 attempts per call


def retry_config() -> Config:
    """A fresh Config per client: botocore rewrites the ``retries`` dict it is given."""
    return Config(
        retries={"mode": "standard", "max_attempts": MAX_RETRIES},
        connect_timeout=5,
        read_timeout=20,
    )


# StartTask takes no idempotency token (RunTask's clientToken has no StartTask twin, ECS API
# Reference): an attempt whose answer was lost (read timeout, connection closed) or that failed
# server-side (5xx) may have started its task, and botocore's retry would start a second one.
# Such an attempt is not sent again: its error reaches the caller, which looks the task up by
# its startedBy before it starts it again (``recovery.task_starts.start_once``). An attempt
# throttled, refused or never connected did nothing and is retried as any call's.
NOT_RESENT_ONCE_SENT: dict[str, tuple[str, ...]] = {"ecs": ("StartTask",)}


def _not_resent_once_sent(caught_exception: BaseException | None = None,
                          response: tuple[Any, Any] | None = None, **_: Any) -> bool | None:
    """A ``needs-retry`` hook of the operations above: False (no retry) when the attempt may
    have acted; None lets the standard retry decide. The emitter asks the operation's own hook
    before the service's, and the first answer that is not None decides."""
    if caught_exception is not None:
        return None if isinstance(caught_exception, NotConnected) else False
    http = response[0] if response else None
    return False if http is not None and http.status_code >= 500 else None


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
            made = sess.client(service, config=retry_config())
            for operation in NOT_RESENT_ONCE_SENT.get(service, ()):
                made.meta.events.register(f"needs-retry.{service}.{operation}", _not_resent_once_sent)
            _clients[service] = made
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
