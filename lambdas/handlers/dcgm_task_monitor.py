"""The DCGM health-check task (or the GPU reset task, same rule) stopped: apply its verdict (available,
reboot, quarantine) or the reset's result."""

from __future__ import annotations

from typing import Any

from gpu_recovery import runtime
from gpu_recovery.events.ecs import EcsTaskStateChangeEvent
from gpu_recovery.recovery import Invocation, RecoveryService
from handlers._common import TimeLeft, dropped, entry_point, parse_or_drop, powertools

logger, tracer, metrics = powertools("dcgm-task-monitor")


def handle(event: dict[str, Any], service: RecoveryService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``): a stopped health-check (or reset) task to the service."""
    parsed = parse_or_drop(event, EcsTaskStateChangeEvent, logger)
    if parsed is None:
        return dropped("malformed ECS Task State Change event")
    if parsed.detail.lastStatus != "STOPPED":
        return {"action": "ignored", "why": f"lastStatus {parsed.detail.lastStatus}"}
    # The invocation holds the verdict's lease while it works it (a duplicate copy waits).
    outcome = service.on_health_check_stopped(parsed.detail, Invocation.of(request_id, time_left)).as_dict()
    logger.info("health-check event handled", extra=outcome)
    return outcome


lambda_handler = entry_point(logger, tracer, metrics, lambda: handle,
                             lambda port: runtime.recovery_service(port))
