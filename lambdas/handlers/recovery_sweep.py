"""Scheduled sweep (every minute): reboot and health-check timeouts, retries, crash recovery."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from gpu_recovery.recovery import RecoveryService
from handlers._common import TimeLeft, powertools, remaining_time

logger, tracer, metrics = powertools("recovery-sweep")


def handle(event: dict[str, Any], service: RecoveryService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``). The schedule's event carries nothing the sweep needs;
    time comes from the clock. Its budget is the invocation's time left: what it leaves
    waits for the next sweep."""
    outcome = service.sweep(time_left).as_dict()
    logger.info("sweep done", extra=outcome)
    return outcome


@logger.inject_lambda_context(correlation_id_path="id")
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handle(event, runtime.recovery_service(runtime.PowertoolsMetrics(metrics)),
                  time_left=remaining_time(context))
