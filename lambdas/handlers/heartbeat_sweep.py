"""Scheduled (every minute): stale heartbeats -> NODE_LOST; NODE_LOST too long -> recovery."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from handlers._common import powertools

logger, tracer, metrics = powertools("heartbeat-sweep")


@logger.inject_lambda_context(correlation_id_path="id")
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The schedule's event carries nothing the sweep needs; time comes from the clock.
    outcome = runtime.heartbeat_service(runtime.PowertoolsMetrics(metrics)).sweep().as_dict()
    logger.info("heartbeat sweep done", extra=outcome)
    return outcome
