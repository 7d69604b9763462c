"""The records of the scale simulator's ECS cluster (:class:`~local_mode.sim.ecs_cluster.EcsCluster`):
task definitions, GPU nodes (container instances), the tasks they run, and the CloudWatch
Logs lines the tasks print. Named apart from the moto data plane's records
(:mod:`~local_mode.sim.ecs_model`): these hold the whole ECS state themselves (no moto
behind them), so a task refers to its node and definition objects, and its tags are the
ECS API's list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TaskDefinition:
    arn: str
    family: str
    revision: int
    gpus: int
    container: str = "trainer"
    image: str = "trainer:latest"
    memory: int = 4096


@dataclass
class ClusterNode:
    """A GPU host and its ECS container instance."""

    name: str
    kind: str  # "ec2" | "anywhere"
    instance_id: str
    arn: str
    gpu_ids: list[str]
    registered_at: float
    boot_time: float
    health: str = "healthy"
    agent_connected: bool = True
    status: str = "ACTIVE"
    version: int = 1
    rebooting: bool = False
    reboots: int = 0
    allocations: dict[str, list[str]] = field(default_factory=dict)  # task arn -> GPU ids
    attributes: dict[str, str | None] = field(default_factory=dict)  # custom ECS attributes (cordon)

    @property
    def id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]

    def free_gpus(self) -> list[str]:
        used = {g for ids in self.allocations.values() for g in ids}
        return [g for g in self.gpu_ids if g not in used]


@dataclass
class ClusterTask:
    arn: str
    node: ClusterNode
    definition: TaskDefinition
    group: str
    started_by: str
    overrides: dict[str, Any]
    tags: list[dict[str, str]]
    gpu_ids: list[str]
    created_at: float
    health_check: bool
    container_arn: str
    last_status: str = "PENDING"
    desired_status: str = "RUNNING"
    started_at: float | None = None
    stopping_at: float | None = None
    stopped_at: float | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_code: int | None = None
    version: int = 1
    updated_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.last_status == "STOPPED"

    @property
    def tag_values(self) -> dict[str, str]:
        return {t["key"]: t["value"] for t in self.tags}


class LogStore:
    """CloudWatch Logs: lines by (group, stream) (what the tasks print, the health check's
    verdict among them; :class:`~local_mode.sim.aws_stand_ins.LogsClient` reads it)."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def put(self, group: str, stream: str, at: float, message: str) -> None:
        self.streams.setdefault((group, stream), []).append(
            {"timestamp": int(at * 1000), "message": message, "ingestionTime": int(at * 1000)})
