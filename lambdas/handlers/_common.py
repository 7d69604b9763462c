"""Powertools objects and the malformed-event guard shared by the recovery handlers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.parser import parse
from pydantic import BaseModel, ValidationError

from gpu_recovery.constants import METRICS_NAMESPACE

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


Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
