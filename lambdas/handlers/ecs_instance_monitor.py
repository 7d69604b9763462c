"""Container instance state changes: notice a rebooted node coming back, restart its jobs."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from gpu_recovery.events.ecs import EcsContainerInstanceStateChangeEvent
from handlers._common import dropped, parse_or_drop, powertools

logger, tracer, metrics = powertools("ecs-instance-monitor")


@logger.inject_lambda_context(correlation_id_path="id")
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    parsed = parse_or_drop(event, EcsContainerInstanceStateChangeEvent, logger)
    if parsed is None:
        return dropped("malformed ECS Container Instance State Change event")
    service = runtime.recovery_service(runtime.PowertoolsMetrics(metrics))
    outcome = service.on_container_instance_change(parsed.detail, parsed.time).as_dict()
    logger.info("instance event handled", extra=outcome)
    return outcome
