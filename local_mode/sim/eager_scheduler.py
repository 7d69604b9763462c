"""Another scheduler on the cluster, an eager one: it places its own work onto any node the
documented placement constraint allows (``attribute:gpu-recovery.unavailable !exists``) the
moment that node frees, and so keeps the cluster full.

This is the user's scheduler of issue 41: it shares the cluster with the stack and races it
for every node that frees. It lists its candidates as a scheduler that names its instances
with StartTask must (ListContainerInstances ``status=ACTIVE`` with the constraint as the
``filter``, placement constraints applying to RunTask only), describes them and starts one
task on each node with enough free GPUs. It reacts after every data-plane step that stopped a
task or changed a container instance (``SimulatedEcs.step_listeners``), once the stack's own
handlers have seen the same events: in simulated time both react at the same instant, so a
node is kept off only if the stack's reaction put the attribute (or took the node) first.

Its calls go through the handlers' session (the simulator's API hooks place its tasks) with
the crash campaigns' counting paused: they are not the stack's calls, never broken. Every
task it started is in ``started`` with the node and time (the simulator's ``placements``
record the node's health then too). A task it places on a node whose GPU is bad dies on it
(exit 1) seconds after it starts, as issue 41's user saw: "both failed on the dead GPU"."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.placement import PLACEMENT_EXPRESSION

from .ecs import SimulatedEcs

#: how this scheduler's work reaches ECS: one task per node, untracked by the stack unless
#: ``tags`` says otherwise (a job's tags make it a tag-registered job of the stack's)
DEFAULT_FAMILY = "eager-work"
STARTED_BY = "eager-scheduler"


@dataclass
class EagerScheduler:
    """See the module docstring. ``run_seconds``: how long each task it starts runs (a
    callable: drawn per task); ``tags``: the tags of its n-th task (None: untagged work the
    stack does not track); ``gpus``: what each task needs (a whole 8-GPU node by default)."""

    sim: SimulatedEcs
    run_seconds: float | Callable[[], float] = 30 * 60
    gpus: int = 8
    family: str = DEFAULT_FAMILY
    tags: Callable[[int], Mapping[str, str]] | None = None
    #: False: a scheduler that ignores the constraint (lists every ACTIVE instance)
    honours_constraint: bool = True
    #: only these nodes (names; None: any)
    nodes: frozenset[str] | None = None
    #: a task it places on a node whose GPU is bad (not judged yet, or judged and not kept
    #: off) dies on it this long after it starts, as real work does on a dead GPU
    dies_after_seconds: float = 20.0
    #: (time, node, task ARN) of every task it started
    started: list[tuple[float, str, str]] = field(default_factory=list)
    active: bool = True
    _task_definition: str = ""
    _count: itertools.count[int] = field(default_factory=itertools.count)

    def attach(self) -> EagerScheduler:
        """Register the task definition, fill the cluster now, and react to every step."""
        with self.sim.local.call_faults.paused():
            self._task_definition = self.sim.register_training_task_definition(self.family, gpus=self.gpus)
        self.sim.step_listeners.append(self._after_step)
        self.fill()
        return self

    def _after_step(self, events: list[dict[str, Any]]) -> None:
        if self.active and any(_frees(event) for event in events):
            self.fill()

    def allowed_free_nodes(self) -> list[str]:
        """Node names the constraint allows, ACTIVE, agent connected, with room for a task."""
        from gpu_recovery.adapters import aws

        ecs = aws.client("ecs")
        cluster = self.sim.local.cluster_name
        with self.sim.local.call_faults.paused():
            query = {"filter": PLACEMENT_EXPRESSION} if self.honours_constraint else {}
            arns = ecs.list_container_instances(cluster=cluster, status="ACTIVE",
                                                **query)["containerInstanceArns"]
            described = ecs.describe_container_instances(cluster=cluster, containerInstances=arns)[
                "containerInstances"] if arns else []
        free = []
        for ci in described:
            gpus = [r for r in ci.get("remainingResources") or [] if r["name"] == "GPU"]
            remaining = len(gpus[0].get("stringSetValue") or []) if gpus else 0
            name = self.sim.node(ci["containerInstanceArn"]).name
            allowed = self.nodes is None or name in self.nodes
            if ci.get("agentConnected") and remaining >= self.gpus and allowed:
                free.append(name)
        return sorted(free)

    def fill(self) -> list[str]:
        """Start a task on every node the constraint allows that has room; the nodes used."""
        from gpu_recovery.adapters import aws

        used = []
        for node in self.allowed_free_nodes():
            n = next(self._count)
            seconds = self.run_seconds() if callable(self.run_seconds) else self.run_seconds
            tags = dict(self.tags(n)) if self.tags is not None else {}
            with self.sim.local.call_faults.paused():
                # The plan of its own family per task: each task runs its own length.
                family = f"{self.family}-{n}"
                task_definition = self.sim.register_training_task_definition(family, gpus=self.gpus)
                self.sim.plan_family(family, run_seconds=seconds, exit_code=0)
                if tags.get(C.TAG_JOB_ID):
                    try:
                        arns = self.sim.start_job(tags[C.TAG_JOB_ID], task_definition, [node],
                                                  started_by=STARTED_BY,
                                                  extra_tags={k: v for k, v in tags.items()
                                                              if k != C.TAG_JOB_ID})
                    except RuntimeError:
                        continue  # refused: the node was taken meanwhile
                    arn = arns[0]
                else:
                    answer = aws.client("ecs").start_task(
                        cluster=self.sim.local.cluster_name, taskDefinition=task_definition,
                        containerInstances=[self.sim.node(node).container_instance_arn], startedBy=STARTED_BY)
                    if not answer.get("tasks"):
                        continue
                    arn = answer["tasks"][0]["taskArn"]
            if self.sim.node(node).health != "healthy":  # CUDA fails on the bad GPU
                self.sim.plan_task(arn, run_seconds=self.dies_after_seconds, exit_code=1)
            self.started.append((self.sim.now(), node, arn))
            used.append(node)
        return used


def _frees(event: Mapping[str, Any]) -> bool:
    """A step whose events may have freed a node: a task STOPPED, an instance changed."""
    kind = event.get("detail-type")
    if kind == "ECS Container Instance State Change":
        return True
    return kind == "ECS Task State Change" and (event.get("detail") or {}).get("lastStatus") == "STOPPED"
