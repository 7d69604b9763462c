"""DescribeTaskDefinition for the queue: the jobs API pins and checks a submitted task
definition, the scheduler reads the container to override (cached)."""

from __future__ import annotations

import threading
import time
from typing import Any

from botocore.exceptions import ClientError

# What ECS answers for a task definition it does not know (an unknown family or revision,
# a malformed ARN). Anything else (throttling, denied, 5xx) is raised as it came.
NOT_FOUND_CODES = ("ClientException", "InvalidParameterException")


class TaskDefinitionNotFound(LookupError):
    """ECS does not know the task definition; ``code``/``message`` are ECS's answer."""

    def __init__(self, ref: str, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.ref = ref
        self.code = code
        self.message = message


class TaskDefinitions:
    """DescribeTaskDefinition, cached ``ttl_seconds`` per reference (0: never cached).

    The scheduler caches (a tick describes the same few definitions over and over; a
    revision is immutable, and a family name resolves to a new revision within the TTL).
    The jobs API does not: a submit pins the latest revision ECS has right now.
    """

    def __init__(self, ecs_client: Any, ttl_seconds: float = 300) -> None:
        self._ecs = ecs_client
        self._ttl = ttl_seconds
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def describe(self, ref: str) -> dict[str, Any]:
        """The ``taskDefinition`` ECS describes; raises :class:`TaskDefinitionNotFound`."""
        if self._ttl > 0:
            with self._lock:
                hit = self._cache.get(ref)
            if hit and time.monotonic() - hit[0] < self._ttl:
                return hit[1]
        try:
            td: dict[str, Any] = self._ecs.describe_task_definition(taskDefinition=ref)["taskDefinition"]
        except ClientError as error:
            err = error.response.get("Error", {})
            code = str(err.get("Code", ""))
            if code in NOT_FOUND_CODES:
                raise TaskDefinitionNotFound(ref, code, str(err.get("Message", ""))) from error
            raise
        if self._ttl > 0:
            with self._lock:
                self._cache[ref] = (time.monotonic(), td)
        return td
