"""Rank operations shared by the stages: registration, discovery, stopping, notifying."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    SYSTEM_STOP_REASON_PREFIX,
    TAG_ATTEMPT,
    TAG_JOB_ID,
    TAG_MAX_APP_RESTARTS,
    TAG_MAX_INFRA_RECOVERIES,
    TAG_RANK,
    TAG_WORLD_SIZE,
    NotificationKind,
)
from gpu_recovery.domain.job_budgets import MAX_BUDGET
from gpu_recovery.domain.models import Instance, Job, Rank, container_instance_id
from gpu_recovery.domain.notifications import NotificationFacts, build
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.states import LIVE_RANK_STATES, JobState, RankState
from gpu_recovery.ecs_events import EcsTaskDetail
from gpu_recovery.recovery.ports import Deps

logger = logging.getLogger(__name__)

# A rank asked to stop this long ago and still not seen STOPPED is asked again (StopTask
# is idempotent): a crash or an error between the mark and the call left it unasked.
STOP_REISSUE_AFTER_SECONDS = 30
MAX_WORLD_SIZE = 1024


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
    max_recovery_attempts: int | None = None  # infrastructure recoveries (None: the deployment's)
    max_app_restarts: int | None = None  # application-error restarts (None: the deployment's)
    gpus: int = 0  # GPUs the task holds (0: unknown)


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
    if not job_id or "#" in job_id or not 0 <= rank < world_size or world_size > MAX_WORLD_SIZE:
        raise NotProtected(f"malformed recovery tags: {values}")
    gpus = sum(len(c.get("gpuIds") or []) for c in task.get("containers") or [] if isinstance(c, dict))
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
        max_recovery_attempts=_budget_tag(values, TAG_MAX_INFRA_RECOVERIES),
        max_app_restarts=_budget_tag(values, TAG_MAX_APP_RESTARTS),
        gpus=gpus,
    )


def _budget_tag(values: dict[Any, Any], key: str) -> int | None:
    """A per-job budget tag; a malformed one is ignored (the deployment's default applies)."""
    raw = str(values.get(key) or "").strip()
    if not raw.isdigit() or int(raw) > MAX_BUDGET:
        if raw:
            logger.warning("ignoring malformed budget tag", extra={"tag": key, "value": raw})
        return None
    return int(raw)


def restart_started_by(job_id: str, attempt: int, rank: int) -> str:
    """Deterministic per attempt and rank (ECS allows 36 characters): finds duplicates."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:10]
    return f"gpurec-{digest}-a{attempt}-r{rank}"[:36]


def tags_for_attempt(tags: list[dict[str, str]], attempt: int) -> list[dict[str, str]]:
    kept = [t for t in tags if t.get("key") != TAG_ATTEMPT]
    return [*kept, {"key": TAG_ATTEMPT, "value": str(attempt)}]


class RankOperations:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    # ------------------------------------------------------------- registration
    def register_rank(self, reg: RankRegistration) -> Rank:
        """Protect a rank: the task handler calls it on RUNNING, the queue at launch."""
        repo = self.deps.repo
        now = clock.now()
        inst_id = container_instance_id(reg.container_instance_arn)
        ec2_id = reg.ec2_instance_id or self._ec2_instance_id(inst_id, reg.container_instance_arn)
        repo.put_instance_if_absent(
            Instance(inst_id, container_instance_arn=reg.container_instance_arn, ec2_instance_id=ec2_id)
        )
        max_attempts = (reg.max_recovery_attempts if reg.max_recovery_attempts is not None
                        else self.deps.settings.max_recovery_attempts)
        max_app = (reg.max_app_restarts if reg.max_app_restarts is not None
                   else self.deps.settings.max_app_restarts)
        repo.create_job_if_absent(Job(
            job_id=reg.job_id,
            state=JobState.RUNNING if reg.state is RankState.RUNNING else JobState.STARTING,
            world_size=reg.world_size, attempt=reg.attempt, max_recovery_attempts=max_attempts,
            max_app_restarts=max_app, created_at=now, updated_at=now,
        ))
        rank = Rank(
            job_id=reg.job_id, rank=reg.rank, state=reg.state, attempt=reg.attempt,
            task_arn=reg.task_arn, task_definition_arn=reg.task_definition_arn,
            container_inst_id=inst_id, container_instance_arn=reg.container_instance_arn,
            ec2_instance_id=ec2_id, overrides=reg.overrides, tags=reg.tags, group=reg.group,
            started_by=reg.started_by, registered_at=now, gpus=reg.gpus,
        )
        if repo.put_rank_registration(rank):
            logger.info("rank registered", extra={"job_id": reg.job_id, "rank": reg.rank,
                                                  "attempt": reg.attempt, "task": reg.task_arn})
        return repo.get_rank(reg.job_id, reg.rank) or rank

    def _ec2_instance_id(self, inst_id: str, arn: str) -> str:
        known = self.deps.repo.get_instance(inst_id)
        if known and known.ec2_instance_id:
            return known.ec2_instance_id
        described = self.deps.ecs.describe_container_instance(arn or inst_id)
        return str((described or {}).get("ec2InstanceId", ""))

    def rank_for_task(self, detail: EcsTaskDetail) -> Rank | None:
        rank = self.deps.repo.find_rank_by_task(detail.taskArn)
        if rank is not None:
            return rank
        # Unknown task: out-of-order delivery, index lag, or a job launched by another
        # tool. Tags decide, and only DescribeTasks(include=TAGS) returns them.
        task = self.deps.ecs.describe_task(detail.taskArn)
        if task is None:
            return None
        try:
            reg = registration_from_tags(task, task.get("tags", []))
        except NotProtected as reason:
            logger.debug("task not protected", extra={"task": detail.taskArn, "why": str(reason)})
            return None
        return self.register_rank(reg)

    def current_ranks(self, job: Job) -> list[Rank]:
        """The attempt's ranks, registering any whose RUNNING event never arrived (found
        running by its tags), so they are stopped and restarted too."""
        ranks = [r for r in self.deps.repo.get_ranks(job) if r.attempt == job.attempt]
        if len(ranks) < job.world_size:
            self.register_missing_ranks(job, {r.rank for r in ranks})
            ranks = [r for r in self.deps.repo.get_ranks(job) if r.attempt == job.attempt]
        return ranks

    def register_missing_ranks(self, job: Job, known: set[int]) -> None:
        for task in self.deps.ecs.running_tasks_tagged(TAG_JOB_ID, job.job_id):
            try:
                reg = registration_from_tags(task, task.get("tags", []))
            except NotProtected:
                continue
            if reg.rank not in known and reg.attempt == job.attempt:
                logger.info("registering a rank found running", extra={
                    "job_id": job.job_id, "rank": reg.rank, "task": reg.task_arn})
                self.register_rank(reg)

    # ----------------------------------------------------------------- stopping
    def stop_live_ranks(self, job: Job, *, why: str, reissue: bool = False,
                        ranks: list[Rank] | None = None, remediation: bool = True) -> list[int]:
        """Mark every live rank of the attempt STOP_REQUESTED (once), then ask ECS to stop it.

        With ``reissue`` (a retried event, the sweep), ranks marked a while ago and still
        not STOPPED are asked again: StopTask is idempotent, and that finishes the work of
        an invocation that died between the mark and the call. Observe mode holds back
        the stops of a remediation only (``remediation=False``: a suspension, a cancel).
        """
        stopped: list[int] = []
        now = clock.now()
        if remediation and not self.deps.policy.modes.executes(Effect.STOP_TASKS):
            logger.info("observe mode: ranks not stopped", extra={"job_id": job.job_id, "why": why})
            return stopped
        for other in self.deps.repo.get_ranks(job) if ranks is None else ranks:
            if other.attempt != job.attempt:
                continue
            if other.state in LIVE_RANK_STATES:
                if not self.deps.repo.request_rank_stop(other, why, now):
                    continue
            elif not (reissue and other.state is RankState.STOP_REQUESTED
                      and (other.stop_requested_at or 0.0) <= now - STOP_REISSUE_AFTER_SECONDS):
                continue
            self.deps.ecs.stop_task(other.task_arn, f"{SYSTEM_STOP_REASON_PREFIX} {why}")
            stopped.append(other.rank)
        return stopped

    # ------------------------------------------------------------ notifications
    def notify(self, job: Job, instance: Instance | None, kind: NotificationKind, headline: str, *,
               what_happened: str, what_was_done: str, operator_action: str,
               details: list[str] | None = None) -> None:
        ranks: list[int] = []
        if instance is not None:
            ranks = [r.rank for r in self.deps.repo.get_ranks(job)
                     if r.container_inst_id == instance.container_inst_id]
        facts = NotificationFacts(
            job_id=job.job_id, ranks=ranks,
            container_inst_id=instance.container_inst_id if instance else "",
            instance_id=instance.ec2_instance_id if instance else "",
            what_happened=what_happened, what_was_done=what_was_done,
            attempt=job.recoveries_used, max_attempts=job.max_recovery_attempts,
            operator_action=operator_action,
            details=[*(details or ()), *_budget_lines(job)],
        )
        self._publish(kind, headline, facts)

    def notify_node(self, kind: NotificationKind, headline: str, *, container_inst_id: str, instance_id: str,
                    what_happened: str, what_was_done: str, operator_action: str,
                    details: list[str] | None = None) -> None:
        """A node-level message (breaker tripped, a node that needs a person)."""
        self._publish(kind, headline, NotificationFacts(
            job_id="", container_inst_id=container_inst_id, instance_id=instance_id,
            what_happened=what_happened, what_was_done=what_was_done, operator_action=operator_action,
            details=list(details or ())))

    def _publish(self, kind: NotificationKind, headline: str, facts: NotificationFacts) -> None:
        try:
            self.deps.notifier.publish(build(kind, headline, facts))
        except Exception:
            # The state change is committed; a lost e-mail must not undo or retry it.
            logger.exception("notification failed", extra={"job_id": facts.job_id, "kind": kind.value})


def _budget_lines(job: Job) -> list[str]:
    return [f"Job budgets: infrastructure recoveries {job.recoveries_used} of {job.max_recovery_attempts} "
            f"used, application-error restarts {job.app_restarts_used} of {job.max_app_restarts} used"]
