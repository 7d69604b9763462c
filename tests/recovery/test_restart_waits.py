"""A restart's look at its nodes (``recovery.restart_waits``), on fakes of its ports: what it
asks ECS is bounded by what its wait names, not by how many nodes are blocked."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import JobState, RankState
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.restart_wait import NAMED_BLOCKED_NODES, RestartWait
from gpu_recovery.recovery.restart_waits import RestartWaits

NODES = [f"node-{i:02d}" for i in range(12)]


class Ranks:
    def __init__(self) -> None:
        self.ranks = [Rank(job_id="j", rank=i, state=RankState.STOPPED, attempt=1, task_arn=f"task-{i}",
                           task_definition_arn="td", container_inst_id=node, gpus=8)
                      for i, node in enumerate(NODES)]

    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]:
        return self.ranks[first:last]


class BusyCluster:
    """Every node ACTIVE, its agent connected, all its GPUs held by another scheduler's task."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def describe_container_instances(self, refs: Any) -> dict[str, dict[str, Any]]:
        return {ref: {"status": "ACTIVE", "agentConnected": True,
                      "remainingResources": [{"name": "GPU", "type": "STRINGSET", "stringSetValue": []}]}
                for ref in refs}

    def tasks_on(self, container_instance: str) -> list[dict[str, Any]]:
        self.asked.append(container_instance)
        return [{"taskArn": f"arn:aws:ecs:us-east-1:1:task/c/{container_instance}-web", "group": "family:web",
                 "startedBy": "other-scheduler"}]


def test_a_restart_blocked_on_many_busy_nodes_asks_what_holds_only_the_nodes_its_wait_names() -> None:
    """Given a 12-rank job's restart whose 12 nodes are all busy, When it looks at its nodes, Then
    every node is blocked, ECS is asked what holds the first five only (ListTasks and
    DescribeTasks each: not two calls per blocked node), and the wait names those five with
    their holders and counts the seven others."""
    ecs = BusyCluster()
    waits = RestartWaits(Ranks(), None, ecs, lambda *_: None,  # type: ignore[arg-type]
                         wait_seconds=1800, metrics=None)  # type: ignore[arg-type]
    blocked = waits.blocked(Job("j", JobState.PENDING_RESTART, len(NODES)))
    assert sorted(blocked) == NODES
    assert ecs.asked == NODES[:NAMED_BLOCKED_NODES]
    wait = RestartWait.start(1, 0.0, 1800, blocked)
    reason = wait.waiting_reason()
    assert all(f"{node}: RESOURCE:GPU" in reason and f"held by task {node}-web (group family:web" in reason
               for node in NODES[:NAMED_BLOCKED_NODES])
    assert reason.endswith("and 7 more node(s)") and wait.total == len(NODES)
