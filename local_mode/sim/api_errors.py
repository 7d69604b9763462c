"""AWS API error injection into the emulated account (``LocalAws.faults``).

:class:`ApiFaults` answers selected API calls with an AWS-shaped error response
*inside botocore's retry loop* (a ``before-send`` hook that runs before moto's own
stub), so the clients' standard retry mode behaves exactly as against AWS:

* a **transient** fault (``count`` < :data:`ATTEMPTS`) is retried by botocore and
  the call finally succeeds;
* a **persistent** fault (``count=None``, or ``count`` >= :data:`ATTEMPTS`) surfaces
  as ``botocore.exceptions.ClientError`` to the caller.

``MAX_RETRIES`` is the clients' ``max_attempts: 5``; botocore reads that key as *retries*, so a
call makes up to 6 HTTP attempts (:data:`ATTEMPTS`).

Retry back-off is not slept in local mode (see ``LocalAws``), so injected errors
cost no wall time. Usage::

    faults = local.faults
    faults.transient("ecs", "StopTask", failures=2)              # retried, succeeds
    faults.persistent("ec2", "RebootInstances", error=INTERNAL)  # every call fails
    faults.clear()

One call broken once, counted from a flow's start, is :mod:`local_mode.sim.broken_calls`'s.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

import botocore.session
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

from gpu_recovery.adapters.aws import MAX_RETRIES

#: (error code, HTTP status) pairs. Standard retry mode retries all three, but for StartTask's
#: 5xx: it may have started its task, so it is not sent again (``gpu_recovery.adapters.aws``).
THROTTLING = ("ThrottlingException", 400)
INTERNAL = ("InternalError", 500)
UNAVAILABLE = ("ServiceUnavailable", 503)
#: HTTP attempts per API call with the handlers' retry config (1 + max_attempts).
ATTEMPTS = MAX_RETRIES + 1
#: Not retried by botocore: always surfaces on the first failure.
ACCESS_DENIED = ("AccessDeniedException", 400)

_model_session = botocore.session.get_session()
_protocol_cache: dict[str, tuple[str, str]] = {}
_cache_lock = threading.Lock()


def _service_info(service: str) -> tuple[str, str]:
    """(hyphenized service id as used in event names, wire protocol) of a client name."""
    with _cache_lock:
        if service not in _protocol_cache:
            model = _model_session.get_service_model(service)
            _protocol_cache[service] = (model.service_id.hyphenize(), model.protocol)
        return _protocol_cache[service]


class _RawBody(BytesIO):
    def stream(self, **_: Any) -> Any:
        contents = self.read()
        while contents:
            yield contents
            contents = self.read()


def error_response(url: str, protocol: str, code: str, status: int, message: str) -> AWSResponse:
    """An HTTP error response as the service's wire protocol encodes it."""
    request_id = str(uuid.uuid4())
    headers = HTTPHeaders()
    headers["x-amzn-RequestId"] = request_id
    if protocol in ("json", "rest-json"):
        headers["Content-Type"] = "application/x-amz-json-1.1"
        headers["x-amzn-ErrorType"] = code
        body = json.dumps({"__type": code, "message": message})
    elif protocol == "ec2":
        headers["Content-Type"] = "text/xml"
        body = (
            f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message>"
            f"</Error></Errors><RequestID>{request_id}</RequestID></Response>"
        )
    elif protocol == "query":
        headers["Content-Type"] = "text/xml"
        kind = "Receiver" if status >= 500 else "Sender"
        body = (
            f"<ErrorResponse><Error><Type>{kind}</Type><Code>{code}</Code>"
            f"<Message>{message}</Message></Error><RequestId>{request_id}</RequestId>"
            "</ErrorResponse>"
        )
    else:  # rest-xml
        headers["Content-Type"] = "application/xml"
        body = (
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<RequestId>{request_id}</RequestId></Error>"
        )
    return AWSResponse(url, status, headers, _RawBody(body.encode()))  # type: ignore[arg-type]


@dataclass
class Injection:
    """One armed fault. ``remaining`` None means persistent."""

    service: str
    operation: str
    code: str
    status: int
    remaining: int | None
    message: str
    fired: int = 0


@dataclass
class InjectedError:
    service: str
    operation: str
    code: str
    status: int


@dataclass
class ApiFaults:
    """Registry of armed faults; ``before_send`` is the botocore hook (thread-safe)."""

    injections: list[Injection] = field(default_factory=list)
    #: every error actually returned, in order (thread-safe appends)
    log: list[InjectedError] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def inject(
        self,
        service: str,
        operation: str,
        count: int | None = 1,
        error: tuple[str, int] = THROTTLING,
        message: str = "Injected by local_mode.sim.api_errors",
    ) -> Injection:
        """Make the next ``count`` HTTP attempts of ``service.operation`` fail.

        ``count=None`` fails every attempt until :meth:`clear`. Attempts, not API
        calls, are counted: botocore retries count too.
        """
        service_id, _ = _service_info(service)
        inj = Injection(service_id, operation, error[0], error[1], count, message)
        with self._lock:
            self.injections.append(inj)
        return inj

    def transient(
        self, service: str, operation: str, failures: int = 2, error: tuple[str, int] = THROTTLING
    ) -> Injection:
        """Fail ``failures`` (< ATTEMPTS) attempts: botocore's standard retries hide them."""
        if failures >= ATTEMPTS:
            raise ValueError(f"a call makes {ATTEMPTS} attempts; use persistent()")
        return self.inject(service, operation, failures, error)

    def persistent(
        self, service: str, operation: str, error: tuple[str, int] = INTERNAL
    ) -> Injection:
        """Fail every attempt until cleared: the caller sees a ClientError."""
        return self.inject(service, operation, None, error)

    def clear(self, service: str | None = None, operation: str | None = None) -> None:
        with self._lock:
            sid = _service_info(service)[0] if service else None
            self.injections = [
                i
                for i in self.injections
                if not ((sid is None or i.service == sid) and (operation in (None, i.operation)))
            ]

    def count(self, service: str | None = None, operation: str | None = None) -> int:
        """How many errors were injected (optionally for one operation)."""
        sid = _service_info(service)[0] if service else None
        with self._lock:
            return sum(
                1
                for e in self.log
                if (sid is None or e.service == sid) and operation in (None, e.operation)
            )

    # botocore hook: before-send.<service-id>.<Operation>
    def before_send(self, request: Any, event_name: str = "", **_: Any) -> AWSResponse | None:
        parts = event_name.split(".")
        if len(parts) < 3:
            return None
        service_id, operation = parts[1], parts[2]
        with self._lock:
            hit = None
            for inj in self.injections:
                if (
                    inj.service == service_id
                    and inj.operation == operation
                    and (inj.remaining is None or inj.remaining > 0)
                ):
                    hit = inj
                    break
            if hit is None:
                return None
            if hit.remaining is not None:
                hit.remaining -= 1
            hit.fired += 1
            self.log.append(InjectedError(service_id, operation, hit.code, hit.status))
            self.injections = [i for i in self.injections if i.remaining != 0]
        protocol = next(
            (p for sid, p in _protocol_cache.values() if sid == service_id), "json"
        )
        url = request.url
        # botocore emits before-send to *every* handler (moto's stubber runs after this
        # one even though we answered). Divert the request so moto does not execute it:
        # a throttled or 5xx call must not change state.
        request.url = "https://fault-injected.invalid/"
        return error_response(url, protocol, hit.code, hit.status, hit.message)
