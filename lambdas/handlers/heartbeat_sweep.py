"""Scheduled (every minute): stale heartbeats -> NODE_LOST; NODE_LOST too long -> recovery."""

from __future__ import annotations

from typing import Any

from gpu_recovery import runtime
from gpu_recovery.heartbeat.service import HeartbeatService
from handlers._common import TimeLeft, entry_point, powertools

logger, tracer, metrics = powertools("heartbeat-sweep")


def handle(event: dict[str, Any], service: HeartbeatService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``). The schedule's event carries nothing the sweep needs;
    time comes from the clock."""
    outcome = service.sweep().as_dict()
    logger.info("heartbeat sweep done", extra=outcome)
    return outcome


lambda_handler = entry_point(logger, tracer, metrics, lambda: handle,
                             lambda port: runtime.heartbeat_service(port))
