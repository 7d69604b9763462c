"""Listeners on the emulated AWS API: what the simulated data plane (and any other part of
the local world) sees of each call the handlers make, and how a listener answers a call in
the emulator's place."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

PARAMS_KEY = "local_mode_params"
#: a botocore service id ("Auto Scaling") -> its event-name form ("auto-scaling")
_EVENT_SERVICE: dict[str, str] = {}

BeforeCall = Callable[[dict[str, Any], dict[str, Any]], Any]
AfterCall = Callable[[dict[str, Any], int, dict[str, Any], dict[str, Any]], None]


def hook_answer(service: str, parsed: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A 200 answer a before-call hook returns instead of letting the call reach the emulator
    (the caller gets ``parsed``)."""
    http = AWSResponse(f"https://{service}.us-east-1.amazonaws.com/", 200, HTTPHeaders(), None)  # type: ignore[arg-type]
    metadata = {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0}
    return http, {**parsed, "ResponseMetadata": metadata}



def hook_error(service: str, code: str, message: str, status: int = 400) -> tuple[Any, dict[str, Any]]:
    """An error answer a before-call hook returns in the emulator's place: the caller's client
    raises its ``ClientError`` (``code``, ``message``) as for the service's own answer."""
    http = AWSResponse(f"https://{service}.us-east-1.amazonaws.com/", status, HTTPHeaders(), None)  # type: ignore[arg-type]
    metadata = {"HTTPStatusCode": status, "HTTPHeaders": {}, "RetryAttempts": 0}
    return http, {"Error": {"Code": code, "Message": message}, "ResponseMetadata": metadata}

class ApiHooks:
    """Per-operation listeners behind the botocore hooks ``LocalAws`` registers.

    * ``on_before_call(service, operation, fn)``: ``fn(params, context)`` sees the
      API parameters (as the caller passed them) before the call; returning
      ``(http_response, parsed)`` short-circuits it (the caller gets ``parsed``).
    * ``on_after_call(service, operation, fn)``: ``fn(params, status, parsed,
      context)`` sees every completed call (``parsed`` may be modified in place).

    ``service`` is the botocore service id in event-name form ("ecs", "ec2", "ssm").
    ``context`` is botocore's per-call dict: before- and after-call share it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._before: dict[tuple[str, str], list[BeforeCall]] = {}
        self._after: dict[tuple[str, str], list[AfterCall]] = {}

    def on_before_call(self, service: str, operation: str, fn: BeforeCall, *, first: bool = False) -> None:
        """``first``: ahead of the listeners registered before it (the simulator's own, which
        answer the call: one that changes the world the call meets must see it first)."""
        with self._lock:
            listeners = self._before.setdefault((service, operation), [])
            listeners.insert(0 if first else len(listeners), fn)

    def on_after_call(self, service: str, operation: str, fn: AfterCall) -> None:
        with self._lock:
            self._after.setdefault((service, operation), []).append(fn)

    def clear(self) -> None:
        with self._lock:
            self._before.clear()
            self._after.clear()

    # --- botocore handlers -------------------------------------------------------
    @staticmethod
    def _key(model: Any) -> tuple[str, str]:
        service_id = model.service_model.service_id
        try:
            service = _EVENT_SERVICE[service_id]
        except KeyError:  # a pure function of the service id (three lookups a call otherwise)
            service = _EVENT_SERVICE[service_id] = service_id.hyphenize()
        return service, model.name

    def stash_params(self, params: dict[str, Any], model: Any, context: Any = None, **_: Any):
        """The parameters as the caller passed them, for this call's listeners (none: no copy;
        listeners are registered while the world is set up, before the calls they watch)."""
        if context is None:
            return
        key = self._key(model)
        with self._lock:
            if key not in self._before and key not in self._after:
                return
        try:
            context[PARAMS_KEY] = copy.deepcopy(params)
        except Exception:  # streaming bodies and the like
            context[PARAMS_KEY] = dict(params)

    def before_call(self, model: Any, params: Any, context: Any = None, **_: Any) -> Any:
        key = self._key(model)
        with self._lock:
            fns = list(self._before.get(key, ()))
        if not fns or context is None:
            return None
        context["local_mode_request"] = params
        api_params = context.get(PARAMS_KEY, {})
        for fn in fns:
            result = fn(api_params, context)
            if result is not None:
                return result
        return None

    def after_call(
        self, http_response: Any, parsed: Any, model: Any, context: Any = None, **_: Any
    ) -> None:
        key = self._key(model)
        with self._lock:
            fns = list(self._after.get(key, ()))
        if not fns or context is None:
            return
        status = getattr(http_response, "status_code", 200)
        api_params = context.get(PARAMS_KEY, {})
        for fn in fns:
            fn(api_params, status, parsed, context)
