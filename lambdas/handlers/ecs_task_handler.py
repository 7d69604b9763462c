"""ECS task state changes of training tasks: register ranks, detect faults, finish jobs."""

from __future__ import annotations

from typing import Any

from gpu_recovery import runtime
from gpu_recovery.events.ecs import EcsTaskStateChangeEvent
from gpu_recovery.recovery import RecoveryService
from handlers._common import TimeLeft, dropped, entry_point, parse_or_drop, powertools

logger, tracer, metrics = powertools("ecs-task-handler")


def handle(event: dict[str, Any], service: RecoveryService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``): a task's state change to the service."""
    parsed = parse_or_drop(event, EcsTaskStateChangeEvent, logger)
    if parsed is None:
        return dropped("malformed ECS Task State Change event")
    outcome = service.on_task_state_change(parsed.detail).as_dict()
    logger.info("task event handled", extra=outcome)
    return outcome


lambda_handler = entry_point(logger, tracer, metrics, lambda: handle,
                             lambda port: runtime.recovery_service(port))
