"""Container instance state changes: notice a rebooted node coming back, restart its jobs.
Also AWS's notices that instances go away (EC2's, AWS Health's: docs/aws-notices.md)."""

from __future__ import annotations

from typing import Any

from gpu_recovery import runtime
from gpu_recovery.domain.aws_notices import EC2_SOURCE, HEALTH_SOURCE
from gpu_recovery.events.ecs import EcsContainerInstanceStateChangeEvent
from gpu_recovery.recovery import RecoveryService
from handlers._common import TimeLeft, dropped, entry_point, parse_or_drop, powertools

logger, tracer, metrics = powertools("ecs-instance-monitor")
AWS_NOTICE_SOURCES = (EC2_SOURCE, HEALTH_SOURCE)


def handle(event: dict[str, Any], service: RecoveryService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``): a container instance's state change to the service;
    an EC2 or AWS Health notice (its own rules) to the notice stage."""
    if event.get("source") in AWS_NOTICE_SOURCES:
        notice = service.on_aws_notice(event).as_dict()
        logger.info("AWS notice handled", extra=notice)
        return notice
    parsed = parse_or_drop(event, EcsContainerInstanceStateChangeEvent, logger)
    if parsed is None:
        return dropped("malformed ECS Container Instance State Change event")
    outcome = service.on_container_instance_change(parsed.detail, parsed.time).as_dict()
    logger.info("instance event handled", extra=outcome)
    return outcome


lambda_handler = entry_point(logger, tracer, metrics, lambda: handle,
                             lambda port: runtime.recovery_service(port))
