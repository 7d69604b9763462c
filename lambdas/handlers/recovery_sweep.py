"""Scheduled sweep (every minute): reboot and health-check timeouts, retries, crash recovery."""

from __future__ import annotations

from typing import Any

from gpu_recovery import runtime
from gpu_recovery.recovery import RecoveryService
from handlers._common import TimeLeft, entry_point, powertools

logger, tracer, metrics = powertools("recovery-sweep")


def handle(event: dict[str, Any], service: RecoveryService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``). The schedule's event carries nothing the sweep needs;
    time comes from the clock. Its budget is the invocation's time left: what it leaves
    waits for the next sweep."""
    outcome = service.sweep(time_left).as_dict()
    logger.info("sweep done", extra=outcome)
    return outcome


lambda_handler = entry_point(logger, tracer, metrics, lambda: handle,
                             lambda port: runtime.recovery_service(port))
