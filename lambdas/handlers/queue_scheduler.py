"""Queue scheduler tick: every minute (EventBridge schedule) and after submit/cancel/job end.

The event carries nothing the tick needs (schedule event or ``{"reason": ...}`` from an
async invoke); the tick reads the queue and the cluster itself. Reserved concurrency 1
plus the scheduler lease keep exactly one tick running.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from handlers._common import powertools

logger, tracer, metrics = powertools("queue-scheduler")
SAFETY_MARGIN_SECONDS = 20


@logger.inject_lambda_context(correlation_id_path="id")
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    budget = None
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if callable(remaining):
        budget = max(1.0, remaining() / 1000 - SAFETY_MARGIN_SECONDS)
    scheduler = runtime.queue_scheduler(runtime.PowertoolsMetrics(metrics))
    result = scheduler.tick(time_budget_seconds=budget)
    metrics.add_metric(name="JobsAdmitted", unit=MetricUnit.Count, value=len(result.admitted))
    metrics.add_metric(name="LaunchFailures", unit=MetricUnit.Count, value=result.launch_failures)
    metrics.add_metric(name="QueueDepthRead", unit=MetricUnit.Count, value=result.queue_items_read)
    outcome = result.as_dict()
    trigger = (event or {}).get("reason") or (event or {}).get("detail-type") or "invoke"
    logger.info("scheduler tick done", extra={**outcome, "trigger": trigger})
    return outcome
