"""The tasks the stack runs on one node (a health check, a GPU reset, a validation after
repair): each kind declared once (:class:`NodeTaskKind`), each started the one way
(:class:`NodeTasks`).

Every kind's start is crash-consistent the same way: the stage has claimed the node with a
``startedBy`` deterministic per claim (``domain.started_by.node_task``) before StartTask; a
claim taken over (its claimer died, or StartTask's answer was lost) looks its task up by that
``startedBy`` first; a refused StartTask (nothing started) gives the claim back at once, any
other error keeps it until its lease expires (the task may have started: the next try looks it
up). What differs between kinds is data (the task definition, its group and tag, the container
its environment goes to, where its claim is stored) and what the stage does with a task not
placed or started, which stays the stage's. Every kind's claim is declared where it is stored
(:class:`ClaimFields`) and written by the same intents (``repository.node_task_claims``: a
task recorded, a dead claim taken over, a claim given back), and every kind's dead claim is
taken over and its task recorded here (:meth:`NodeTasks.take_over`, :meth:`NodeTasks.record`).
A GPU reset and a validation also share how a claim is made (:meth:`NodeTasks.claim_and_start`:
a recorded task runs, a claim with none is taken over, a new one waits for the node's GPUs);
the health check's claim takes a slot of the cluster's and of its job's checks and moves the
node to HEALTH_CHECKING, so making that claim stays its own. Every kind's sweep looks at its
task within its time the one way (:meth:`NodeTasks.follow`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any, Literal, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.adapters.errors import refused
from gpu_recovery.constants import (
    CLAIM_LEASE_SECONDS,
    GPU_RESET_GROUP,
    GPU_VALIDATION_GROUP,
    HEALTH_CHECK_CONTAINER_NAME,
    HEALTH_CHECK_GROUP,
    RETRY_INTERVAL_SECONDS,
    TAG_PURPOSE,
)
from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.domain.models import Instance, Rank, family_of
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.once_more import claimed_with_token
from gpu_recovery.recovery.ports import MetricsPort, Outcome
from gpu_recovery.recovery.task_starts import StartsTasks, TaskRequest, start_once, started_already
from gpu_recovery.repository import claim_fields as stored
from gpu_recovery.repository.claim_fields import ClaimFields
from gpu_recovery.repository.node_task_claims import NodeTaskClaims
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# A running task is looked at this often (its STOPPED event may be lost): a reset or a
# validation every two minutes, a health check (whose sweep also reads its verdict) every five.
POLL_SECONDS = 120
HEALTH_CHECK_POLL_SECONDS = 300
# A stage's outcome for a task that is not the stack's (``NodeTasks.runs_our_definition``).
FOREIGN_TASK = "foreign_task_ignored"


@dataclass(frozen=True)
class NodeTaskKind:
    """One kind of task the stack runs on a node, as data."""

    name: str  # in logs: "<name> started"
    outcome: str  # the stage's outcomes: "<outcome>_started", "<outcome>_claimed", ...
    group: str  # the ECS task group (its STOPPED events are routed by it)
    purpose: str  # the gpu-recovery:purpose tag's value (TAG_PURPOSE)
    started_metric: str
    task_definition: Callable[[Settings], str]
    claim: ClaimFields  # where its claim is stored (``repository.node_task_claims``)
    container: str = ""  # the container an environment is handed to ("": none is)
    poll_seconds: int = POLL_SECONDS  # a recorded task is looked at this often by the sweep


HEALTH_CHECK = NodeTaskKind(name="health check", outcome="health_check", group=HEALTH_CHECK_GROUP,
                            purpose="dcgm-health-check", started_metric="HealthChecksStarted",
                            task_definition=attrgetter("health_check_task"), claim=stored.HEALTH_CHECK,
                            poll_seconds=HEALTH_CHECK_POLL_SECONDS)
GPU_RESET = NodeTaskKind(name="GPU reset", outcome="gpu_reset", group=GPU_RESET_GROUP, purpose="gpu-reset",
                         started_metric="GpuResetsStarted", task_definition=attrgetter("gpu_reset_task"),
                         claim=stored.GPU_RESET)
# The validation runs the health check's image under load (its level and load in its environment).
VALIDATION = NodeTaskKind(name="validation", outcome="validation", group=GPU_VALIDATION_GROUP,
                          purpose="post-repair-validation", started_metric="ValidationsStarted",
                          task_definition=attrgetter("health_check_task"),
                          container=HEALTH_CHECK_CONTAINER_NAME, claim=stored.VALIDATION)


@dataclass(frozen=True)
class TakeOver:
    """What :meth:`NodeTasks.take_over` found of a claim with no task recorded."""

    step: Literal["claimed", "raced", "found", "taken"]  # claimed: its lease runs; found: ``task_arn``
    task_arn: str = ""
    instance: Instance | None = None  # "taken": the node as the take-over wrote it


@dataclass(frozen=True)
class Placed:
    """StartTask's answer: the task started, or why ECS placed nothing (its failures)."""

    task_arn: str | None
    reasons: str = ""


class WaitsForGpus(Protocol):
    """A stage whose node task runs once no rank holds the node's GPUs (a GPU reset, a
    validation after repair): what :meth:`NodeTasks.claim_and_start` asks of it."""

    def deadline(self, instance: Instance) -> float:
        """When the task is out of time (the sweep's last look is due by then)."""

    def new_started_by(self, instance: Instance) -> str:
        """A new claim's startedBy (deterministic per claim)."""

    def start_task(self, instance: Instance, started_by: str) -> str:
        """StartTask on the claimed node (``NodeTasks.start_claimed``), and what a task not
        placed leads to."""


class FollowsTask(Protocol):
    """What :meth:`NodeTasks.follow` (the sweep's look) asks of the stage."""

    def deadline(self, instance: Instance) -> float:
        """When the task is out of time (the sweep's last look is due by then)."""

    def start(self, instance: Instance) -> str:
        """The task started if the node still needs it (a reset's and a validation's:
        ``claim_and_start``; the check's: its claim taken over, ``HealthChecks.start``)."""

    def gone(self, instance: Instance) -> str:
        """ECS no longer knows the recorded task: what that leads to."""

    def on_stopped(self, detail: EcsTaskDetail) -> Outcome:
        """The task stopped (its STOPPED event lost, or still being retried): its result."""


class NodeTaskEcs(StartsTasks, Protocol):
    """The ECS calls of a node task: its start (on the stack's budget), its lookups."""

    def prepay(self, calls: int, *, in_turn_within: float | None = None) -> None: ...
    def describe_task(self, task_arn: str) -> dict[str, Any] | None: ...


class RanksOnNodes(Protocol):
    """The ranks still holding a node's GPUs."""

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]: ...


@dataclass(eq=False, repr=False)
class NodeTasks:
    """A node task's claim up to StartTask (``claim_and_start``, for the kinds that wait for
    the node's GPUs) and StartTask itself (``start``, every kind). One per service, built by
    the composition root (``RecoveryService``) and shared by the stages of every kind."""

    ecs: NodeTaskEcs
    data: RanksOnNodes
    claims: NodeTaskClaims
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings

    def claim_and_start(self, kind: NodeTaskKind, stage: WaitsForGpus, instance: Instance) -> str:
        """The claim's lifecycle up to StartTask: a task recorded runs; a claim with no task
        recorded is its claimer's or taken over (:meth:`take_over`); else, once no rank
        holds the GPUs, a new claim, then StartTask."""
        fields = kind.claim
        now = clock.now()
        claim = fields.read(instance)
        if claim.task_arn:
            return f"{kind.outcome}_running"
        if claim.started_by:
            taken = self.take_over(kind, instance, now, deadline=stage.deadline(instance))
            if taken.instance is not None:
                return stage.start_task(taken.instance, claim.started_by)
            return "raced" if taken.step == "raced" else f"{kind.outcome}_{taken.step}"
        if self.gpus_busy(kind, instance):
            self.rearm(kind, instance, min(stage.deadline(instance), now + RETRY_INTERVAL_SECONDS))
            return f"{kind.outcome}_waiting_for_gpus"
        started_by = stage.new_started_by(instance)
        if not claimed_with_token(partial(self.claims.claim, fields, instance, started_by, now,
                                          now + CLAIM_LEASE_SECONDS)):
            return "raced"
        return stage.start_task(fields.claimed(instance, started_by, now), started_by)

    def gpus_busy(self, kind: NodeTaskKind, instance: Instance) -> bool:
        """A rank still holds the node's GPUs: its task waits (no claim is made)."""
        busy = self.data.live_ranks_on_instance(instance.container_inst_id)
        if busy:
            logger.info(f"{kind.name} waits for the node's ranks to stop", extra={
                "instance": instance.container_inst_id, "busy_ranks": [f"{r.job_id}#{r.rank}" for r in busy]})
        return bool(busy)

    def take_over(self, kind: NodeTaskKind, instance: Instance, now: float, *, deadline: float) -> TakeOver:
        """A claim with no task recorded: its claimer's while its lease runs ("claimed": it
        may still be starting the task); else taken over (one taker, "raced" for the others)
        and its task looked up by its startedBy before one is started: "found" (recorded,
        looked at by ``deadline``) or "taken" (the caller starts it, on the node as taken)."""
        fields = kind.claim
        if not fields.lease_ended(instance, now, CLAIM_LEASE_SECONDS):
            return TakeOver("claimed")
        if not claimed_with_token(partial(self.claims.take_over, fields, instance, now,
                                          now + CLAIM_LEASE_SECONDS)):
            return TakeOver("raced")
        started_by, node = fields.read(instance).started_by, instance.container_inst_id
        found = started_already(self.ecs, started_by, [node],
                                shared=task_started_by.names_several_nodes(started_by)).get(node)
        if found:
            self.record(kind, instance, started_by, found, deadline=deadline)
            return TakeOver("found", found)
        return TakeOver("taken", instance=fields.taken_over(instance, now, now + CLAIM_LEASE_SECONDS))

    def start_claimed(self, kind: NodeTaskKind, stage: WaitsForGpus, instance: Instance, started_by: str, *,
                      environment: Mapping[str, str] | None = None) -> Placed:
        """StartTask under a claim of ``claim_and_start``'s: refused, the claim given back."""
        return self.start(kind, instance, started_by, environment=environment,
                          release=lambda: self.release(kind, instance, started_by,
                                                       clock.now() + RETRY_INTERVAL_SECONDS),
                          record=lambda task_arn: self.record(kind, instance, started_by, task_arn,
                                                              deadline=stage.deadline(instance)))

    def record(self, kind: NodeTaskKind, instance: Instance, started_by: str, task_arn: str, *,
               deadline: float) -> None:
        """The task to wait for: its STOPPED event, or the sweep's look within the kind's
        ``poll_seconds`` (by ``deadline`` at the latest, when the task is out of time)."""
        look_at = min(deadline, clock.now() + kind.poll_seconds)
        self.record_until(kind, instance, started_by, task_arn, look_at)

    def record_until(self, kind: NodeTaskKind, instance: Instance, started_by: str, task_arn: str,
                     look_at: float) -> None:
        """The task recorded (again), the sweep's look at ``look_at`` (a verdict whose log line
        is late, or whose lease another copy holds: ``recovery.health_check_verdicts``)."""
        self.claims.record(kind.claim, instance, started_by, task_arn, look_at)

    def release(self, kind: NodeTaskKind, instance: Instance, started_by: str, retry_at: float, *,
                attempt_used: bool = False) -> bool:
        """Nothing runs under the claim (see ``NodeTaskClaims.release``)."""
        return self.claims.release(kind.claim, instance, started_by, retry_at, attempt_used=attempt_used)

    def runs_our_definition(self, kind: NodeTaskKind, task: EcsTaskDetail) -> bool:
        """The task runs the kind's own task definition (its family). Its group and startedBy
        are not enough: anyone with ecs:StartTask in the cluster can give a task of theirs the
        ones of a running check (ListTasks shows its startedBy), and its exit code is no
        verdict. Such a task is logged and counted, and the caller ignores it."""
        if family_of(task.taskDefinitionArn) == family_of(kind.task_definition(self.settings)):
            return True
        self.metrics.add_metric("ForeignNodeTasksIgnored", "Count", 1)
        logger.warning(f"task ignored: it has the startedBy of a {kind.name} but another task definition",
                       extra={"task": task.taskArn, "task_definition": task.taskDefinitionArn,
                              "started_by": task.startedBy, "group": task.group})
        return False

    def rearm(self, kind: NodeTaskKind, instance: Instance, deadline_at: float) -> bool:
        """The sweep looks at the node's task again at ``deadline_at``."""
        return self.claims.rearm(kind.claim, instance, deadline_at)

    def follow(self, kind: NodeTaskKind, stage: FollowsTask, instance: Instance, now: float) -> str:
        """The sweep's look at a node task within its time: a recorded task is looked at
        (gone, stopped: the stage's; running: looked at again within its poll interval); else it
        is started (the stage's ``start``), and a claim in flight looked at once its lease ends."""
        claim = kind.claim.read(instance)
        if claim.task_arn:
            task = self.look(claim.task_arn)
            detail = EcsTaskDetail.model_validate(task) if task is not None else None
            # A task a take-over found by its startedBy alone may be someone else's: as gone.
            if task is None or detail is None or not self.runs_our_definition(kind, detail):
                return stage.gone(instance)
            if task.get("lastStatus") == "STOPPED":
                return stage.on_stopped(detail).action
            self.rearm(kind, instance, min(stage.deadline(instance), now + kind.poll_seconds))
            return f"{kind.outcome}_running"
        started = stage.start(instance)
        # A claim in flight is looked at once its lease ends: the claimer's as read, or the
        # lease another taker has just begun.
        if started == f"{kind.outcome}_claimed":
            lease_end = kind.claim.lease_ends_at(instance, CLAIM_LEASE_SECONDS)
        elif started == "raced":
            lease_end = now + CLAIM_LEASE_SECONDS
        else:
            return started
        # Not before now: a lease that ended while this sweep ran is looked at on its next pass.
        self.rearm(kind, instance, min(stage.deadline(instance), max(lease_end, now)))
        return started

    def look(self, task_arn: str) -> dict[str, Any] | None:
        """The sweep's look at a recorded task (its STOPPED event may be lost): as ECS
        describes it, None once ECS answers MISSING twice in a row (once may be a describe
        not caught up; ECS keeps a stopped task describable for an hour)."""
        return self.ecs.describe_task(task_arn) or self.ecs.describe_task(task_arn)

    def start(self, kind: NodeTaskKind, instance: Instance, started_by: str, *,
              release: Callable[[], object], record: Callable[[str], object],
              environment: Mapping[str, str] | None = None, turn_within: float | None = None) -> Placed:
        """StartTask of ``kind`` on ``instance`` (``turn_within``: once the stack's ECS budget
        gives it a turn within that many seconds, else :class:`RateLimited`, StartTask never
        called). Refused: ``release()`` and the error raised; placed: ``record(task_arn)``."""
        placed = self.start_many(kind, [instance], started_by, release=lambda _: release(),
                                 record=lambda _, task_arn: record(task_arn), environment=environment,
                                 turn_within=turn_within)
        return placed[instance.container_inst_id]

    def start_many(self, kind: NodeTaskKind, instances: Sequence[Instance], started_by: str, *,
                   release: Callable[[Instance], object], record: Callable[[Instance, str], object],
                   environment: Mapping[str, str] | None = None,
                   turn_within: float | None = None) -> dict[str, Placed]:
        """One StartTask of ``kind`` on up to 10 claimed ``instances`` (one task each, one
        ``startedBy``: a call on several nodes takes a startedBy that says so,
        ``domain.started_by.names_several_nodes``, so that a take-over describes the call's
        tasks to find its own node's). Node id -> what was placed there; refused, each claim
        released and the error raised; each task placed recorded (:meth:`start`)."""
        overrides = None
        if kind.container:
            overrides = {"containerOverrides": [{"name": kind.container, "environment": [
                {"name": name, "value": value} for name, value in sorted((environment or {}).items())]}]}
        try:
            if turn_within is not None:
                self.ecs.prepay(1, in_turn_within=turn_within)
            placed: dict[str, str] = {}
            unplaced = start_once(self.ecs, TaskRequest(
                kind.task_definition(self.settings), started_by, overrides,
                [{"key": TAG_PURPOSE, "value": kind.purpose}], kind.group),
                {i.container_inst_id: i.container_instance_arn or i.container_inst_id for i in instances},
                placed.__setitem__)
        except RateLimited:
            raise  # never called: the stage decides when to try again
        except Exception as error:
            if refused(error):  # nothing was started: the next try may start it
                for instance in instances:
                    release(instance)
            # Otherwise it may have started: the lease expires and the next try looks it up.
            raise
        out: dict[str, Placed] = {}
        for instance in instances:
            inst_id = instance.container_inst_id
            task_arn = placed.get(inst_id)
            if task_arn is None:
                reasons = unplaced.get(inst_id, [])
                out[inst_id] = Placed(None, ", ".join(reason or "?" for reason in reasons) or "unknown")
                continue
            record(instance, task_arn)
            self.metrics.add_metric(kind.started_metric, "Count", 1)
            logger.info(f"{kind.name} started", extra={"instance": inst_id, "task": task_arn})
            out[inst_id] = Placed(task_arn)
        return out

