"""Scheduled sweep (every minute): reboot and health-check timeouts, retries, crash recovery."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from handlers._common import powertools

logger, tracer, metrics = powertools("recovery-sweep")


@logger.inject_lambda_context(correlation_id_path="id")
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The schedule's event carries nothing the sweep needs; time comes from the clock. Its
    # budget is the invocation's remaining time: what it leaves waits for the next sweep.
    service = runtime.recovery_service(runtime.PowertoolsMetrics(metrics))
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    time_left = (lambda: remaining() / 1000.0) if callable(remaining) else None
    outcome = service.sweep(time_left).as_dict()
    logger.info("sweep done", extra=outcome)
    return outcome
