"""What the recovery stages need from the outside world, and what they return."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import StartResult
from gpu_recovery.domain.notifications import Notification

logger = logging.getLogger(__name__)


class EcsPort(Protocol):
    cluster: str

    def start_task(self, *, task_definition: str, container_instance_arn: str = "",
                   overrides: dict[str, Any] | None = None,
                   tags: list[dict[str, str]] | None = None, started_by: str = "",
                   group: str | None = None, container_instance_arns: Sequence[str] = (),
                   network_configuration: dict[str, Any] | None = None) -> StartResult: ...
    def stop_task(self, task_arn: str, reason: str) -> None: ...
    def stop_task_before_deadline(self, task_arn: str, reason: str) -> None: ...
    def prepay(self, calls: int, *, in_turn_within: float | None = None) -> None: ...
    def describe_task(self, task_arn: str) -> dict[str, Any] | None: ...
    def describe_tasks(self, task_arns: Sequence[str]) -> list[dict[str, Any]]: ...
    def tasks_started_by(self, started_by: str) -> list[str]: ...
    def stopped_task_started_by(self, container_instance: str, started_by: str) -> dict[str, Any] | None: ...
    def tasks_tagged(self, tag_key: str, tag_value: str) -> list[dict[str, Any]]: ...
    def describe_container_instance(self, container_instance: str) -> dict[str, Any] | None: ...
    def is_agent_connected(self, container_instance: str) -> bool | None: ...
    def drain(self, container_instance_arn: str) -> str: ...
    def put_attributes(self, container_instance: str, attributes: Mapping[str, str]) -> bool: ...
    def delete_attributes(self, container_instance: str, names: Sequence[str]) -> bool: ...
    def put_attributes_many(self, entries: Sequence[tuple[str, str, str]]) -> set[str]: ...
    def delete_attributes_many(self, entries: Sequence[tuple[str, str]]) -> set[str]: ...
    def container_instances(self, statuses: Sequence[str | None] = ..., *, query: str | None = None,
                            missing_ok: bool = True) -> list[dict[str, Any]]: ...
    def describe_container_instances(self, refs: Sequence[str]) -> dict[str, dict[str, Any]]: ...
    def tasks_on(self, container_instance: str) -> list[dict[str, Any]]: ...


class ReadsEcsAgent(Protocol):
    """ECS's word on a node's agent (connected, disconnected; None: ECS does not know it)."""

    def is_agent_connected(self, container_instance: str) -> bool | None: ...


class StopsTasks(Protocol):
    """A stage that only stops its own node tasks (a reset, a validation)."""

    def stop_task(self, task_arn: str, reason: str) -> None: ...


class ListsContainerInstances(Protocol):
    """ListContainerInstances (and their descriptions) of the cluster."""

    def container_instances(self, statuses: Sequence[str | None] = ..., *, query: str | None = None,
                            missing_ok: bool = True) -> list[dict[str, Any]]: ...


class StopsAndDescribesTasks(StopsTasks, Protocol):
    """The health check's sweep: a check looked at (its STOPPED event lost), or stopped (timed out)."""

    def describe_task(self, task_arn: str) -> dict[str, Any] | None: ...


class RebootPort(Protocol):
    def reboot(self, instance_id: str, reason: str) -> str: ...


class ReplacePort(Protocol):
    """Replacement of an EC2 node in its Auto Scaling group (replace_action terminate_in_asg)."""

    def groups_of(self, instance_ids: list[str]) -> dict[str, tuple[str, str]]: ...
    def terminate_in_asg(self, instance_id: str) -> str: ...


class NoReplacer:
    """No Auto Scaling access configured: every node looks outside any group."""

    def groups_of(self, instance_ids: list[str]) -> dict[str, tuple[str, str]]:
        return {}

    def terminate_in_asg(self, instance_id: str) -> str:
        raise RuntimeError("no Auto Scaling client configured")


class NotifierPort(Protocol):
    def publish(self, notification: Notification) -> str: ...


class VerdictReaderPort(Protocol):
    def read_verdict(self, task_arn: str) -> dict[str, Any] | None: ...


class RedeliveryPort(Protocol):
    """A worker's failed queue messages, brought back sooner (``adapters.queue.Redeliveries``)."""

    def bring_forward(self, records: Sequence[Mapping[str, Any]]) -> int: ...


class MetricsPort(Protocol):
    def add_metric(self, name: str, unit: str, value: float) -> None: ...

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        """A count flushed at once (``runtime.PowertoolsMetrics``: Powertools' single metric), not
        with the invocation's metrics at its end: a count of something done once (its record gone
        with it) is not lost with an invocation that times out afterwards, the next run finding
        nothing left to count."""
        ...


class NullMetrics:
    def add_metric(self, name: str, unit: str, value: float) -> None:
        return None

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        return None


class MetricsRelay:
    """The one metrics port every stage of a service holds: each Lambda invocation points it
    at that invocation's metrics (``RecoveryService.metrics``), and no stage is re-wired."""

    def __init__(self, target: MetricsPort | None = None) -> None:
        self.target: MetricsPort = target or NullMetrics()

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.target.add_metric(name, unit, value)

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        self.target.add_metric_now(name, unit, value)

    def __getattr__(self, name: str) -> Any:
        # What the target has beyond the port (Powertools' dimensioned metric), as it has it.
        target = self.__dict__.get("target")
        if target is None:
            raise AttributeError(name)
        return getattr(target, name)


@dataclass(frozen=True)
class Invocation:
    """The Lambda invocation an event is handled in: its request id (Lambda's retry of a
    failed asynchronous invocation keeps it; a duplicate delivery has its own) and its
    deadline on ``clock`` (after it the invocation cannot be running)."""

    request_id: str
    deadline: float

    @classmethod
    def of(cls, request_id: str | None, time_left: Callable[[], float] | None) -> Invocation | None:
        """From a handler's context (None without a request id and a time left)."""
        if not request_id or time_left is None:
            return None
        return cls(request_id, clock.now() + time_left())


@dataclass
class Outcome:
    """What a handler did, returned to Lambda (visible in logs and tests)."""

    action: str
    job_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "job_id": self.job_id, **self.detail}


def after_commit(what: str, step: Callable[..., Any], *args: Any) -> Any:
    """Run ``step(*args)``: work that follows a committed decision (its reboot, drain,
    restart, cordon sync). Each such effect has its own intent and deadline in the committed
    state, so the sweep carries it out if it fails here: the failure is logged, never raised
    (a retried event would find the decision applied and could not see what was left).
    Returns the step's result, or None when it failed."""
    try:
        return step(*args)
    except Exception:
        logger.warning("work after a committed decision failed; the sweep finishes it",
                       exc_info=True, extra={"step": what})
        return None
