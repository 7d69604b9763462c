"""The recovery loop: ECS task stops -> DCGM health check -> reboot -> gang restart.

Each public method handles one kind of event and is written as *converge*: it first
records what the event says with conditional writes (a duplicate loses the race and
changes nothing), then performs the side effects the current state still needs.
Side effects are idempotent or guarded by a recorded marker, so a retried event
(after a throttled or failed AWS call) finishes the work instead of repeating it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import StartResult
from gpu_recovery.constants import (
    HEALTH_CHECK_GROUP,
    HEALTH_CHECK_STARTED_BY,
    SYSTEM_STOP_REASON_PREFIX,
    TAG_ATTEMPT,
    TAG_JOB_ID,
    TAG_RANK,
    TAG_WORLD_SIZE,
    DcgmVerdict,
    InstanceState,
    JobState,
    NotificationKind,
    RankState,
)
from gpu_recovery.domain import policy
from gpu_recovery.domain.models import Instance, Job, Rank, container_instance_id
from gpu_recovery.domain.notifications import Notification, NotificationFacts, build
from gpu_recovery.domain.policy import JobVerdictOutcome, StopKind, TaskStop, VerdictAction
from gpu_recovery.domain.state_machine import ACTIVE_JOB_STATES
from gpu_recovery.ecs_events import EcsContainerInstanceDetail, EcsTaskDetail
from gpu_recovery.repository import Repository, Update
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

ACTOR = "recovery"
LIVE_OR_STOPPING = (
    RankState.STARTING,
    RankState.RUNNING,
    RankState.NODE_LOST,
    RankState.HUNG,
    RankState.STOP_REQUESTED,
)
LIVE = (RankState.STARTING, RankState.RUNNING, RankState.NODE_LOST, RankState.HUNG)
REBOOT_ISSUE_GRACE_SECONDS = 120  # the sweep re-issues a reboot not confirmed by then
RESTART_CONFIRM_SECONDS = 600  # a restart not seen RUNNING by then is re-checked
RETRY_INTERVAL_SECONDS = 60


# ------------------------------------------------------------------------- ports
class EcsPort(Protocol):
    cluster: str

    def start_task(self, *, task_definition: str, container_instance_arn: str,
                   overrides: dict[str, Any] | None = None,
                   tags: list[dict[str, str]] | None = None, started_by: str = "",
                   group: str | None = None) -> StartResult: ...
    def stop_task(self, task_arn: str, reason: str) -> None: ...
    def describe_task(self, task_arn: str) -> dict[str, Any] | None: ...
    def tasks_started_by(self, started_by: str) -> list[str]: ...
    def running_tasks_tagged(self, tag_key: str, tag_value: str) -> list[dict[str, Any]]: ...
    def describe_container_instance(self, container_instance: str) -> dict[str, Any] | None: ...
    def drain(self, container_instance_arn: str) -> None: ...


class RebootPort(Protocol):
    def reboot(self, instance_id: str, reason: str) -> str: ...


class NotifierPort(Protocol):
    def publish(self, notification: Notification) -> str: ...


class VerdictReaderPort(Protocol):
    def read_verdict(self, task_arn: str) -> dict[str, Any] | None: ...


class MetricsPort(Protocol):
    def add_metric(self, name: str, unit: str, value: float) -> None: ...


class NullMetrics:
    def add_metric(self, name: str, unit: str, value: float) -> None:
        return None


@dataclass
class Outcome:
    """What a handler did, returned to Lambda (visible in logs and tests)."""

    action: str
    job_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "job_id": self.job_id, **self.detail}


@dataclass(frozen=True)
class RankRegistration:
    """Everything a restart needs, captured while ECS still describes the task."""

    job_id: str
    rank: int
    world_size: int
    attempt: int
    task_arn: str
    task_definition_arn: str
    container_instance_arn: str
    ec2_instance_id: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    tags: list[dict[str, str]] = field(default_factory=list)
    group: str = ""
    started_by: str = ""
    state: RankState = RankState.RUNNING
    max_recovery_attempts: int | None = None


class NotProtected(ValueError):
    """The task carries no (or malformed) recovery tags."""


def registration_from_tags(task: dict[str, Any], tags: list[dict[str, str]]) -> RankRegistration:
    values = {t.get("key"): t.get("value") for t in tags}
    if TAG_JOB_ID not in values:
        raise NotProtected("task has no gpu-recovery:job-id tag")
    try:
        rank = int(values.get(TAG_RANK) or "")
        world_size = int(values.get(TAG_WORLD_SIZE) or "")
        attempt = int(values.get(TAG_ATTEMPT) or 1)
    except ValueError as error:
        raise NotProtected(f"malformed recovery tags: {values}") from error
    job_id = str(values[TAG_JOB_ID]).strip()
    if not job_id or "#" in job_id or not 0 <= rank < world_size or world_size > 1024:
        raise NotProtected(f"malformed recovery tags: {values}")
    return RankRegistration(
        job_id=job_id,
        rank=rank,
        world_size=world_size,
        attempt=max(1, attempt),
        task_arn=task["taskArn"],
        task_definition_arn=task.get("taskDefinitionArn", ""),
        container_instance_arn=task.get("containerInstanceArn", ""),
        overrides=dict(task.get("overrides") or {}),
        tags=[{"key": str(t["key"]), "value": str(t.get("value", ""))} for t in tags],
        group=task.get("group", ""),
        started_by=task.get("startedBy", ""),
    )


def restart_started_by(job_id: str, attempt: int, rank: int) -> str:
    """Deterministic per attempt and rank (ECS allows 36 characters): finds duplicates."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:10]
    return f"gpurec-{digest}-a{attempt}-r{rank}"[:36]


def _timestamp(value: datetime | None) -> float:
    return value.timestamp() if value else clock.now()


class RecoveryService:
    def __init__(
        self,
        repo: Repository,
        ecs: EcsPort,
        rebooter: RebootPort,
        notifier: NotifierPort,
        verdicts: VerdictReaderPort,
        settings: Settings,
        metrics: MetricsPort | None = None,
    ) -> None:
        self.repo = repo
        self.ecs = ecs
        self.rebooter = rebooter
        self.notifier = notifier
        self.verdicts = verdicts
        self.settings = settings
        self.metrics = metrics or NullMetrics()

    # ================================================================ registration
    def register_rank(self, reg: RankRegistration) -> Rank:
        """Protect a rank: the task handler calls it on RUNNING, the queue at launch."""
        now = clock.now()
        inst_id = container_instance_id(reg.container_instance_arn)
        ec2_id = reg.ec2_instance_id or self._ec2_instance_id(inst_id, reg.container_instance_arn)
        self.repo.put_instance_if_absent(
            Instance(inst_id, container_instance_arn=reg.container_instance_arn, ec2_instance_id=ec2_id)
        )
        max_attempts = (
            reg.max_recovery_attempts
            if reg.max_recovery_attempts is not None
            else self.settings.max_recovery_attempts
        )
        self.repo.create_job_if_absent(
            Job(
                job_id=reg.job_id,
                state=JobState.RUNNING if reg.state is RankState.RUNNING else JobState.STARTING,
                world_size=reg.world_size,
                attempt=reg.attempt,
                max_recovery_attempts=max_attempts,
                created_at=now,
                updated_at=now,
            )
        )
        rank = Rank(
            job_id=reg.job_id,
            rank=reg.rank,
            state=reg.state,
            attempt=reg.attempt,
            task_arn=reg.task_arn,
            task_definition_arn=reg.task_definition_arn,
            container_inst_id=inst_id,
            container_instance_arn=reg.container_instance_arn,
            ec2_instance_id=ec2_id,
            overrides=reg.overrides,
            tags=reg.tags,
            group=reg.group,
            started_by=reg.started_by,
            registered_at=now,
        )
        if self.repo.put_rank_registration(rank):
            logger.info("rank registered", extra={"job_id": reg.job_id, "rank": reg.rank,
                                                  "attempt": reg.attempt, "task": reg.task_arn})
        return self.repo.get_rank(reg.job_id, reg.rank) or rank

    def _ec2_instance_id(self, inst_id: str, arn: str) -> str:
        known = self.repo.get_instance(inst_id)
        if known and known.ec2_instance_id:
            return known.ec2_instance_id
        described = self.ecs.describe_container_instance(arn or inst_id)
        return str((described or {}).get("ec2InstanceId", ""))

    def _rank_for_task(self, detail: EcsTaskDetail) -> Rank | None:
        rank = self.repo.find_rank_by_task(detail.taskArn)
        if rank is not None:
            return rank
        # Unknown task: out-of-order delivery, index lag, or a job launched by another
        # tool. Tags decide, and only DescribeTasks(include=TAGS) returns them.
        task = self.ecs.describe_task(detail.taskArn)
        if task is None:
            return None
        try:
            reg = registration_from_tags(task, task.get("tags", []))
        except NotProtected as reason:
            logger.debug("task not protected", extra={"task": detail.taskArn, "why": str(reason)})
            return None
        return self.register_rank(reg)

    # ============================================================ task state changes
    def on_task_state_change(self, detail: EcsTaskDetail) -> Outcome:
        if detail.group.startswith(HEALTH_CHECK_GROUP):
            return Outcome("ignored", detail={"why": "health-check task"})
        if detail.lastStatus == "RUNNING":
            return self._on_task_running(detail)
        if detail.lastStatus == "STOPPED":
            return self._on_task_stopped(detail)
        return Outcome("ignored", detail={"why": f"lastStatus {detail.lastStatus}"})

    def _on_task_running(self, detail: EcsTaskDetail) -> Outcome:
        rank = self._rank_for_task(detail)
        if rank is None:
            return Outcome("ignored", detail={"why": "not a protected job"})
        if rank.task_arn != detail.taskArn:
            return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        if rank.state is RankState.STARTING:
            self.repo.apply(self.repo.rank_update(rank, RankState.RUNNING,
                                                  from_states=[RankState.STARTING]))
        job = self.repo.get_job(rank.job_id)
        if job and job.state is JobState.STARTING and job.attempt == rank.attempt:
            self._running_once_gang_registered(job, f"rank {rank.rank} running")
        return Outcome("running", rank.job_id, {"rank": rank.rank})

    def _running_once_gang_registered(self, job: Job, reason: str, actor: str = ACTOR) -> bool:
        """STARTING -> RUNNING only once every rank of the attempt is registered.

        A launch interrupted half-way (Lambda timeout, crash) keeps the job STARTING with
        its deadline, so the sweep (or the queue's resume) starts the missing ranks.
        """
        current = [r for r in self.repo.get_ranks(job) if r.attempt == job.attempt]
        if len(current) < job.world_size:
            return False
        return self.repo.apply(
            self.repo.job_transition(
                job.job_id, JobState.RUNNING, from_states=[JobState.STARTING],
                attempt=job.attempt, reason=reason, actor=actor,
                remove_fields=self.repo.deadline_attributes(),
            )
        )

    def _on_task_stopped(self, detail: EcsTaskDetail) -> Outcome:
        rank = self._rank_for_task(detail)
        if rank is None:
            return Outcome("ignored", detail={"why": "not a protected job"})
        if rank.task_arn != detail.taskArn:
            return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        job = self.repo.get_job(rank.job_id)
        if job is None:
            return Outcome("ignored", rank.job_id, {"why": "job record missing"})
        stop = TaskStop(detail.exit_code(), detail.stopCode, detail.stoppedReason)
        kind = policy.classify_stop(stop, rank.state, self.settings.suspect_exit_codes)
        if rank.state in (RankState.DONE, RankState.FAILED, RankState.STOPPED):
            # Duplicate delivery (or a retry after a failed side effect): converge only.
            return self._converge_after_stop(job, rank, kind, duplicate=True)
        logger.info("rank stopped", extra={"job_id": job.job_id, "rank": rank.rank,
                                           "kind": kind.value, "exit_code": stop.exit_code})
        fields: dict[str, Any] = {"stop_reason": policy.describe_failure(stop)}
        if stop.exit_code is not None:
            fields["exit_code"] = stop.exit_code
        target = {
            StopKind.SUCCEEDED: RankState.DONE,
            StopKind.STOPPED_BY_SYSTEM: RankState.STOPPED,
            StopKind.STOPPED_BY_USER: RankState.STOPPED,
            StopKind.SUSPECTED_GPU_FAULT: RankState.FAILED,
            StopKind.FAILED: RankState.FAILED,
        }[kind]
        if not self.repo.apply(self.repo.rank_update(rank, target, from_states=LIVE_OR_STOPPING,
                                                     set_fields=fields)):
            fresh = self.repo.get_rank(rank.job_id, rank.rank) or rank
            return self._converge_after_stop(job, fresh, kind, duplicate=True)
        if job.attempt != rank.attempt:
            return Outcome("recorded", job.job_id, {"why": "older attempt"})

        if kind is StopKind.SUCCEEDED:
            return self._maybe_complete(job, rank)
        if kind is StopKind.STOPPED_BY_USER:
            self._finish_job(job, JobState.USER_STOPPED, f"rank {rank.rank} stopped by a user "
                             f"({stop.stopped_reason or 'UserInitiated'})")
            self._stop_live_ranks(job, exclude=rank.rank, why="job stopped by a user")
            return Outcome("user_stopped", job.job_id, {"rank": rank.rank})
        if kind is StopKind.FAILED:
            reason = f"rank {rank.rank} failed: {policy.describe_failure(stop)}"
            if self._finish_job(job, JobState.FAILED, reason, set_fields={"last_error": reason}):
                self.metrics.add_metric("Failures", "Count", 1)
            self._stop_live_ranks(job, exclude=rank.rank, why="job failed")
            return Outcome("failed", job.job_id, {"rank": rank.rank, "reason": reason})
        if kind is StopKind.SUSPECTED_GPU_FAULT:
            return self._on_suspected_fault(job, rank, stop)
        return self._converge_after_stop(job, rank, kind, duplicate=False)

    def _converge_after_stop(self, job: Job, rank: Rank, kind: StopKind, duplicate: bool) -> Outcome:
        job = self.repo.get_job(job.job_id) or job
        if job.attempt == rank.attempt:
            if job.state is JobState.PENDING_HEALTHCHECK:
                self._stop_live_ranks(job, exclude=rank.rank, why="suspected GPU fault",
                                      reissue=duplicate)
                for inst_id, verdict in job.suspects.items():
                    if verdict == "PENDING":
                        self.maybe_start_health_check(inst_id)
                if rank.container_inst_id not in job.suspects:
                    self.maybe_start_health_check(rank.container_inst_id)
            elif job.state is JobState.CANCELING:
                self._maybe_canceled(job)
            elif job.state.is_terminal:
                self._stop_live_ranks(job, exclude=rank.rank, why=f"job {job.state.value}",
                                      reissue=duplicate)
        return Outcome("duplicate" if duplicate else "recorded", job.job_id,
                       {"rank": rank.rank, "kind": kind.value})

    def _maybe_complete(self, job: Job, rank: Rank) -> Outcome:
        ranks = self.repo.get_ranks(job)
        current = [r for r in ranks if r.attempt == job.attempt]
        if len(current) == job.world_size and all(r.state is RankState.DONE for r in current):
            if self._finish_job(job, JobState.COMPLETE, "every rank exited 0"):
                logger.info("job complete", extra={"job_id": job.job_id})
            return Outcome("complete", job.job_id)
        return Outcome("rank_done", job.job_id, {"rank": rank.rank})

    def _maybe_canceled(self, job: Job) -> None:
        ranks = self.repo.get_ranks(job)
        if all(r.state.is_terminal for r in ranks):
            self.repo.apply(self.repo.job_transition(
                job.job_id, JobState.CANCELED, from_states=[JobState.CANCELING],
                attempt=None, reason="every rank stopped", actor=ACTOR))

    def _finish_job(self, job: Job, to: JobState, reason: str,
                    set_fields: dict[str, Any] | None = None) -> bool:
        from_states = [s for s in JobState if not s.is_terminal and s is not to]
        return self.repo.apply(
            self.repo.job_transition(
                job.job_id, to, from_states=from_states, attempt=job.attempt, reason=reason,
                actor=ACTOR, set_fields=set_fields, remove_fields=self.repo.deadline_attributes(),
            )
        )

    def _register_missing_ranks(self, job: Job) -> None:
        """Find ranks whose RUNNING event never arrived, so they are stopped and restarted too."""
        known = {r.rank for r in self.repo.get_ranks(job) if r.attempt == job.attempt}
        if len(known) >= job.world_size:
            return
        for task in self.ecs.running_tasks_tagged(TAG_JOB_ID, job.job_id):
            try:
                reg = registration_from_tags(task, task.get("tags", []))
            except NotProtected:
                continue
            if reg.rank not in known and reg.attempt == job.attempt:
                logger.info("registering a rank found running", extra={
                    "job_id": job.job_id, "rank": reg.rank, "task": reg.task_arn})
                self.register_rank(reg)

    def _stop_live_ranks(self, job: Job, *, exclude: int | None, why: str,
                         reissue: bool = False) -> list[int]:
        """Mark every other live rank STOP_REQUESTED (once), then ask ECS to stop it.

        With ``reissue`` (a redelivered or retried event) ranks already marked are asked
        again: StopTask is idempotent, and that finishes the job after a throttled
        StopTask made an earlier attempt fail.
        """
        stopped: list[int] = []
        for other in self.repo.get_ranks(job):
            if other.rank == exclude or other.attempt != job.attempt:
                continue
            if other.state in LIVE:
                marked = self.repo.apply(
                    self.repo.rank_update(other, RankState.STOP_REQUESTED, from_states=LIVE,
                                          set_fields={"stop_reason": why})
                )
                if not marked:
                    continue
            elif other.state is not RankState.STOP_REQUESTED or not reissue:
                continue
            self.ecs.stop_task(other.task_arn, f"{SYSTEM_STOP_REASON_PREFIX} {why}")
            stopped.append(other.rank)
        return stopped

    # --------------------------------------------------------- suspected GPU fault
    def _on_suspected_fault(self, job: Job, rank: Rank, stop: TaskStop) -> Outcome:
        reason = (f"rank {rank.rank} exited {stop.exit_code} on {rank.container_inst_id}: "
                  "suspected GPU fault")
        return self.report_suspected_fault(job.job_id, rank.attempt, rank.container_inst_id,
                                           reason, failing_rank=rank.rank)

    def report_suspected_fault(self, job_id: str, attempt: int, inst_id: str, reason: str,
                               failing_rank: int | None = None,
                               from_states: Iterable[JobState] = ACTIVE_JOB_STATES) -> Outcome:
        """Enter the recovery loop for a suspected node fault of one attempt.

        Called for a suspect exit code, and by the heartbeat service for a node lost
        too long or a hung rank. Stops the other ranks and opens (or joins) exactly one
        health check on the instance.
        """
        now = clock.now()
        entered = self.repo.apply(
            self.repo.job_transition(
                job_id, JobState.PENDING_HEALTHCHECK,
                from_states=from_states, attempt=attempt, reason=reason, actor=ACTOR,
                set_fields={"suspects": {inst_id: "PENDING"}, "fault_started_at": now,
                            "last_error": reason, "verdicts": {},
                            # In the deadline index while in recovery: the queue scheduler
                            # holds the job's nodes for its gang restart, and the sweep
                            # opens any health check this fault still lacks.
                            **self.repo.job_deadline_fields(now + RETRY_INTERVAL_SECONDS)},
            )
        )
        if entered:
            self.metrics.add_metric("FaultsDetected", "Count", 1)
        else:
            # Another rank of the same attempt got there first: this rank failed on its
            # own too, so its instance is suspect as well (one health check each).
            self.repo.apply(
                Update(
                    table=self.repo.job_table_name,
                    key={"job_id_rank": f"{job_id}#JOB"},
                    set_fields={f"suspects.{inst_id}": "PENDING"},
                    condition="#st = :phc AND #att = :att AND attribute_not_exists(#sus.#inst)",
                    condition_values={":phc": JobState.PENDING_HEALTHCHECK.value, ":att": attempt},
                    condition_names={"#st": "job_state", "#att": "attempt", "#sus": "suspects",
                                     "#inst": inst_id},
                )
            )
        job = self.repo.get_job(job_id)
        if job is None or job.state is not JobState.PENDING_HEALTHCHECK or job.attempt != attempt:
            state = job.state.value if job else "missing"
            return Outcome("recorded", job_id, {"rank": failing_rank, "why": state})
        self._register_missing_ranks(job)
        self._stop_live_ranks(job, exclude=failing_rank, why=reason)
        hc = self.request_health_check(job, inst_id)
        return Outcome("health_check_requested", job_id,
                       {"rank": failing_rank, "instance": inst_id, "health_check": hc})

    def request_health_check(self, job: Job, inst_id: str) -> str:
        """Join or open the health check of an instance; at most one per instance."""
        now = clock.now()
        opened = self.repo.apply(
            self.repo.instance_update(
                inst_id,
                from_states=[InstanceState.AVAILABLE, InstanceState.SUSPECT],
                allow_missing=True,
                to=InstanceState.HEALTH_CHECK_PENDING,
                set_fields={"hc_requested_at": now, "hc_start_attempts": 0},
                add_to_sets={"hc_jobs": {job.job_id}},
                remove_fields=["hc_task_arn", "hc_started_by"],
                deadline_at=now + RETRY_INTERVAL_SECONDS,
            )
        )
        if not opened:
            joined = self.repo.apply(
                self.repo.instance_update(
                    inst_id,
                    from_states=[InstanceState.HEALTH_CHECK_PENDING, InstanceState.HEALTH_CHECKING],
                    add_to_sets={"hc_jobs": {job.job_id}},
                )
            )
            if not joined:
                return self._suspect_instance_busy(job, inst_id)
        started = self.maybe_start_health_check(inst_id)
        return started or "waiting_for_gpus"

    def _suspect_instance_busy(self, job: Job, inst_id: str) -> str:
        """The instance is already rebooting or quarantined (another job's fault)."""
        instance = self.repo.get_instance(inst_id)
        if instance is None:
            return "instance_missing"
        if instance.state is InstanceState.REBOOTING:
            self._apply_verdicts(instance, DcgmVerdict.REBOOT, [job.job_id],
                                 {"verdict": "reboot", "source": "instance already rebooting"},
                                 instance_update=self.repo.instance_update(
                                     inst_id, from_states=[InstanceState.REBOOTING]),
                                 action=VerdictAction.REBOOT, side_effects=False)
            return "joined_reboot"
        if instance.state is InstanceState.QUARANTINED:
            self._apply_verdicts(instance, DcgmVerdict.REPLACE, [job.job_id],
                                 {"verdict": "quarantined", "source": "instance quarantined"},
                                 instance_update=self.repo.instance_update(
                                     inst_id, from_states=[InstanceState.QUARANTINED]),
                                 action=VerdictAction.QUARANTINE, side_effects=False)
            return "instance_quarantined"
        return f"instance_{instance.state.value.lower()}"

    def maybe_start_health_check(self, inst_id: str) -> str | None:
        """Start the DCGM task once the instance's GPUs are free; exactly once per claim."""
        instance = self.repo.get_instance(inst_id)
        if instance is None or instance.state is not InstanceState.HEALTH_CHECK_PENDING:
            return None
        busy = [r for r in self.repo.live_ranks_on_instance(inst_id)]
        if busy:
            logger.info("health check waits for GPUs", extra={
                "instance": inst_id, "busy_ranks": [f"{r.job_id}#{r.rank}" for r in busy]})
            return None
        seed = f"{inst_id}:{instance.hc_requested_at}:{instance.hc_start_attempts}"
        started_by = f"{HEALTH_CHECK_STARTED_BY}-{hashlib.sha256(seed.encode()).hexdigest()[:16]}"
        claimed = self.repo.apply(
            self.repo.instance_update(
                inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
                to=InstanceState.HEALTH_CHECKING, set_fields={"hc_started_by": started_by},
                extra_condition="#att = :att", extra_values={":att": instance.hc_start_attempts},
                extra_names={"#att": "hc_start_attempts"},
                deadline_at=(instance.hc_requested_at or clock.now())
                + self.settings.health_check_timeout_seconds,
            )
        )
        if not claimed:
            return None
        try:
            result = self.ecs.start_task(
                task_definition=self.settings.health_check_task,
                container_instance_arn=instance.container_instance_arn or inst_id,
                started_by=started_by,
                group=HEALTH_CHECK_GROUP,
                tags=[{"key": "gpu-recovery:purpose", "value": "dcgm-health-check"}],
            )
        except Exception:
            self._release_health_check_claim(instance, started_by, failed_start=False)
            raise
        if result.placement_failed or not result.task_arns:
            logger.warning("health check could not be placed", extra={
                "instance": inst_id, "reasons": result.reasons(),
                "attempt": instance.hc_start_attempts + 1})
            self._release_health_check_claim(instance, started_by, failed_start=True)
            return None
        task_arn = result.task_arns[0]
        self.repo.apply(
            self.repo.instance_update(
                inst_id, from_states=[InstanceState.HEALTH_CHECKING],
                set_fields={"hc_task_arn": task_arn},
                extra_condition="#sb = :sb", extra_values={":sb": started_by},
                extra_names={"#sb": "hc_started_by"},
            )
        )
        self.metrics.add_metric("HealthChecksStarted", "Count", 1)
        logger.info("health check started", extra={"instance": inst_id, "task": task_arn})
        return task_arn

    def _release_health_check_claim(self, instance: Instance, started_by: str,
                                    failed_start: bool) -> None:
        self.repo.apply(
            self.repo.instance_update(
                instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECKING],
                to=InstanceState.HEALTH_CHECK_PENDING,
                increments={"hc_start_attempts": 1} if failed_start else {},
                remove_fields=["hc_started_by"],
                deadline_at=clock.now() + RETRY_INTERVAL_SECONDS,
                extra_condition="#sb = :sb AND attribute_not_exists(#arn)",
                extra_values={":sb": started_by},
                extra_names={"#sb": "hc_started_by", "#arn": "hc_task_arn"},
            )
        )

    # ========================================================= health-check stopped
    def on_health_check_stopped(self, detail: EcsTaskDetail) -> Outcome:
        inst_id = container_instance_id(detail.containerInstanceArn or "")
        outcome = Outcome("ignored", detail={"why": "untracked instance"})
        # A job can join the check between our read and our write: the verdict's
        # condition includes the set of waiting jobs, and a lost race is retried.
        for _ in range(3):
            instance = self.repo.get_instance(inst_id) if inst_id else None
            if instance is None:
                return outcome
            outcome = self._on_health_check_stopped(instance, detail)
            fresh = self.repo.get_instance(inst_id)
            still_open = (fresh is not None and fresh.state is InstanceState.HEALTH_CHECKING
                          and fresh.hc_task_arn == detail.taskArn)
            if outcome.action != "duplicate" or not still_open:
                return outcome
        return outcome

    def _on_health_check_stopped(self, instance: Instance, detail: EcsTaskDetail) -> Outcome:
        inst_id = instance.container_inst_id
        ours = detail.taskArn == instance.hc_task_arn or (
            instance.hc_started_by and detail.startedBy == instance.hc_started_by
        )
        if instance.state is not InstanceState.HEALTH_CHECKING or not ours:
            return self._converge_after_verdict(instance, detail)
        exit_code = detail.exit_code()
        verdict = policy.parse_verdict(exit_code)
        if verdict is None:
            # The check itself did not run (image pull, OOM, ...): try again later.
            logger.warning("health check ended without a verdict", extra={
                "instance": inst_id, "exit_code": exit_code, "reason": detail.stoppedReason})
            self.repo.apply(self.repo.instance_update(
                inst_id, from_states=[InstanceState.HEALTH_CHECKING],
                to=InstanceState.HEALTH_CHECK_PENDING, increments={"hc_start_attempts": 1},
                remove_fields=["hc_task_arn", "hc_started_by"],
                deadline_at=clock.now() + RETRY_INTERVAL_SECONDS,
                extra_condition="#hct = :hct", extra_values={":hct": detail.taskArn},
                extra_names={"#hct": "hc_task_arn"}))
            return Outcome("health_check_retry", detail={"instance": inst_id})
        findings = self.verdicts.read_verdict(detail.taskArn) or {}
        findings = {"exit_code": exit_code, "verdict": verdict.name.lower(),
                    "task_arn": detail.taskArn, **findings}
        jobs = [j for j in (self.repo.get_job(job_id) for job_id in sorted(instance.hc_jobs)) if j]
        waiting = [j for j in jobs if j.state in (JobState.PENDING_HEALTHCHECK, JobState.PENDING_RESTART)]
        action = policy.instance_action(verdict, waiting)
        now = clock.now()
        # Applies only to this health check: a duplicate or stale verdict loses the race.
        condition: dict[str, Any] = {
            "extra_condition": "#hct = :hct AND size(#hcj) = :hcn",
            "extra_values": {":hct": detail.taskArn, ":hcn": len(instance.hc_jobs)},
            "extra_names": {"#hct": "hc_task_arn", "#hcj": "hc_jobs"},
        }
        common: dict[str, Any] = {"set_fields": {"last_verdict": findings}, "remove_fields": ["hc_jobs"]}
        if action is VerdictAction.MARK_AVAILABLE:
            inst_update = self.repo.instance_update(
                inst_id, from_states=[InstanceState.HEALTH_CHECKING], to=InstanceState.AVAILABLE,
                clear_deadline=True, **common, **condition)
        elif action is VerdictAction.REBOOT:
            inst_update = self.repo.instance_update(
                inst_id, from_states=[InstanceState.HEALTH_CHECKING], to=InstanceState.REBOOTING,
                set_fields={"last_verdict": findings, "reboot_requested_at": now,
                            "seen_disconnected_after_reboot": False},
                remove_fields=["hc_jobs", "reboot_issued_at"],
                deadline_at=now + min(REBOOT_ISSUE_GRACE_SECONDS, self.settings.reboot_timeout_seconds),
                **condition)
        else:
            inst_update = self.repo.instance_update(
                inst_id, from_states=[InstanceState.HEALTH_CHECKING], to=InstanceState.QUARANTINED,
                set_fields={"last_verdict": findings,
                            "quarantine_reason": f"DCGM verdict {verdict.name.lower()}"},
                remove_fields=["hc_jobs"], clear_deadline=True, **condition)
        return self._apply_verdicts(instance, verdict, [j.job_id for j in waiting], findings,
                                    instance_update=inst_update, action=action, side_effects=True)

    def _apply_verdicts(self, instance: Instance, verdict: DcgmVerdict, job_ids: Iterable[str],
                        findings: dict[str, Any], *, instance_update: Update,
                        action: VerdictAction, side_effects: bool) -> Outcome:
        """Record one instance verdict on the instance and every job waiting for it, atomically."""
        inst_id = instance.container_inst_id
        label = {VerdictAction.REBOOT: "REBOOT", VerdictAction.MARK_AVAILABLE: "HEALTHY"}.get(
            action, "REPLACE" if verdict is DcgmVerdict.REPLACE else "QUARANTINED")
        if verdict is DcgmVerdict.REBOOT and action is VerdictAction.QUARANTINE:
            label = "REBOOT"  # a reboot was needed; the budget decides below
        updates: list[Update] = [instance_update]
        decisions: list[tuple[Job, JobVerdictOutcome]] = []
        restart_jobs: set[str] = set()
        for job_id in job_ids:
            job = self.repo.get_job(job_id)
            if job is None or job.state not in (JobState.PENDING_HEALTHCHECK, JobState.PENDING_RESTART):
                continue
            suspects = {**job.suspects, inst_id: label}
            outcome = policy.job_outcome(suspects, job)
            fields: dict[str, Any] = {f"suspects.{inst_id}": label, f"verdicts.{inst_id}": findings}
            increments: dict[str, int] = {}
            to = job.state
            if outcome is JobVerdictOutcome.RESTART_AFTER_REBOOT:
                if job.state is JobState.PENDING_HEALTHCHECK:
                    to = JobState.PENDING_RESTART
                    increments["recoveries_used"] = 1
                    fields.update(self.repo.job_deadline_fields(
                        clock.now() + self.settings.reboot_timeout_seconds + RETRY_INTERVAL_SECONDS))
                if label == "REBOOT":
                    restart_jobs.add(job_id)
            elif outcome in (JobVerdictOutcome.FAIL_APPLICATION_ERROR, JobVerdictOutcome.FAIL_NODE_FAULT):
                to = JobState.FAILED
                fields["last_error"] = self._failure_text(outcome, inst_id, verdict, job)
            updates.append(self.repo.job_transition(
                job_id, to, from_states=[job.state], attempt=job.attempt,
                reason=f"verdict {label} on {inst_id}", actor=ACTOR, set_fields=fields,
                increments=increments,
                remove_fields=self.repo.deadline_attributes() if to is JobState.FAILED else None,
            ))
            decisions.append((job, outcome))
        if restart_jobs:
            updates[0].add_to_sets["waiting_jobs"] = restart_jobs
        if not self.repo.transact(updates):
            fresh = self.repo.get_instance(inst_id)
            logger.info("verdict already applied", extra={"instance": inst_id})
            if fresh is not None and side_effects:
                return self._converge_after_verdict(fresh, None)
            return Outcome("duplicate", detail={"instance": inst_id})
        logger.info("verdict applied", extra={"instance": inst_id, "verdict": label,
                                              "action": action.value})
        if side_effects:
            if action is VerdictAction.REBOOT:
                self._issue_reboot(self.repo.get_instance(inst_id) or instance)
            elif action is VerdictAction.QUARANTINE:
                self._quarantine(instance, f"DCGM verdict {verdict.name.lower()}")
        for job, outcome in decisions:
            self._notify_outcome(job, outcome, instance, verdict, action)
        if action is VerdictAction.MARK_AVAILABLE:
            # A healthy instance may be the last one a rebooted job was waiting for.
            for job, outcome in decisions:
                if outcome is JobVerdictOutcome.RESTART_AFTER_REBOOT:
                    self.try_gang_restart(job.job_id)
        return Outcome("verdict_applied", detail={"instance": inst_id, "verdict": label,
                                                  "instance_action": action.value,
                                                  "jobs": [j.job_id for j, _ in decisions]})

    @staticmethod
    def _failure_text(outcome: JobVerdictOutcome, inst_id: str, verdict: DcgmVerdict, job: Job) -> str:
        if outcome is JobVerdictOutcome.FAIL_APPLICATION_ERROR:
            return (f"DCGM found the GPUs of {inst_id} healthy: the failure was the "
                    f"application's ({job.last_error})")
        if verdict is DcgmVerdict.REBOOT:
            return (f"{inst_id} needs a reboot but the job used all {job.max_recovery_attempts} "
                    "recovery attempt(s)")
        return f"{inst_id} has a GPU fault a reboot cannot fix (DCGM verdict {verdict.name.lower()})"

    def _converge_after_verdict(self, instance: Instance, detail: EcsTaskDetail | None) -> Outcome:
        """A verdict seen again. A reboot whose API call did not go through is re-issued by
        the sweep after REBOOT_ISSUE_GRACE_SECONDS, never here: a concurrent duplicate of
        the event may still be in that call, and a second reboot could hit the node after
        it came back under the restarted job."""
        return Outcome("duplicate", detail={"instance": instance.container_inst_id})

    def _issue_reboot(self, instance: Instance) -> None:
        path = self.rebooter.reboot(
            instance.ec2_instance_id, f"gpu-recovery: DCGM asked for a reboot of "
                                      f"{instance.container_inst_id}")
        self.repo.apply(
            self.repo.instance_update(
                instance.container_inst_id, from_states=[InstanceState.REBOOTING],
                set_fields={"reboot_issued_at": clock.now(), "reboot_path": path},
                deadline_at=(instance.reboot_requested_at or clock.now())
                + self.settings.reboot_timeout_seconds,
            )
        )
        self.metrics.add_metric("Reboots", "Count", 1)
        logger.info("reboot requested", extra={"instance": instance.container_inst_id,
                                               "ec2_instance": instance.ec2_instance_id, "via": path})

    def _quarantine(self, instance: Instance, why: str) -> None:
        self.ecs.drain(instance.container_instance_arn or instance.container_inst_id)
        logger.warning("instance quarantined", extra={"instance": instance.container_inst_id,
                                                      "why": why})

    def _notify_outcome(self, job: Job, outcome: JobVerdictOutcome, instance: Instance,
                        verdict: DcgmVerdict, action: VerdictAction) -> None:
        if outcome in (JobVerdictOutcome.WAIT, JobVerdictOutcome.RESTART_AFTER_REBOOT):
            return
        self.metrics.add_metric("Failures", "Count", 1)
        if outcome is JobVerdictOutcome.FAIL_APPLICATION_ERROR:
            self._notify(job, instance, NotificationKind.APPLICATION_ERROR,
                         "Job failed: application error (GPUs healthy)",
                         what_happened=f"{job.last_error}; DCGM health check passed",
                         what_was_done="Job marked FAILED; the instance is back in service",
                         operator_action="Look at the job's logs: the GPUs passed DCGM diagnostics.")
            return
        quarantined = action is VerdictAction.QUARANTINE
        self._notify(
            job, instance,
            NotificationKind.QUARANTINED if quarantined else NotificationKind.FAILED,
            "Job failed: GPU node quarantined" if quarantined else "Job failed: GPU fault",
            what_happened=(f"{job.last_error}; DCGM verdict: {verdict.name.lower()}"),
            what_was_done=("Job marked FAILED; instance drained (DRAINING) so nothing new "
                           "is placed on it" if quarantined else "Job marked FAILED"),
            operator_action=("Inspect the node (DCGM verdict in the job record and the "
                             "health-check log), replace or repair it, then set it ACTIVE "
                             "again and resubmit the job."),
        )

    def _notify(self, job: Job, instance: Instance | None, kind: NotificationKind, headline: str,
                *, what_happened: str, what_was_done: str, operator_action: str,
                attempt: int | None = None) -> None:
        ranks: list[int] = []
        if instance is not None:
            ranks = [r.rank for r in self.repo.get_ranks(job)
                     if r.container_inst_id == instance.container_inst_id]
        facts = NotificationFacts(
            job_id=job.job_id, ranks=ranks,
            container_inst_id=instance.container_inst_id if instance else "",
            instance_id=instance.ec2_instance_id if instance else "",
            what_happened=what_happened, what_was_done=what_was_done,
            attempt=job.recoveries_used if attempt is None else attempt,
            max_attempts=job.max_recovery_attempts, operator_action=operator_action,
        )
        try:
            self.notifier.publish(build(kind, headline, facts))
        except Exception:
            # The state change is committed; a lost e-mail must not undo or retry it.
            logger.exception("notification failed", extra={"job_id": job.job_id, "kind": kind.value})

    # ===================================================== container instance events
    def on_container_instance_change(self, detail: EcsContainerInstanceDetail,
                                     event_time: datetime | None = None) -> Outcome:
        inst_id = container_instance_id(detail.containerInstanceArn)
        instance = self.repo.get_instance(inst_id)
        if instance is None or instance.state is not InstanceState.REBOOTING:
            return Outcome("ignored", detail={"instance": inst_id, "why": "not rebooting"})
        when = _timestamp(detail.updatedAt or event_time)
        if policy.is_disconnect_after_reboot(instance, agent_connected=detail.agentConnected,
                                             event_time=when):
            self.repo.apply(self.repo.instance_update(
                inst_id, from_states=[InstanceState.REBOOTING],
                set_fields={"seen_disconnected_after_reboot": True},
                extra_condition="#rq = :rq", extra_values={":rq": instance.reboot_requested_at},
                extra_names={"#rq": "reboot_requested_at"}))
            return Outcome("agent_disconnected", detail={"instance": inst_id})
        if not policy.instance_is_back(instance, status=detail.status,
                                       agent_connected=detail.agentConnected):
            return Outcome("ignored", detail={"instance": inst_id, "why": "not back yet"})
        return self._mark_back(instance)

    def on_boot_reported(self, inst_id: str, boot_time: float) -> Outcome:
        """The node agent reported a boot time: a REBOOTING node that booted after the
        request and whose ECS agent is connected is back, even if its disconnect event
        was never seen."""
        instance = self.repo.get_instance(inst_id)
        if instance is None or instance.state is not InstanceState.REBOOTING:
            return Outcome("ignored", detail={"instance": inst_id, "why": "not rebooting"})
        instance.boot_time = max(boot_time, instance.boot_time or 0.0)
        described = self.ecs.describe_container_instance(
            instance.container_instance_arn or inst_id) or {}
        if not policy.instance_is_back(instance, status=str(described.get("status", "")),
                                       agent_connected=bool(described.get("agentConnected"))):
            return Outcome("ignored", detail={"instance": inst_id, "why": "not back yet"})
        return self._mark_back(instance)

    def _mark_back(self, instance: Instance) -> Outcome:
        """REBOOTING -> AVAILABLE once, then restart every job waiting for the instance."""
        inst_id = instance.container_inst_id
        back = self.repo.apply(self.repo.instance_update(
            inst_id, from_states=[InstanceState.REBOOTING], to=InstanceState.AVAILABLE,
            set_fields={"returned_at": clock.now()},
            remove_fields=["waiting_jobs"], clear_deadline=True,
            extra_condition="#rq = :rq", extra_values={":rq": instance.reboot_requested_at},
            extra_names={"#rq": "reboot_requested_at"}))
        if not back:
            return Outcome("duplicate", detail={"instance": inst_id})
        logger.info("instance back after reboot", extra={"instance": inst_id})
        restarted = [job_id for job_id in sorted(instance.waiting_jobs)
                     if self.try_gang_restart(job_id).action == "restarted"]
        return Outcome("instance_available", detail={"instance": inst_id, "restarted": restarted})

    # ============================================================== gang restart
    def try_gang_restart(self, job_id: str) -> Outcome:
        """Restart every rank of a job once every instance it needs is available."""
        job = self.repo.get_job(job_id)
        if job is None or job.state is not JobState.PENDING_RESTART:
            return Outcome("ignored", job_id, {"why": "not pending restart"})
        ranks = [r for r in self.repo.get_ranks(job) if r.attempt == job.attempt]
        if len(ranks) != job.world_size:
            self._fail_pending_restart(job, f"rank records of attempt {job.attempt} are incomplete "
                                            f"({len(ranks)} of {job.world_size}): cannot restart")
            return Outcome("restart_failed", job_id, {"why": "rank records incomplete"})
        instances = self.repo.get_instances(r.container_inst_id for r in ranks)
        unusable = sorted(i for i, inst in instances.items()
                          if inst.state in policy.UNUSABLE_INSTANCE_STATES)
        if unusable:
            self._fail_pending_restart(job, f"instance(s) {', '.join(unusable)} the job needs "
                                            "were quarantined or marked suspect meanwhile")
            return Outcome("restart_failed", job_id, {"unusable": unusable})
        stopping = [r.rank for r in ranks if not r.state.is_terminal]
        if (len(instances) < len({r.container_inst_id for r in ranks})
                or not policy.gang_ready(instances.values()) or stopping):
            # Also wait until every old rank has stopped: its GPUs are the restart's.
            return Outcome("waiting", job_id, {"stopping_ranks": stopping, "instances": {
                i: inst.state.value for i, inst in instances.items()}})
        new_attempt = job.attempt + 1
        claimed = self.repo.apply(self.repo.job_transition(
            job_id, JobState.STARTING, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=f"gang restart, attempt {new_attempt}", actor=ACTOR,
            set_fields={"attempt": new_attempt, "restarted_at": clock.now(),
                        **self.repo.job_deadline_fields(clock.now() + RESTART_CONFIRM_SECONDS)},
        ))
        if not claimed:
            return Outcome("duplicate", job_id)
        launched = self._launch_ranks(job, ranks, new_attempt)
        if launched is None:
            return Outcome("restart_failed", job_id)
        self.metrics.add_metric("Recoveries", "Count", 1)
        if job.fault_started_at:
            self.metrics.add_metric("TimeToRestartSeconds", "Seconds",
                                    clock.now() - job.fault_started_at)
        fresh = self.repo.get_job(job_id) or job
        self._notify(
            fresh, None, NotificationKind.RECOVERED, "Job recovered and restarted",
            what_happened=job.last_error or "suspected GPU fault",
            what_was_done=(f"DCGM health check, reboot of "
                           f"{', '.join(sorted(i for i, v in job.suspects.items() if v == 'REBOOT'))}; "
                           f"all {job.world_size} ranks restarted as attempt {new_attempt}"),
            operator_action="Nothing; watch the job. Repeated faults on the same node mean "
                            "it should be replaced.",
        )
        return Outcome("restarted", job_id, {"attempt": new_attempt, "tasks": launched})

    def _fail_pending_restart(self, job: Job, reason: str) -> None:
        if self.repo.apply(self.repo.job_transition(
            job.job_id, JobState.FAILED, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=reason, actor=ACTOR, set_fields={"last_error": reason},
            remove_fields=self.repo.deadline_attributes(),
        )):
            self.metrics.add_metric("Failures", "Count", 1)
            self._notify(job, None, NotificationKind.FAILED, "Job failed: cannot be restarted",
                         what_happened=reason, what_was_done="Job marked FAILED",
                         operator_action="Repair or replace the node, set it ACTIVE again, and "
                                         "resubmit the job.")

    def _launch_ranks(self, job: Job, ranks: list[Rank], attempt: int) -> list[str] | None:
        """Start every rank of ``attempt`` not yet started (crash-safe by startedBy)."""
        launched: list[str] = []
        for rank in sorted(ranks, key=lambda r: r.rank):
            started_by = restart_started_by(job.job_id, attempt, rank.rank)
            existing = self.ecs.tasks_started_by(started_by) if rank.attempt == attempt - 1 and \
                self._possibly_started(job) else []
            task_arn = existing[0] if existing else self._start_rank(rank, attempt, started_by)
            if task_arn is None:
                self._fail_restart(job, rank, attempt)
                return None
            self.register_rank(RankRegistration(
                job_id=job.job_id, rank=rank.rank, world_size=job.world_size, attempt=attempt,
                task_arn=task_arn, task_definition_arn=rank.task_definition_arn,
                container_instance_arn=rank.container_instance_arn,
                ec2_instance_id=rank.ec2_instance_id, overrides=rank.overrides,
                tags=self._tags_for_attempt(rank.tags, attempt), group=rank.group,
                started_by=started_by, state=RankState.STARTING,
            ))
            launched.append(task_arn)
        return launched

    @staticmethod
    def _possibly_started(job: Job) -> bool:
        # Only a sweep retry can find tasks of an attempt already started.
        return job.state is JobState.STARTING

    @staticmethod
    def _tags_for_attempt(tags: list[dict[str, str]], attempt: int) -> list[dict[str, str]]:
        kept = [t for t in tags if t.get("key") != TAG_ATTEMPT]
        return [*kept, {"key": TAG_ATTEMPT, "value": str(attempt)}]

    def _start_rank(self, rank: Rank, attempt: int, started_by: str) -> str | None:
        for _ in range(self.settings.restart_start_retries):
            result = self.ecs.start_task(
                task_definition=rank.task_definition_arn,
                container_instance_arn=rank.container_instance_arn or rank.container_inst_id,
                overrides=rank.overrides,
                tags=self._tags_for_attempt(rank.tags, attempt),
                started_by=started_by,
                group=rank.group or None,
            )
            if result.task_arns:
                return result.task_arns[0]
            logger.warning("restart placement failed", extra={
                "job_id": rank.job_id, "rank": rank.rank, "reasons": result.reasons()})
        return None

    def _fail_restart(self, job: Job, rank: Rank, attempt: int) -> None:
        reason = f"could not start rank {rank.rank} on {rank.container_inst_id} for attempt {attempt}"
        fresh = self.repo.get_job(job.job_id) or job
        if self._finish_job(fresh, JobState.FAILED, reason, set_fields={"last_error": reason}):
            self.metrics.add_metric("Failures", "Count", 1)
            self._stop_live_ranks(fresh, exclude=None, why="restart failed")
            self._notify(fresh, None, NotificationKind.FAILED, "Job failed: restart failed",
                         what_happened=reason, what_was_done="Job marked FAILED; started ranks stopped",
                         operator_action="Check the cluster's capacity and the instance, then "
                                         "resubmit the job.")

    # ===================================================================== sweep
    def sweep(self) -> Outcome:
        """Scheduled: timeouts and retries; reads only items whose deadline passed."""
        now = clock.now()
        handled: dict[str, int] = {}
        for instance in self.repo.due_instances(now):
            try:
                action = self._sweep_instance(instance, now)
            except Exception:
                logger.exception("sweep of instance failed", extra={
                    "instance": instance.container_inst_id})
                action = "error"
            handled[action] = handled.get(action, 0) + 1
        for item in self.repo.due_job_items(now):
            try:
                action = self._sweep_job(item, now)
            except Exception:
                logger.exception("sweep of job failed", extra={"job_id": item.get("job_id")})
                action = "error"
            handled[action] = handled.get(action, 0) + 1
        return Outcome("swept", detail={"handled": handled})

    def _sweep_instance(self, instance: Instance, now: float) -> str:
        inst_id = instance.container_inst_id
        if instance.state is InstanceState.REBOOTING:
            requested = instance.reboot_requested_at or now
            if now >= requested + self.settings.reboot_timeout_seconds:
                return self._instance_timed_out(instance, NotificationKind.REBOOT_TIMEOUT,
                                                "did not come back after its reboot",
                                                [InstanceState.REBOOTING], instance.waiting_jobs)
            if instance.reboot_issued_at is None:
                self._issue_reboot(instance)
                return "reboot_reissued"
            self.repo.apply(self.repo.instance_update(
                inst_id, from_states=[InstanceState.REBOOTING],
                deadline_at=requested + self.settings.reboot_timeout_seconds))
            return "rebooting"
        if instance.state is InstanceState.HEALTH_CHECK_PENDING:
            requested = instance.hc_requested_at or now
            out_of_time = now >= requested + self.settings.health_check_timeout_seconds
            if out_of_time or instance.hc_start_attempts >= self.settings.health_check_start_retries:
                return self._instance_timed_out(
                    instance, NotificationKind.HEALTH_CHECK_TIMEOUT,
                    f"health check could not start ({instance.hc_start_attempts} placement "
                    f"attempt(s))", [InstanceState.HEALTH_CHECK_PENDING], instance.hc_jobs,
                    verdict_label="UNAVAILABLE", quarantine=False)
            started = self.maybe_start_health_check(inst_id)
            if started is None:
                self.repo.apply(self.repo.instance_update(
                    inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
                    deadline_at=now + RETRY_INTERVAL_SECONDS))
            return "health_check_retried"
        if instance.state is InstanceState.HEALTH_CHECKING:
            if not instance.hc_task_arn and instance.hc_started_by:
                # Crashed between claim and StartTask (or the write after it).
                found = self.ecs.tasks_started_by(instance.hc_started_by)
                if found:
                    self.repo.apply(self.repo.instance_update(
                        inst_id, from_states=[InstanceState.HEALTH_CHECKING],
                        set_fields={"hc_task_arn": found[0]}))
                else:
                    self._release_health_check_claim(instance, instance.hc_started_by, False)
                return "health_check_recovered"
            requested = instance.hc_requested_at or now
            if now >= requested + self.settings.health_check_timeout_seconds:
                if instance.hc_task_arn:
                    self.ecs.stop_task(instance.hc_task_arn,
                                       f"{SYSTEM_STOP_REASON_PREFIX} health check timed out")
                return self._instance_timed_out(
                    instance, NotificationKind.HEALTH_CHECK_TIMEOUT,
                    "health check did not finish in time", [InstanceState.HEALTH_CHECKING],
                    instance.hc_jobs, verdict_label="TIMEOUT")
            return "health_check_running"
        self.repo.apply(self.repo.instance_update(inst_id, clear_deadline=True))
        return "cleared"

    def _instance_timed_out(self, instance: Instance, kind: NotificationKind, what: str,
                            from_states: list[InstanceState], job_ids: Iterable[str], *,
                            verdict_label: str = "TIMEOUT", quarantine: bool = True) -> str:
        inst_id = instance.container_inst_id
        updates = [self.repo.instance_update(
            inst_id, from_states=from_states,
            to=InstanceState.QUARANTINED if quarantine else InstanceState.SUSPECT,
            set_fields={"quarantine_reason": what}, remove_fields=["hc_jobs", "waiting_jobs"],
            clear_deadline=True)]
        failed: list[Job] = []
        for job_id in sorted(job_ids):
            job = self.repo.get_job(job_id)
            if job is None or job.state not in (JobState.PENDING_HEALTHCHECK, JobState.PENDING_RESTART):
                continue
            reason = f"instance {inst_id} {what}"
            updates.append(self.repo.job_transition(
                job_id, JobState.FAILED, from_states=[job.state], attempt=job.attempt,
                reason=reason, actor="sweep",
                set_fields={"last_error": reason, f"suspects.{inst_id}": verdict_label},
                remove_fields=self.repo.deadline_attributes()))
            failed.append(job)
        if not self.repo.transact(updates):
            return "raced"
        if quarantine:
            self._quarantine(instance, what)
        for job in failed:
            self.metrics.add_metric("Failures", "Count", 1)
            self._notify(job, instance, kind, f"Job failed: instance {what}",
                         what_happened=f"Instance {inst_id} {what}",
                         what_was_done="Job marked FAILED" + (
                             "; instance drained (DRAINING)" if quarantine else
                             "; instance marked SUSPECT"),
                         operator_action="Check the instance (console, SSM, ECS agent log); "
                                         "repair or replace it, then resubmit the job.")
        return kind.value

    def _sweep_job(self, item: dict[str, Any], now: float) -> str:
        if item.get("item_type") != "JOB":
            return "ignored"
        job = self.repo.job_from_item(item)
        if job.state is JobState.PENDING_RESTART:
            give_up_at = (job.fault_started_at or now) + self.settings.health_check_timeout_seconds \
                + self.settings.reboot_timeout_seconds + RESTART_CONFIRM_SECONDS
            if now >= give_up_at:
                self._fail_pending_restart(job, "the gang restart did not happen in time "
                                                "(instances or old ranks never became ready)")
                return "restart_timed_out"
            outcome = self.try_gang_restart(job.job_id)
            if outcome.action == "waiting":
                self._rearm(job, now + RETRY_INTERVAL_SECONDS)
            return f"restart_{outcome.action}"
        if job.state is JobState.PENDING_HEALTHCHECK:
            # Open any health check this fault still lacks (its opening may have been cut
            # short by an AWS error after the job was committed). Timeouts of open checks
            # are the instance sweep's; the deadline keeps the job's nodes held meanwhile.
            for inst_id, verdict in sorted(job.suspects.items()):
                if verdict == "PENDING" and not self._waits_on(job, inst_id):
                    self.request_health_check(job, inst_id)
            self._rearm(job, now + RETRY_INTERVAL_SECONDS)
            return "health_check_waiting"
        if job.state is JobState.STARTING and job.source == "ecs-tags":
            ranks = self.repo.get_ranks(job)
            stale = [r for r in ranks if r.attempt == job.attempt - 1]
            if stale:
                launched = self._launch_ranks(job, stale, job.attempt)
                return "restart_resumed" if launched is not None else "restart_failed"
            if self._running_once_gang_registered(job, "restart launched", actor="sweep"):
                return "restart_confirmed"
        self.repo.apply(Update(
            table=self.repo.job_table_name, key={"job_id_rank": f"{job.job_id}#JOB"},
            remove_fields=self.repo.deadline_attributes(),
            # Only the deadline this sweep read: a newer one (new state) stays.
            condition="#st = :st AND #dl = :dl",
            condition_values={":st": job.state.value, ":dl": item.get("deadline_at")},
            condition_names={"#st": "job_state", "#dl": "deadline_at"},
        ))
        return "cleared"

    def _waits_on(self, job: Job, inst_id: str) -> bool:
        """Whether an instance already has this job in its health check or reboot."""
        instance = self.repo.get_instance(inst_id)
        if instance is None:
            return False
        if instance.state in (InstanceState.HEALTH_CHECK_PENDING, InstanceState.HEALTH_CHECKING):
            return job.job_id in instance.hc_jobs
        if instance.state is InstanceState.REBOOTING:
            return job.job_id in instance.waiting_jobs
        return False

    def _rearm(self, job: Job, deadline_at: float) -> None:
        """Push a job's deadline (no history entry: nothing happened to the job)."""
        self.repo.apply(Update(
            table=self.repo.job_table_name, key={"job_id_rank": f"{job.job_id}#JOB"},
            set_fields=self.repo.job_deadline_fields(deadline_at),
            condition="#st = :st AND #att = :att",
            condition_values={":st": job.state.value, ":att": job.attempt},
            condition_names={"#st": "job_state", "#att": "attempt"},
        ))
