"""The tasks the stack runs on one node (a health check, a GPU reset, a validation after
repair): each kind declared once (:class:`NodeTaskKind`), each started the one way
(:class:`NodeTaskStarts`).

Every kind's start is crash-consistent the same way: the stage has claimed the node with a
``startedBy`` deterministic per claim (``domain.started_by.node_task``) before StartTask; a
claim taken over (its claimer died, or StartTask's answer was lost) looks its task up by that
``startedBy`` first; a refused StartTask (nothing started) gives the claim back at once, any
other error keeps it until its lease expires (the task may have started: the next try looks it
up). What differs between kinds is data (the task definition, its group and tag, the container
its environment goes to) and what the stage does with a task not placed or started, which
stays the stage's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter

from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.adapters.errors import refused
from gpu_recovery.constants import (
    GPU_RESET_GROUP,
    GPU_VALIDATION_GROUP,
    HEALTH_CHECK_CONTAINER_NAME,
    HEALTH_CHECK_GROUP,
)
from gpu_recovery.domain.models import Instance
from gpu_recovery.recovery.ports import Deps
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

PURPOSE_TAG = "gpu-recovery:purpose"


@dataclass(frozen=True)
class NodeTaskKind:
    """One kind of task the stack runs on a node, as data."""

    name: str  # in logs: "<name> started"
    group: str  # the ECS task group (its STOPPED events are routed by it)
    purpose: str  # the gpu-recovery:purpose tag's value
    started_metric: str
    task_definition: Callable[[Settings], str]
    container: str = ""  # the container an environment is handed to ("": none is)


HEALTH_CHECK = NodeTaskKind("health check", HEALTH_CHECK_GROUP, "dcgm-health-check", "HealthChecksStarted",
                            attrgetter("health_check_task"))
GPU_RESET = NodeTaskKind("GPU reset", GPU_RESET_GROUP, "gpu-reset", "GpuResetsStarted",
                         attrgetter("gpu_reset_task"))
# The validation runs the health check's image under load (its level and load in its environment).
VALIDATION = NodeTaskKind("validation", GPU_VALIDATION_GROUP, "post-repair-validation", "ValidationsStarted",
                          attrgetter("health_check_task"), container=HEALTH_CHECK_CONTAINER_NAME)


@dataclass(frozen=True)
class Placed:
    """StartTask's answer: the task started, or why ECS placed nothing (its failures)."""

    task_arn: str | None
    reasons: str = ""


class NodeTaskStarts:
    """Starts a claimed node's task of any kind; the stage records it (``record``)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def found(self, started_by: str) -> str | None:
        """The task a claim taken over may have started already (looked up by its startedBy)."""
        tasks = self.deps.ecs.tasks_started_by(started_by)
        return tasks[0] if tasks else None

    def start(self, kind: NodeTaskKind, instance: Instance, started_by: str, *,
              release: Callable[[], object], record: Callable[[str], object],
              environment: Mapping[str, str] | None = None, turn_within: float | None = None) -> Placed:
        """StartTask of ``kind`` on ``instance`` (``turn_within``: once the stack's ECS budget
        gives it a turn within that many seconds, else :class:`RateLimited`, StartTask never
        called). Refused: ``release()`` and the error raised; placed: ``record(task_arn)``."""
        overrides = None
        if kind.container:
            overrides = {"containerOverrides": [{"name": kind.container, "environment": [
                {"name": name, "value": value} for name, value in sorted((environment or {}).items())]}]}
        inst_id = instance.container_inst_id
        try:
            if turn_within is not None:
                self.deps.ecs.prepay(1, in_turn_within=turn_within)
            result = self.deps.ecs.start_task(
                task_definition=kind.task_definition(self.deps.settings),
                container_instance_arn=instance.container_instance_arn or inst_id,
                overrides=overrides, started_by=started_by, group=kind.group,
                tags=[{"key": PURPOSE_TAG, "value": kind.purpose}],
            )
        except RateLimited:
            raise  # never called: the stage decides when to try again
        except Exception as error:
            if refused(error):  # nothing was started: the next try may start it
                release()
            # Otherwise it may have started: the lease expires and the next try looks it up.
            raise
        if not result.task_arns:
            return Placed(None, result.reasons())
        task_arn = result.task_arns[0]
        record(task_arn)
        self.deps.metrics.add_metric(kind.started_metric, "Count", 1)
        logger.info(f"{kind.name} started", extra={"instance": inst_id, "task": task_arn})
        return Placed(task_arn)
