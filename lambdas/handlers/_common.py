"""Powertools objects, the malformed-event guard and the shape of a handler's body, shared by
the recovery handlers.

Each handler module has two functions: ``handle(event, service, *, time_left=None,
request_id=None)``, the body (parse the event with its model, drop a malformed one, call the
service, log the outcome; an SQS handler answers with its partial batch response), and
``lambda_handler``, the Lambda entry point (Powertools' logger, tracer and metrics around
``handle``, the service from ``gpu_recovery.runtime``, the time left and request id from
Lambda's context: ``entry_point``). The simulators call ``handle`` with a service of their own (one per
simulated container), the simulated time left and the invocation's request id: one body
for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.parser import parse
from pydantic import BaseModel, ValidationError

from gpu_recovery import clock, runtime
from gpu_recovery.metric_names import METRICS_NAMESPACE

ModelT = TypeVar("ModelT", bound=BaseModel)


def powertools(service: str) -> tuple[Logger, Tracer, Metrics]:
    return (
        Logger(service=service),
        Tracer(service=service),
        Metrics(namespace=METRICS_NAMESPACE, service=service),
    )


def parse_or_drop(
    event: dict[str, Any], model: type[ModelT], logger: Logger
) -> ModelT | None:
    """Parse an event; a malformed one is logged and dropped (retrying cannot fix it)."""
    try:
        return parse(event=event, model=model)
    except (ValidationError, ValueError, TypeError) as error:
        logger.warning(
            "malformed event dropped",
            extra={"error": str(error)[:2000], "event_id": (event or {}).get("id")
                   if isinstance(event, dict) else None},
        )
        return None


def dropped(reason: str) -> dict[str, Any]:
    return {"action": "dropped", "why": reason}


TimeLeft = Callable[[], float]


def remaining_time(context: Any) -> TimeLeft | None:
    """Seconds left in the invocation, as Lambda's context tells them (None without one)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return (lambda: remaining() / 1000.0) if callable(remaining) else None


def request_id_of(context: Any) -> str | None:
    """The invocation's ``aws_request_id`` (Lambda's retry of a failed asynchronous
    invocation keeps it; None without a context)."""
    return getattr(context, "aws_request_id", None) or None


class Handle(Protocol):
    """A handler's body: the event, the service it calls, the invocation's time left and
    request id (the bodies that need neither ignore them)."""

    def __call__(self, event: dict[str, Any], service: Any, *,
                 time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]: ...


def run_body(handle: Handle, event: dict[str, Any], service: Any, *, time_left: TimeLeft | None,
             request_id: str | None) -> dict[str, Any]:
    """One invocation of a handler's body (``lambda_handler``, and the scale simulation's
    functions): the waits deep below the services (the ECS budget's turns, a BatchGetItem's
    back-off) end inside it (``clock.deadline``), not in Lambda's timeout, mid-call."""
    with clock.invocation_ends(time_left):
        return handle(event, service, time_left=time_left, request_id=request_id)


def entry_point(logger: Logger, tracer: Tracer, metrics: Metrics, body: Callable[[], Handle],
                service: Callable[[runtime.PowertoolsMetrics], Any], *,
                correlation_id_path: str | None = "id") -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """A handler module's ``lambda_handler``: ``body()`` (its ``handle``) run with the service
    ``service`` builds over the invocation's metrics, the context's time left and request id,
    inside Powertools' logger, tracer and metrics. Both are looked up at each invocation (tests
    swap a module's ``handle`` and ``gpu_recovery.runtime``'s factories)."""

    @logger.inject_lambda_context(correlation_id_path=correlation_id_path)
    @tracer.capture_lambda_handler
    @metrics.log_metrics
    def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return run_body(body(), event, service(runtime.PowertoolsMetrics(metrics)),
                        time_left=remaining_time(context), request_id=request_id_of(context))

    return lambda_handler
