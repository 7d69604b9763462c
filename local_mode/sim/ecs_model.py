"""The records of the simulated ECS data plane, one family for both worlds: GPU nodes
(container instances), the tasks they run, task definitions (the in-memory control plane's;
the moto world reads moto's), run plans and the timeline the demo prints.

A task names its node (``Task.node`` is the node's name) and carries its tags as a dict
(``Task.tag_list`` is the ECS API's list); ``Node.container_instance_arn`` is the container
instance's ARN. ``Node.status`` and ``Node.attributes`` are the control plane's: the
in-memory one (``ecs_cluster``) keeps them here, the moto world keeps them in step with
moto's container instance (moto's record answers the API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpu_recovery import constants as C


class TimelineEntry(NamedTuple):
    time: float
    kind: str
    text: str


@dataclass
class TaskDefinition:
    """A task definition of the in-memory control plane (one essential container)."""

    arn: str
    family: str
    revision: int
    gpus: int
    container: str = "trainer"
    image: str = "trainer:latest"
    memory: int = 4096


@dataclass
class Node:
    """One simulated GPU host and its ECS container instance."""

    name: str
    kind: str  # "ec2" | "anywhere"
    instance_id: str
    container_instance_arn: str
    gpu_ids: list[str]
    boot_time: float
    registered_at: float
    health: str = "healthy"
    agent_connected: bool = True
    status: str = "ACTIVE"  # ACTIVE | DRAINING | INACTIVE (deregistered)
    allocations: dict[str, list[str]] = field(default_factory=dict)  # task arn -> gpu ids
    reservations: dict[int, list[str]] = field(default_factory=dict)  # pending StartTask
    attributes: dict[str, str | None] = field(default_factory=dict)  # custom ECS attributes (cordon)
    version: int = 1
    reboots: int = 0
    rebooting: bool = False
    reboot_requested_at: float | None = None

    @property
    def container_instance_id(self) -> str:
        return self.container_instance_arn.rsplit("/", 1)[-1]

    @property
    def used_gpus(self) -> set[str]:
        used = {g for ids in self.allocations.values() for g in ids}
        return used | {g for ids in self.reservations.values() for g in ids}

    @property
    def free_gpu_ids(self) -> list[str]:
        used = self.used_gpus
        return [g for g in self.gpu_ids if g not in used]


@dataclass
class Task:
    """A task the data plane runs (in the moto world it mirrors, and keeps in step, moto's
    Task; in the scale world it is the control plane's record too)."""

    arn: str
    node: str  # the node's name
    task_definition_arn: str
    family: str
    group: str
    started_by: str
    overrides: dict[str, Any]
    tags: dict[str, str]
    gpu_ids: list[str]
    containers: list[dict[str, Any]]
    created_at: float
    cpu: str = "0"
    memory: str = "0"
    last_status: str = "PENDING"
    desired_status: str = "RUNNING"
    started_at: float | None = None
    stopping_at: float | None = None
    stopped_at: float | None = None
    updated_at: float = 0.0
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_code: int | None = None
    version: int = 0
    plan_token: int = 0
    health_check: bool = False
    gpu_reset: bool = False  # the GPU reset task (a health check's kin: never a training task)

    @property
    def label(self) -> str:
        if self.gpu_reset:
            return "GPU reset"
        if self.health_check:
            return "health check"
        job, rank = self.tags.get(C.TAG_JOB_ID), self.tags.get(C.TAG_RANK)
        if job is not None:
            return f"rank {rank} of job {job}" if rank is not None else f"job {job}"
        return f"task {self.arn.rsplit('/', 1)[-1][:8]} ({self.family})"

    @property
    def done(self) -> bool:
        return self.last_status == "STOPPED"

    @property
    def tag_list(self) -> list[dict[str, str]]:
        """The tags as the ECS API lists them."""
        return [{"key": k, "value": v} for k, v in self.tags.items()]


@dataclass
class Plan:
    """How a task ends once RUNNING: ``exit_code`` after ``run_seconds`` (None: never)."""

    run_seconds: float | None
    exit_code: int = 0
