"""Stage 1: training task state changes -> rank records, job outcomes, fault detection.

A STOPPED event is classified by what ECS says (``stopCode``, ``stoppedReason``, exit
code), never by what we intended, so the faulty rank is a suspect whichever of the
cascade's events is processed first. The rank's stop and the job's reaction are one
transaction; a redelivered event finds both written (or neither) and goes on with the
side effects the job's state still needs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import HEALTH_CHECK_GROUP
from gpu_recovery.domain import policy
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.policy import StopKind, StopReaction, TaskStop
from gpu_recovery.domain.states import ACTIVE_JOB_STATES, HOLDING_RANK_STATES, JobState, RankState
from gpu_recovery.ecs_events import EcsTaskDetail
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.health_checks import HealthChecks
from gpu_recovery.recovery.ports import Deps, Outcome
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.repository import RankStop

logger = logging.getLogger(__name__)

RETRY_INTERVAL_SECONDS = 60
_RANK_STATE_FOR = {
    StopKind.SUCCEEDED: RankState.DONE,
    StopKind.STOPPED_BY_SYSTEM: RankState.STOPPED,
    StopKind.STOPPED_BY_USER: RankState.STOPPED,
    StopKind.SUSPECTED_GPU_FAULT: RankState.FAILED,
    StopKind.FAILED: RankState.FAILED,
}
_ENDING_REASON = {JobState.USER_STOPPED: "job stopped by a user", JobState.FAILED: "job failed",
                  JobState.CANCELED: "job canceled", JobState.COMPLETE: "job complete"}
_WRITE_ROUNDS = 3  # a lost race re-reads and decides again; a third loss means "moved on"


class TaskEvents:
    def __init__(self, deps: Deps, ranks: RankOperations, health: HealthChecks,
                 restarts: GangRestart) -> None:
        self.deps = deps
        self.ranks = ranks
        self.health = health
        self.restarts = restarts

    def on_task_state_change(self, detail: EcsTaskDetail) -> Outcome:
        if detail.group.startswith(HEALTH_CHECK_GROUP):
            return Outcome("ignored", detail={"why": "health-check task"})
        if detail.lastStatus == "RUNNING":
            return self._on_running(detail)
        if detail.lastStatus == "STOPPED":
            return self._on_stopped(detail)
        return Outcome("ignored", detail={"why": f"lastStatus {detail.lastStatus}"})

    # ------------------------------------------------------------------ RUNNING
    def _on_running(self, detail: EcsTaskDetail) -> Outcome:
        rank = self.ranks.rank_for_task(detail)
        if rank is None:
            return Outcome("ignored", detail={"why": "not a protected job"})
        if rank.task_arn != detail.taskArn:
            return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        if rank.state is RankState.STARTING:
            self.deps.repo.mark_rank_running(rank)
        job = self.deps.repo.get_job(rank.job_id)
        if job and job.state is JobState.STARTING and job.attempt == rank.attempt:
            self.restarts.confirm_running(job, f"rank {rank.rank} running")
        return Outcome("running", rank.job_id, {"rank": rank.rank})

    # ------------------------------------------------------------------ STOPPED
    def _on_stopped(self, detail: EcsTaskDetail) -> Outcome:
        rank = self.ranks.rank_for_task(detail)
        if rank is None:
            return Outcome("ignored", detail={"why": "not a protected job"})
        if rank.task_arn != detail.taskArn:
            return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        stop = TaskStop(detail.exit_code(), detail.stopCode, detail.stoppedReason)
        kind = policy.classify_stop(stop, self.deps.settings.suspect_exit_codes)
        fields: dict[str, Any] = {"stop_reason": policy.describe_failure(stop)[:500]}
        if stop.exit_code is not None:
            fields["exit_code"] = stop.exit_code
        repo = self.deps.repo
        for _ in range(_WRITE_ROUNDS):
            job = repo.get_job(rank.job_id)
            if job is None:
                return Outcome("ignored", rank.job_id, {"why": "job record missing"})
            rank_stop = RankStop(rank, _RANK_STATE_FOR[kind], fields) if rank.state in HOLDING_RANK_STATES \
                else None
            reaction = policy.stop_reaction(kind, job.state, job.attempt == rank.attempt)
            if self._record(job, rank, stop, reaction, rank_stop):
                return self._follow_up(job, rank, kind, reaction, redelivered=rank_stop is None)
            rank = repo.get_rank(rank.job_id, rank.rank) or rank
            if rank.task_arn != detail.taskArn:
                return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        latest = repo.get_job(rank.job_id)
        if latest is None:
            return Outcome("ignored", rank.job_id, {"why": "job record missing"})
        return self._converge(latest, redelivered=True, kind=kind, rank=rank)

    def _record(self, job: Job, rank: Rank, stop: TaskStop, reaction: StopReaction,
                rank_stop: RankStop | None) -> bool:
        """Write the rank's stop and the job's reaction together; False if a race was lost."""
        repo = self.deps.repo
        if reaction is StopReaction.USER_STOPPED:
            reason = (f"rank {rank.rank} stopped by a user ({stop.stopped_reason or 'UserInitiated'})")
            return repo.finish_job(job.job_id, job.attempt, JobState.USER_STOPPED, reason,
                                   rank_stop=rank_stop)
        if reaction is StopReaction.FAIL_JOB:
            reason = f"rank {rank.rank} failed: {policy.describe_failure(stop)}"
            done = repo.finish_job(job.job_id, job.attempt, JobState.FAILED, reason,
                                   fields={"last_error": reason[:1000]}, rank_stop=rank_stop)
            if done:
                self.deps.metrics.add_metric("Failures", "Count", 1)
            return done
        if reaction is StopReaction.ENTER_RECOVERY:
            reason = (f"rank {rank.rank} exited {stop.exit_code} on {rank.container_inst_id}: "
                      "suspected GPU fault")
            return self._enter_recovery(job, rank.container_inst_id, reason, rank_stop,
                                        from_states=ACTIVE_JOB_STATES)
        if reaction is StopReaction.ADD_SUSPECT:
            return repo.add_suspects(job.job_id, job.attempt, [rank.container_inst_id], rank_stop)
        return rank_stop is None or repo.record_rank_stop(rank_stop)

    def _enter_recovery(self, job: Job, inst_id: str, reason: str, rank_stop: RankStop | None,
                        from_states: Iterable[JobState]) -> bool:
        now = clock.now()
        suspects = policy.suspects_for_fault(
            inst_id, (r.container_inst_id for r in self._current_ranks(job)),
            check_all_nodes=self.deps.settings.check_all_nodes_on_fault)
        entered = self.deps.repo.enter_recovery(
            job.job_id, job.attempt, from_states=from_states, suspects=suspects, reason=reason,
            now=now, deadline_at=now + RETRY_INTERVAL_SECONDS, rank_stop=rank_stop)
        if entered:
            self.deps.metrics.add_metric("FaultsDetected", "Count", 1)
            logger.info("suspected GPU fault", extra={"job_id": job.job_id, "suspects": suspects,
                                                      "why": reason})
        return entered

    def _current_ranks(self, job: Job) -> list[Rank]:
        if not self.deps.settings.check_all_nodes_on_fault:
            return []
        return [r for r in self.deps.repo.get_ranks(job) if r.attempt == job.attempt]

    def _follow_up(self, job: Job, rank: Rank, kind: StopKind, reaction: StopReaction, *,
                   redelivered: bool) -> Outcome:
        fresh = self.deps.repo.get_job(job.job_id) or job
        if reaction is StopReaction.MAYBE_COMPLETE:
            return self._maybe_complete(fresh, rank)
        outcome = self._converge(fresh, redelivered=redelivered, kind=kind, rank=rank)
        if reaction in (StopReaction.ENTER_RECOVERY, StopReaction.ADD_SUSPECT):
            return Outcome("health_check_requested", job.job_id,
                           {"rank": rank.rank, "instance": rank.container_inst_id, **outcome.detail})
        if reaction is StopReaction.USER_STOPPED:
            return Outcome("user_stopped", job.job_id, {"rank": rank.rank})
        if reaction is StopReaction.FAIL_JOB:
            return Outcome("failed", job.job_id, {"rank": rank.rank, "reason": fresh.last_error})
        return outcome

    def _converge(self, job: Job, *, redelivered: bool, kind: StopKind, rank: Rank) -> Outcome:
        """Do what the job's state still needs (the work a dead delivery left undone)."""
        detail: dict[str, Any] = {"rank": rank.rank, "kind": kind.value}
        if job.attempt != rank.attempt:
            return Outcome("recorded", job.job_id, {**detail, "why": "older attempt"})
        if job.state is JobState.PENDING_HEALTHCHECK:
            detail["health_checks"] = self.converge_fault(job, reissue=redelivered)
        elif job.state is JobState.CANCELING:
            self._maybe_canceled(job)
        elif job.state.is_terminal:
            self.ranks.stop_live_ranks(job, why=_ENDING_REASON.get(job.state, f"job {job.state.value}"),
                                       reissue=redelivered)
        return Outcome("duplicate" if redelivered else "recorded", job.job_id, detail)

    # ---------------------------------------------------------- suspected fault
    def report_suspected_fault(self, job_id: str, attempt: int, inst_id: str, reason: str,
                               failing_rank: int | None = None,
                               from_states: Iterable[JobState] = ACTIVE_JOB_STATES) -> Outcome:
        """Enter the recovery loop for a suspected node fault of one attempt (the heartbeat
        service calls it for a node lost too long or a hung rank)."""
        job = self.deps.repo.get_job(job_id)
        if job is None or job.attempt != attempt:
            return Outcome("recorded", job_id, {"rank": failing_rank, "why": "attempt moved on"})
        states = list(from_states)
        if job.state in states:
            self._enter_recovery(job, inst_id, reason, None, from_states=states)
        elif job.state is JobState.PENDING_HEALTHCHECK:
            self.deps.repo.add_suspects(job_id, attempt, [inst_id])
        job = self.deps.repo.get_job(job_id)
        if job is None or job.state is not JobState.PENDING_HEALTHCHECK or job.attempt != attempt:
            state = job.state.value if job else "missing"
            return Outcome("recorded", job_id, {"rank": failing_rank, "why": state})
        checks = self.converge_fault(job, reissue=False)
        return Outcome("health_check_requested", job_id,
                       {"rank": failing_rank, "instance": inst_id, "health_checks": checks})

    def converge_fault(self, job: Job, *, reissue: bool) -> dict[str, str]:
        """A job in PENDING_HEALTHCHECK: every other rank stopped, every pending suspect's
        health check opened (or joined) and started once its GPUs are free."""
        # Checks first: a suspect's GPUs are free once its own rank stopped, so an error
        # stopping the other ranks must not hold its check back.
        checks = {inst_id: self.health.request(job, inst_id)
                  for inst_id in policy.verdicts_pending(job.suspects)}
        self.ranks.stop_live_ranks(job, why=job.last_error or "suspected GPU fault", reissue=reissue,
                                   ranks=self.ranks.current_ranks(job))
        return checks

    # ------------------------------------------------------------ job endings
    def _maybe_complete(self, job: Job, rank: Rank) -> Outcome:
        current = [r for r in self.deps.repo.get_ranks(job) if r.attempt == job.attempt]
        if len(current) == job.world_size and all(r.state is RankState.DONE for r in current):
            if self.deps.repo.finish_job(job.job_id, job.attempt, JobState.COMPLETE, "every rank exited 0"):
                logger.info("job complete", extra={"job_id": job.job_id})
            return Outcome("complete", job.job_id)
        return Outcome("rank_done", job.job_id, {"rank": rank.rank})

    def _maybe_canceled(self, job: Job) -> None:
        if all(r.state.is_terminal for r in self.deps.repo.get_ranks(job)):
            self.deps.repo.mark_job_canceled(job.job_id, "every rank stopped")
