"""A queue launch's ranks, for the start fan-out (``recovery.gang``, ``recovery.rank_templates``):
each rank's StartTask from the job's stored spec (``LaunchSpec``: the submitted spec as stored)
and the launch plan its claim wrote (the task definition's ARN and container, MASTER_ADDR/PORT,
the control API's URL on the job item; the node of each rank on the plan's items, one
BatchGetItem per batch: a plan item holds as many ranks as a start batch). No DescribeTaskDefinition
here: the claim resolved it once.

A rank started is registered as the new attempt's rank item (over its lease-only item, for a
rank never started before), its node recorded if the loop does not know it yet, and it arrives at
the attempt's registered latch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import (
    CONTROL_TOKEN_ENV,
    CONTROL_URL_ENV,
    RESUME_COUNT_ENV,
    TAG_ATTEMPT,
    TAG_JOB_ID,
    TAG_RANK,
    TAG_WORLD_SIZE,
    job_group,
)
from gpu_recovery.domain.control_token import make_token
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Instance, Job, Rank, container_instance_id
from gpu_recovery.domain.rank_template import RankTemplate
from gpu_recovery.domain.states import RankState
from gpu_recovery.recovery.rank_templates import BatchTemplates
from gpu_recovery.repository.latches import Arrival, LatchRepository

logger = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 29500
# What a launch's claim writes on its plan for the start fan-out (besides the nodes' items).
PLAN_FIELDS = ("task_definition_arn", "container", "master_addr")


@dataclass(frozen=True)
class LaunchSpec:
    """What launching a stored job needs, read from its item: the submitted spec
    (``spec_json``, a :class:`gpu_recovery.queue.models.JobSpec` as it was stored) with the
    item's own world size and GPUs per node, the rendezvous port resolved."""

    task_definition: str
    nnodes: int
    gpus_per_node: int
    container_name: str = ""
    command: list[str] | None = None
    environment: dict[str, str] = field(default_factory=dict)
    master_port: int = DEFAULT_MASTER_PORT

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> LaunchSpec:
        raw = item.get("spec_json") or "{}"
        spec = json.loads(raw) if isinstance(raw, str) else dict(raw)
        overrides = spec.get("overrides") or {}
        env_in = overrides.get("environment") or {}
        if isinstance(env_in, list):
            env = {str(e["name"]): str(e.get("value", "")) for e in env_in}
        else:
            env = {str(k): str(v) for k, v in dict(env_in).items()}
        command = overrides.get("command")
        port = spec.get("master_port") or env.get("MASTER_PORT") or DEFAULT_MASTER_PORT
        return cls(
            task_definition=str(spec["task_definition"]),
            nnodes=int(item.get("world_size") or spec.get("nnodes") or 1),
            gpus_per_node=int(item.get("gpus_per_node", spec.get("gpus_per_node", 0))),
            container_name=str(spec.get("container_name") or ""),
            command=[str(c) for c in command] if command else None,
            environment=env,
            master_port=int(port),
        )


def rank_tags(job_id: str, rank: int, world_size: int, attempt: int) -> list[dict[str, str]]:
    return [
        {"key": TAG_JOB_ID, "value": job_id},
        {"key": TAG_RANK, "value": str(rank)},
        {"key": TAG_WORLD_SIZE, "value": str(world_size)},
        {"key": TAG_ATTEMPT, "value": str(attempt)},
    ]


def build_overrides(spec: LaunchSpec, container: str, *, job_id: str, rank: int, world_size: int,
                    attempt: int, master_addr: str, master_port: int,
                    extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """ECS ``overrides``: the job's command/environment plus the rendezvous variables
    (and ``extra_env``: the suspend channel, ``RESUME_COUNT``).

    The GPU resource requirement is set to ``gpus_per_node`` so ECS reserves exactly
    what admission counted.
    """
    env = {
        **spec.environment,
        **(extra_env or {}),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "JOB_ID": job_id,
        "ATTEMPT": str(attempt),
    }
    override: dict[str, Any] = {
        "name": container,
        "environment": [{"name": k, "value": v} for k, v in sorted(env.items())],
    }
    if spec.command:
        override["command"] = list(spec.command)
    if spec.gpus_per_node > 0:
        override["resourceRequirements"] = [{"type": "GPU", "value": str(spec.gpus_per_node)}]
    return {"containerOverrides": [override]}


def control_env(item: Mapping[str, Any], rank: int, control_api_url: str) -> dict[str, str]:
    """What a rank needs for the suspend channel (and how often it was resumed)."""
    env = {RESUME_COUNT_ENV: str(int(item.get("resume_count") or 0))}
    secret = str(item.get("control_secret") or "")
    if secret and control_api_url:
        env[CONTROL_URL_ENV] = control_api_url
        env[CONTROL_TOKEN_ENV] = make_token(str(item["job_id"]), rank, secret)
    return env


# ------------------------------------------------------------------ ports
class LaunchJobs(Protocol):
    """The job's item as stored (its spec, its launch plan)."""

    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...


class LaunchPlans(Protocol):
    """The launch plan's nodes of a range of ranks (``repository.scheduling``)."""

    def plan_range(self, job_id: str, attempt: int, first: int, last: int) -> tuple[list[str], list[str]]: ...


class LaunchLeases(Protocol):
    """A range's rank items and the launch leases on them (``repository.gang_fanouts``)."""

    def rank_items(self, job_id: str, first: int, last: int) -> tuple[list[Rank], dict[int, int]]: ...


class LaunchNodes(Protocol):
    def put_instance_if_absent(self, instance: Instance) -> bool: ...


class LaunchRegistrations(Protocol):
    def put_rank_registration(self, rank: Rank) -> bool: ...


@dataclass(eq=False, repr=False)
class LaunchTemplates:
    """A queue launch's ranks: the job's spec and its launch plan."""

    jobs: LaunchJobs
    plans: LaunchPlans
    leases: LaunchLeases
    nodes: LaunchNodes
    registrations: LaunchRegistrations
    latches: LatchRepository

    def read(self, job: Job, first: int, last: int) -> BatchTemplates:
        item = self.jobs.get_job_item(job.job_id) or {}
        plan = item.get("launch") or {}
        if int(plan.get("attempt") or 0) != job.attempt:
            return BatchTemplates()  # another attempt's plan: nothing of this one to start
        missing = [name for name in PLAN_FIELDS if name not in plan]
        try:
            spec = LaunchSpec.from_item(item)
        except (KeyError, ValueError, TypeError) as error:
            missing.append(f"a valid spec ({error!r})")
        if missing:
            # Not a claim of this release's (an older launcher's plan) or a spec gone bad: nothing
            # to start, said once per batch; the sweep gives the launch up (``QueueLaunches.resume``).
            logger.error("queue launch cannot start: its launch plan or spec lacks %s", ", ".join(missing),
                         extra={"job_id": job.job_id, "attempt": job.attempt})
            return BatchTemplates()
        arns, ec2_ids = self.plans.plan_range(job.job_id, job.attempt, first, last)
        ranks, leases = self.leases.rank_items(job.job_id, first, last)
        known = {r.rank: r for r in ranks}
        out = BatchTemplates(registered=[r for r in ranks if r.attempt == job.attempt])
        url = str(plan.get("control_api_url") or "")
        for index, rank in enumerate(range(first, min(last, job.world_size))):
            arn = arns[index] if index < len(arns) else ""
            if not arn:
                continue  # not planned (a plan item missing): nothing to start it on
            previous = known.get(rank)
            template = RankTemplate(
                job_id=job.job_id, rank=rank, task_definition_arn=str(plan["task_definition_arn"]),
                overrides=build_overrides(spec, str(plan.get("container") or ""), job_id=job.job_id,
                                          rank=rank, world_size=job.world_size, attempt=job.attempt,
                                          master_addr=str(plan.get("master_addr") or ""),
                                          master_port=int(plan.get("master_port") or spec.master_port),
                                          extra_env=control_env(item, rank, url)),
                tags=rank_tags(job.job_id, rank, job.world_size, job.attempt), group=job_group(job.job_id),
                gpus=spec.gpus_per_node, node=container_instance_id(arn), container_instance_arn=arn,
                ec2_instance_id=ec2_ids[index] if index < len(ec2_ids) else "",
                launch_attempt=leases.get(rank, 0),
                previous=previous if previous is not None and previous.attempt < job.attempt else None)
            out.planned.append(template)
            if previous is None or previous.attempt < job.attempt:
                out.startable[rank] = template
        return out

    def register(self, job: Job, template: RankTemplate, task_arn: str, started_by: str,
                 started_at: float | None = None) -> Arrival:
        self.nodes.put_instance_if_absent(Instance(
            template.node, container_instance_arn=template.container_instance_arn,
            ec2_instance_id=template.ec2_instance_id))
        registered_at = started_at or clock.now()
        previous = template.previous
        self.registrations.put_rank_registration(Rank(
            job_id=job.job_id, rank=template.rank, state=RankState.STARTING, attempt=job.attempt,
            task_arn=task_arn, task_definition_arn=template.task_definition_arn,
            container_inst_id=template.node, container_instance_arn=template.container_instance_arn,
            ec2_instance_id=template.ec2_instance_id, overrides=template.overrides, tags=template.tags,
            group=template.group, started_by=started_by, registered_at=registered_at, gpus=template.gpus,
            earlier_tasks=previous.tasks_before(job.attempt) if previous is not None else ()))
        return self.latches.arrive(job.job_id, job.attempt, job.world_size, template.rank, [Latch.REGISTERED],
                                   node=template.node, registered_at=registered_at)
