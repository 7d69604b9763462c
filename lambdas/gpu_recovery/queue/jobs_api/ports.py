"""What the jobs API's use cases ask AWS, through the adapters ``runtime.jobs_service``
builds (each turns the errors shown to the caller into exceptions of its own)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class JobsEcs(Protocol):
    """What the service asks ECS (``adapters.ecs.EcsAdapter``)."""

    cluster: str

    def stop_task_if_known(self, task_arn: str, reason: str) -> bool: ...

    def container_instances(self, statuses: Sequence[str | None] = ...) -> list[dict[str, Any]]: ...


class TaskDefinitionReader(Protocol):
    """``adapters.task_definitions.TaskDefinitions`` (raises TaskDefinitionNotFound)."""

    def describe(self, ref: str) -> dict[str, Any]: ...


class LogReader(Protocol):
    """``adapters.logs.TrainingLogReader`` (raises LogStreamNotFound, InvalidLogToken)."""

    def read_stream(self, group: str, stream: str, *, limit: int,
                    next_token: str | None = None) -> dict[str, Any]: ...

