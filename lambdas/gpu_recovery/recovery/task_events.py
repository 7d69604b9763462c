"""Stage 1: training task state changes -> rank records, job outcomes, fault detection.

A STOPPED event is classified by what ECS says (``stopCode``, ``stoppedReason``, exit
code), never by what we intended, so the faulty rank is a suspect whichever of the
cascade's events is processed first. A rank that exited on its own (not 0) is judged by
the fault catalog on its evidence (exit and stop codes, the XIDs and GPU signals the node
agent reported around it): health check, a definitive node action without the diag
(fast path), a restart without node action (application error / transient fault, within
the job's budget), or failure. The rank's stop, the job's reaction and the evidence are
one transaction; a redelivered event finds them written (or not at all) and goes on with
the side effects the job's state still needs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import HEALTH_CHECK_GROUP, NotificationKind
from gpu_recovery.domain import policy
from gpu_recovery.domain.escalation import charges_job, history_from_item, history_to_item, record_fault
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Budget, Trigger
from gpu_recovery.domain.job_budgets import BudgetOutcome, settle
from gpu_recovery.domain.models import Job, Rank, fault_key
from gpu_recovery.domain.policy import StopKind, StopReaction, TaskStop
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPlan
from gpu_recovery.domain.states import ACTIVE_JOB_STATES, HOLDING_RANK_STATES, JobState, RankState
from gpu_recovery.ecs_events import EcsTaskDetail
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.health_checks import HealthChecks
from gpu_recovery.recovery.ports import Deps, Outcome
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.recovery.remediation import NodeRemediation, budgets_of, details_of
from gpu_recovery.recovery.suspension import Suspensions
from gpu_recovery.repository import RankStop
from gpu_recovery.repository.recovery import SPEND_APPLICATION, SPEND_INFRASTRUCTURE

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
_JUDGED_KINDS = (StopKind.SUSPECTED_GPU_FAULT, StopKind.FAILED)
# A fault of a rank that failed on its own moves the job from these (a SUSPENDING job's
# grace included: the fault wins over the suspension).
FAULT_JOB_STATES = ACTIVE_JOB_STATES | {JobState.SUSPENDING}


@dataclass(frozen=True)
class Assessment:
    """A rank's own exit, judged by the fault catalog against its node's evidence."""

    evidence: Evidence
    plan: RemediationPlan
    instance_item: dict[str, Any] | None

    @property
    def node_fault(self) -> bool:
        return self.plan.action is Action.HEALTH_CHECK or self.plan.action in NODE_ACTIONS

    @property
    def observed(self) -> bool:
        """Observe mode keeps the recovery from beginning (ranks not stopped, no diag)."""
        needed = {Effect.STOP_TASKS} | ({Effect.HEALTH_CHECK} if self.plan.action is Action.HEALTH_CHECK
                                        else set())
        return bool(needed & set(self.plan.record_only))

    def record(self, now: float) -> dict[str, Any]:
        return {"at": now, "evidence": self.evidence.to_dict(), "plan": self.plan.to_dict()}


class TaskEvents:
    def __init__(self, deps: Deps, ranks: RankOperations, health: HealthChecks,
                 restarts: GangRestart, remediation: NodeRemediation, suspensions: Suspensions) -> None:
        self.deps = deps
        self.ranks = ranks
        self.health = health
        self.restarts = restarts
        self.remediation = remediation
        self.suspensions = suspensions

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
        assessment: Assessment | None = None
        for _ in range(_WRITE_ROUNDS):
            job = repo.get_job(rank.job_id)
            if job is None:
                return Outcome("ignored", rank.job_id, {"why": "job record missing"})
            rank_stop = RankStop(rank, _RANK_STATE_FOR[kind], fields) if rank.state in HOLDING_RANK_STATES \
                else None
            same_attempt = job.attempt == rank.attempt
            reaction = policy.stop_reaction(kind, job.state, same_attempt,
                                            suspend_stopping=job.suspend_stopping)
            budget: BudgetOutcome | None = None
            if kind in _JUDGED_KINDS and rank_stop is not None and same_attempt and not job.state.is_terminal:
                assessment = assessment or self._assess(job, rank, stop, detail)
                budget = self._budget(job, assessment)
                reaction = policy.fault_reaction(
                    job.state, same_attempt, node_fault=assessment.node_fault, observed=assessment.observed,
                    may_restart=bool(budget and budget.restart)
                    and self.deps.policy.modes.executes(Effect.RESTART_JOB),
                    suspend_stopping=job.suspend_stopping)
            if self._record(job, rank, stop, reaction, rank_stop, assessment, budget):
                return self._follow_up(job, rank, kind, reaction, redelivered=rank_stop is None,
                                       assessment=assessment)
            rank = repo.get_rank(rank.job_id, rank.rank) or rank
            if rank.task_arn != detail.taskArn:
                return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        latest = repo.get_job(rank.job_id)
        if latest is None:
            return Outcome("ignored", rank.job_id, {"why": "job record missing"})
        return self._converge(latest, redelivered=True, kind=kind, rank=rank)

    # ------------------------------------------------------------- judgement
    def _assess(self, job: Job, rank: Rank, stop: TaskStop, detail: EcsTaskDetail) -> Assessment:
        """The catalog's decision for this rank's exit, on its node's evidence."""
        raw = self.deps.repo.get_instance_item(rank.container_inst_id)
        now = clock.now()
        when = detail.updatedAt.timestamp() if detail.updatedAt is not None else now
        evidence = self.remediation.evidence(
            inst_id=rank.container_inst_id, instance_item=raw, trigger=Trigger.TASK_EXIT,
            fault_at=min(when, now), job=job, rank=rank.rank, exit_code=stop.exit_code,
            stop_code=stop.stop_code, stopped_reason=stop.stopped_reason)
        return Assessment(evidence, self.remediation.plan(evidence, raw, now=now), raw)

    def _budget(self, job: Job, assessment: Assessment) -> BudgetOutcome | None:
        """For a fault without node action: may the job restart (and which budget pays)?"""
        if assessment.node_fault or assessment.plan.action is Action.NONE:
            return None
        kind = assessment.plan.decision.budget
        if kind is Budget.NONE:
            return None
        charge = True
        if kind is Budget.INFRASTRUCTURE:
            history = history_from_item((assessment.instance_item or {}).get("fault_history"))
            charge = charges_job(history, job.job_id, assessment.plan.decision.cause, clock.now(),
                                 self.deps.policy.escalation)
        return settle(budgets_of(job), kind, charge=charge)

    def _record(self, job: Job, rank: Rank, stop: TaskStop, reaction: StopReaction,
                rank_stop: RankStop | None, assessment: Assessment | None = None,
                budget: BudgetOutcome | None = None) -> bool:
        """Write the rank's stop and the job's reaction together; False if a race was lost."""
        repo = self.deps.repo
        now = clock.now()
        faults = ({fault_key(job.attempt, rank.container_inst_id): assessment.record(now)}
                  if assessment is not None else None)
        decided = f" ({assessment.plan.decision.reason})" if assessment is not None else ""
        if reaction is StopReaction.USER_STOPPED:
            reason = (f"rank {rank.rank} stopped by a user ({stop.stopped_reason or 'UserInitiated'})")
            return repo.finish_job(job.job_id, job.attempt, JobState.USER_STOPPED, reason,
                                   rank_stop=rank_stop)
        if reaction is StopReaction.RESTART and assessment is not None and budget is not None:
            what = ("application error" if assessment.plan.decision.budget is Budget.APPLICATION
                    else "transient fault")
            reason = f"rank {rank.rank} {what}: {policy.describe_failure(stop)}{decided}; {budget.reason}"
            spend = {Budget.INFRASTRUCTURE: SPEND_INFRASTRUCTURE,
                     Budget.APPLICATION: SPEND_APPLICATION}.get(budget.charged, "")
            return repo.restart_in_place(job, from_states=FAULT_JOB_STATES, reason=reason, now=now,
                                         deadline_at=now + RETRY_INTERVAL_SECONDS, spend=spend,
                                         restart_reason=f"{what}: {budget.reason}", rank_stop=rank_stop,
                                         faults=faults)
        if reaction is StopReaction.FAIL_OBSERVED and assessment is not None:
            would = ", ".join(e.value for e in assessment.plan.record_only)
            reason = (f"rank {rank.rank} failed: {policy.describe_failure(stop)}; observe mode: would have "
                      f"done {would}{decided}")
            done = repo.finish_job(job.job_id, job.attempt, JobState.FAILED, reason,
                                   fields={"last_error": reason[:1000], **repo.fault_fields(faults)},
                                   rank_stop=rank_stop)
            if done:
                self.deps.metrics.add_metric("ObservedFaults", "Count", 1)
            return done
        if reaction is StopReaction.FAIL_JOB:
            reason = f"rank {rank.rank} failed: {policy.describe_failure(stop)}"
            if assessment is not None and assessment.plan.decision.rule_id != "default:unmatched":
                reason += decided + (f"; {budget.reason}" if budget is not None else "")
            done = repo.finish_job(job.job_id, job.attempt, JobState.FAILED, reason,
                                   fields={"last_error": reason[:1000], **repo.fault_fields(faults)},
                                   rank_stop=rank_stop)
            if done:
                self.deps.metrics.add_metric("Failures", "Count", 1)
            return done
        if reaction is StopReaction.ENTER_RECOVERY:
            reason = (f"rank {rank.rank} exited {stop.exit_code} on {rank.container_inst_id}: "
                      f"suspected GPU fault{decided}")
            return self._enter_recovery(job, rank.container_inst_id, reason, rank_stop,
                                        from_states=FAULT_JOB_STATES, faults=faults)
        if reaction is StopReaction.ADD_SUSPECT:
            return repo.add_suspects(job.job_id, job.attempt, [rank.container_inst_id], rank_stop,
                                     faults=faults)
        return rank_stop is None or repo.record_rank_stop(rank_stop)

    def _enter_recovery(self, job: Job, inst_id: str, reason: str, rank_stop: RankStop | None,
                        from_states: Iterable[JobState],
                        faults: dict[str, dict[str, Any]] | None = None) -> bool:
        now = clock.now()
        suspects = policy.suspects_for_fault(
            inst_id, (r.container_inst_id for r in self._current_ranks(job)),
            check_all_nodes=self.deps.settings.check_all_nodes_on_fault)
        entered = self.deps.repo.enter_recovery(
            job.job_id, job.attempt, from_states=from_states, suspects=suspects, reason=reason,
            now=now, deadline_at=now + RETRY_INTERVAL_SECONDS, rank_stop=rank_stop, faults=faults)
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
                   redelivered: bool, assessment: Assessment | None = None) -> Outcome:
        fresh = self.deps.repo.get_job(job.job_id) or job
        if reaction is StopReaction.MAYBE_COMPLETE:
            return self._maybe_complete(fresh, rank)
        if reaction is StopReaction.FAIL_OBSERVED and assessment is not None:
            self._observed(fresh, rank, assessment)
            return Outcome("observed", job.job_id, {"rank": rank.rank,
                                                    "would_have_done": [e.value for e in
                                                                        assessment.plan.record_only]})
        if reaction in (StopReaction.RESTART, StopReaction.FAIL_JOB) and assessment is not None \
                and not assessment.node_fault:
            self._remember_on_node(fresh, rank, assessment)
        outcome = self._converge(fresh, redelivered=redelivered, kind=kind, rank=rank)
        if reaction is StopReaction.RESTART:
            return Outcome("restart_requested", job.job_id, {"rank": rank.rank, **outcome.detail})
        if reaction in (StopReaction.ENTER_RECOVERY, StopReaction.ADD_SUSPECT):
            return Outcome("health_check_requested", job.job_id,
                           {"rank": rank.rank, "instance": rank.container_inst_id, **outcome.detail})
        if reaction is StopReaction.USER_STOPPED:
            return Outcome("user_stopped", job.job_id, {"rank": rank.rank})
        if reaction is StopReaction.FAIL_JOB:
            return Outcome("failed", job.job_id, {"rank": rank.rank, "reason": fresh.last_error})
        return outcome

    def _remember_on_node(self, job: Job, rank: Rank, assessment: Assessment) -> None:
        """A fault without node action (application error, transient fault) joins the node's
        history too, so escalation and the repeat rules see it. Best effort: the job's
        reaction is committed; a lost history record costs no recovery."""
        budget = assessment.plan.decision.budget
        spent = "" if budget is Budget.NONE else budget.value
        try:
            self.remediation.record_fault_on_node(job, rank.container_inst_id, assessment.evidence,
                                                  assessment.plan, spent=spent)
        except Exception:
            logger.warning("fault not recorded on the node", exc_info=True,
                           extra={"job_id": job.job_id, "instance": rank.container_inst_id})

    def _converge(self, job: Job, *, redelivered: bool, kind: StopKind, rank: Rank) -> Outcome:
        """Do what the job's state still needs (the work a dead delivery left undone)."""
        detail: dict[str, Any] = {"rank": rank.rank, "kind": kind.value}
        if job.attempt != rank.attempt:
            return Outcome("recorded", job.job_id, {**detail, "why": "older attempt"})
        if job.state is JobState.PENDING_HEALTHCHECK:
            detail["health_checks"] = self.converge_fault(job, reissue=redelivered)
        elif job.state is JobState.PENDING_RESTART:
            # The restart waits for the old ranks: stop them, and restart once they are gone.
            # Best effort: the job carries a deadline, so the sweep asks again every minute
            # (a StopTask outage must not push this event to its DLQ).
            try:
                self.ranks.stop_live_ranks(job, why=job.last_error or "restart", reissue=redelivered)
                detail["restart"] = self.restarts.try_restart(job.job_id).action
            except Exception:
                logger.warning("restart follow-up failed; the sweep finishes it", exc_info=True,
                               extra={"job_id": job.job_id})
                detail["restart"] = "left_to_the_sweep"
        elif job.state is JobState.SUSPENDING:
            detail["suspension"] = self.suspensions.converge(job, reissue=redelivered)
        elif job.state is JobState.CANCELING:
            self._maybe_canceled(job)
        elif job.state.is_terminal:
            self.ranks.stop_live_ranks(job, why=_ENDING_REASON.get(job.state, f"job {job.state.value}"),
                                       reissue=redelivered)
        return Outcome("duplicate" if redelivered else "recorded", job.job_id, detail)

    # ---------------------------------------------------------- suspected fault
    def report_suspected_fault(self, job_id: str, attempt: int, inst_id: str, reason: str,
                               failing_rank: int | None = None,
                               from_states: Iterable[JobState] = ACTIVE_JOB_STATES,
                               trigger: Trigger | None = None) -> Outcome:
        """Enter the recovery loop for a suspected node fault of one attempt (the heartbeat
        service calls it for a node lost too long or a hung rank). Such a fault is always
        confirmed by the DCGM diag (its evidence is kept for the verdict: a healthy node
        after a lost node or a hang restarts the job as a transient fault)."""
        job = self.deps.repo.get_job(job_id)
        if job is None or job.attempt != attempt:
            return Outcome("recorded", job_id, {"rank": failing_rank, "why": "attempt moved on"})
        states = list(from_states)
        if trigger is None:
            trigger = Trigger.NODE_LOST if states == [JobState.NODE_LOST] else Trigger.HUNG
        raw = self.deps.repo.get_instance_item(inst_id)
        now = clock.now()
        evidence = self.remediation.evidence(inst_id=inst_id, instance_item=raw, trigger=trigger,
                                             fault_at=now, job=job, rank=failing_rank)
        faults = {fault_key(attempt, inst_id): {"at": now, "evidence": evidence.to_dict()}}
        if job.state in states:
            self._enter_recovery(job, inst_id, reason, None, from_states=states, faults=faults)
        elif job.state is JobState.PENDING_HEALTHCHECK:
            self.deps.repo.add_suspects(job_id, attempt, [inst_id], faults=faults)
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
        # stopping the other ranks must not hold its check back. A suspect whose evidence
        # is definitive (its recorded plan skips the diag) is acted on at once.
        checks = {inst_id: self.remediation.fast_path(job, inst_id) or self.health.request(job, inst_id)
                  for inst_id in policy.verdicts_pending(job.suspects)}
        self.ranks.stop_live_ranks(job, why=job.last_error or "suspected GPU fault", reissue=reissue,
                                   ranks=self.ranks.current_ranks(job))
        return checks

    def _observed(self, job: Job, rank: Rank, assessment: Assessment) -> None:
        """Observe mode: record on the node what would have been done, and tell operators."""
        now = clock.now()
        plan = assessment.plan
        history = None
        if plan.node_record is not None:
            current = history_from_item((assessment.instance_item or {}).get("fault_history"))
            history = history_to_item(record_fault(current, plan.node_record, now,
                                                   self.deps.policy.escalation))
        self.deps.repo.record_observed_fault(
            rank.container_inst_id, fault_history=history,
            last_fault={"at": now, "evidence": assessment.evidence.to_dict(), "plan": plan.to_dict(),
                        "jobs": [job.job_id]})
        instance = self.deps.repo.get_instance(rank.container_inst_id)
        self.ranks.notify(
            job, instance, NotificationKind.OBSERVED, "Observe mode: GPU fault detected, nothing done",
            what_happened=job.last_error,
            what_was_done=("Nothing (observe mode): no StopTask, health check, reboot, drain or "
                           "termination; the job is marked FAILED in the job table"),
            operator_action="Read what would have been done below and act by hand if needed.",
            details=details_of(assessment.evidence, plan))

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
