"""What the heartbeat service needs from the rest of the stack (runtime.py passes them in)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from gpu_recovery.constants import JobState
from gpu_recovery.domain.models import Rank


class EcsPort(Protocol):
    def describe_container_instance(self, container_instance: str) -> dict[str, Any] | None: ...


class RecoveryPort(Protocol):
    def report_suspected_fault(self, job_id: str, attempt: int, inst_id: str, reason: str,
                               failing_rank: int | None = None,
                               from_states: Iterable[JobState] = ...) -> Any: ...
    def on_boot_reported(self, inst_id: str, boot_time: float) -> Any: ...

    # Lost ranks whose tasks ECS describes STOPPED handled as their lost STOPPED events: the
    # ranks still live.
    def live_after_lost_stops(self, ranks: list[Rank]) -> list[Rank]: ...

    # A driver warning just recorded on the node: what needs no repair, at once.
    def gpu_warning(self, inst_id: str) -> Any: ...

    # The recovery loop's node decisions (the breaker, observe mode, the node's history):
    # a node lost with its ECS agent disconnected is one of them; ``host_reporting``: its node
    # agent still reports, so the job fails and the node is only flagged SUSPECT.
    def node_unreachable(self, job_id: str, attempt: int, inst_id: str, lost: list[Rank], lost_since: float,
                         why: str, host_reporting: bool = ...) -> str: ...


class MetricsPort(Protocol):
    def add_metric(self, name: str, unit: str, value: float) -> None: ...



class NullMetrics:
    def add_metric(self, name: str, unit: str, value: float) -> None:
        return None
