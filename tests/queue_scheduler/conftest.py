"""A simulated GPU cluster (moto + SimulatedEcs GPU accounting) for the scheduler tick.

``SimulatedEcs`` answers DescribeContainerInstances with GPU remaining/registered
resources and refuses StartTask with ``failures [{"arn", "reason": "RESOURCE:GPU"}]``
when a node lacks GPUs, through botocore hooks on the handler session: the scheduler
only ever sees the ECS API as AWS documents it.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.adapters import aws
from gpu_recovery.adapters.ecs import EcsAdapter
from gpu_recovery.adapters.hosts import HostAddresses
from gpu_recovery.adapters.logs import TrainingLogReader
from gpu_recovery.adapters.task_definitions import TaskDefinitions
from gpu_recovery.constants import JobState
from gpu_recovery.queue.jobs_api.service import JobQueueService
from gpu_recovery.queue.scheduler import QueueScheduler, SchedulerConfig, build_scheduler
from gpu_recovery.repository import from_ddb, to_ddb
from gpu_recovery.repository.time_sharing import QuotaRepository
from gpu_recovery.settings import TimeSharingSettings


@dataclass
class QueueCluster:
    local: Any
    bus: Any
    sim: Any
    train_td: str
    submitted: list[str] = field(default_factory=list)
    _seq: int = 0

    @property
    def recovery(self) -> Any:
        return runtime.recovery_service()

    @property
    def repo(self) -> Any:
        return self.recovery.repo

    def table(self) -> Any:
        return aws.resource("dynamodb").Table(self.local.job_table)

    def scheduler(self, owner: str | None = None, **config: Any) -> QueueScheduler:
        """The tick as deployed (time sharing on: quotas, preemption, demotion), over the
        adapters runtime.queue_scheduler builds."""
        svc = self.recovery
        settings = SchedulerConfig(**{"sharing": TimeSharingSettings.from_env(), **config})
        return build_scheduler(
            repo=svc.repo, ecs_adapter=svc.ecs, recovery=svc,
            task_definitions=TaskDefinitions(aws.client("ecs")),
            hosts=HostAddresses(aws.client("ec2"), aws.client("ssm")), config=settings, owner=owner,
            quotas=QuotaRepository(aws.resource("dynamodb"), settings.sharing.quota_table),
        )

    def jobs_service(self) -> JobQueueService:
        """The jobs API's service on this cluster, as a trusted in-process caller (no access
        policy), over the adapters runtime.jobs_service builds."""
        ecs = aws.client("ecs")
        return JobQueueService(repo=self.repo, ecs=EcsAdapter(ecs, self.local.cluster_name),
                               task_definitions=TaskDefinitions(ecs, ttl_seconds=0),
                               log_reader=TrainingLogReader(aws.client("logs")))

    def submit(self, job_id: str | None = None, *, nnodes: int = 1, gpus: int = 8, priority: int = 0,
               submitted_at: float | None = None, task_definition: str | None = None,
               container_name: str | None = None, user: str = "alice", **extra: Any) -> str:
        """Write a queued job item exactly as the queue API's contract describes it."""
        self._seq += 1
        job_id = job_id or f"job-{self._seq:04d}"
        at = self.sim.now() + self._seq * 1e-3 if submitted_at is None else submitted_at
        spec = {"name": job_id, "task_definition": task_definition or self.train_td,
                "overrides": {"command": ["python", "train.py"], "environment": {"LR": "0.1"}},
                "nnodes": nnodes, "gpus_per_node": gpus, "priority": priority,
                "max_recovery_attempts": 1, "labels": {}}
        if container_name:
            spec["container_name"] = container_name
        item = {
            C.JOB_PK: C.job_item_key(job_id), "item_type": "JOB", "job_id": job_id,
            "job_state": JobState.QUEUED.value, "source": "queue", "name": job_id, "user": user,
            "priority": priority, "submitted_at": at, "spec_json": json.dumps(spec),
            "world_size": nnodes, "gpus_per_node": gpus, "attempt": 0, "recoveries_used": 0,
            "max_recovery_attempts": 1, C.QUEUE_PK: C.QUEUE_BUCKET,
            C.QUEUE_SK: C.queue_order(priority, at, job_id), C.LIST_PK: C.LIST_BUCKET,
            "not_before": 0, "attempts": [], "last_error": "", "history": [],
            "created_at": at, "updated_at": at, **extra,
        }
        self.table().put_item(Item=to_ddb(item))
        self.submitted.append(job_id)
        return job_id

    def item(self, job_id: str) -> dict[str, Any]:
        got = self.table().get_item(Key={C.JOB_PK: C.job_item_key(job_id)}, ConsistentRead=True)
        return from_ddb(got.get("Item") or {})

    def state(self, job_id: str) -> JobState:
        return JobState(self.item(job_id)["job_state"])

    def live_tasks(self, job_id: str | None = None) -> list[Any]:
        return [t for t in self.sim.running_tasks() if not t.health_check
                and (job_id is None or t.tags.get(C.TAG_JOB_ID) == job_id)]

    def node_of(self, task: Any) -> Any:
        return self.sim.node(task.node)


def make_queue_cluster(*, nodes: list[int] | None = None, train_gpus: int = 8,
                       duplicate_delivery: bool = False, sweep: bool = False) -> Iterator[QueueCluster]:
    from local_mode.ecs_sim import SimulatedEcs
    from local_mode.emulator import LocalAws
    from local_mode.event_bus import LocalEventBus, wire_recovery_handlers

    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger().setLevel(logging.WARNING)
    with LocalAws(metrics_disabled=True) as local:
        runtime.reset(clients=False)
        bus = LocalEventBus(duplicate_delivery=duplicate_delivery)
        sim = SimulatedEcs(local, bus, train_seconds=None)
        wire_recovery_handlers(bus, local.cluster_arn, sweep_every_seconds=60 if sweep else None)
        td = sim.register_training_task_definition("train", gpus=train_gpus)
        for i, gpus in enumerate(nodes or []):
            sim.add_node(f"node-{i}", gpus=gpus)
        sim.run_for(1)
        yield QueueCluster(local, bus, sim, td)
        runtime.reset(clients=False)


@pytest.fixture
def qc() -> Iterator[QueueCluster]:
    """Four EC2 nodes with 8 GPUs each."""
    yield from make_queue_cluster(nodes=[8, 8, 8, 8])
