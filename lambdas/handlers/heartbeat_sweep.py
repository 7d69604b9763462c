"""Scheduled (every minute): stale heartbeats -> NODE_LOST; NODE_LOST too long -> recovery."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from gpu_recovery.heartbeat.service import HeartbeatService
from handlers._common import TimeLeft, powertools

logger, tracer, metrics = powertools("heartbeat-sweep")


def handle(event: dict[str, Any], service: HeartbeatService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``). The schedule's event carries nothing the sweep needs;
    time comes from the clock."""
    outcome = service.sweep().as_dict()
    logger.info("heartbeat sweep done", extra=outcome)
    return outcome


@logger.inject_lambda_context(correlation_id_path="id")
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handle(event, runtime.heartbeat_service(runtime.PowertoolsMetrics(metrics)))
