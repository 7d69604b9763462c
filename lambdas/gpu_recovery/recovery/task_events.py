"""Stage 1: training task state changes -> rank records, job outcomes, fault detection.

A STOPPED event is classified by what ECS says (``stopCode``, ``stoppedReason``, exit code), never
by what we intended, so the faulty rank is a suspect whichever of the cascade's events is processed
first. A rank that exited on its own (not 0) is judged by the fault catalog on its evidence (exit
and stop codes, the XIDs and GPU signals the node agent reported around it): health check, a
definitive node action without the diag (fast path), a restart without node action (application
error / transient fault, within the job's budget), or failure. The rank's stop, the job's reaction
and the evidence are one transaction; a redelivered event finds them written (or not at all) and
goes on with the side effects the job's state still needs.

Nothing here reads every rank: each rank arrives at its attempt's latches (ended, done) and names
its node a suspect on the same write, the job's reaction dispatches a gang fan-out once
(``recovery.gang``), and whoever completes the *ended* latch counts the fault's suspects and moves
the job on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import partial
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import HEALTH_CHECK_GROUP, RETRY_INTERVAL_SECONDS, NotificationKind
from gpu_recovery.domain import goodput, policy, started_by
from gpu_recovery.domain.escalation import charges_job, history_from_item
from gpu_recovery.domain.fault_vocabulary import Action, Budget, Trigger
from gpu_recovery.domain.job_budgets import BudgetOutcome, settle
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Job, Rank, Suspect
from gpu_recovery.domain.policy import StopKind, StopReaction, TaskStop
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPolicy
from gpu_recovery.domain.states import (
    ACTIVE_JOB_STATES,
    HOLDING_RANK_STATES,
    RECOVERING_JOB_STATES,
    JobState,
    RankState,
)
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.fault_suspects import FaultSuspects
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import MetricsPort, Outcome, after_commit
from gpu_recovery.recovery.ranks import LookupQueued, RankOperations
from gpu_recovery.recovery.reactions import Reactions, TaskStopped, reserved_first
from gpu_recovery.recovery.remediation.job_settlement import JobSettlement, budgets_of
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation
from gpu_recovery.recovery.remediation.notices import details_of
from gpu_recovery.recovery.stage_data import TaskEventData
from gpu_recovery.recovery.stop_assessment import Assessment, fault_marks, restart_run_marks
from gpu_recovery.recovery.suspension import Suspensions
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.jobs_and_ranks import SPEND_APPLICATION, SPEND_INFRASTRUCTURE, RankStop
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

_RANK_STATE_FOR = {StopKind.SUCCEEDED: RankState.DONE, StopKind.STOPPED_BY_SYSTEM: RankState.STOPPED,
                   StopKind.STOPPED_BY_USER: RankState.STOPPED, StopKind.FAILED: RankState.FAILED,
                   StopKind.SUSPECTED_GPU_FAULT: RankState.FAILED}
_ENDING_REASON = {JobState.USER_STOPPED: "job stopped by a user", JobState.FAILED: "job failed",
                  JobState.CANCELED: "job canceled", JobState.COMPLETE: "job complete"}
_WRITE_ROUNDS = 3  # a lost race re-reads and decides again; a third loss means "moved on"
_JUDGED_KINDS = (StopKind.SUSPECTED_GPU_FAULT, StopKind.FAILED)
# Reactions that change the job and, when they win, stop the gang's other ranks.
_STOPPING_REACTIONS = (StopReaction.ENTER_RECOVERY, StopReaction.RESTART, StopReaction.FAIL_JOB,
                       StopReaction.USER_STOPPED)
_SUSPECT_REACTIONS = (StopReaction.ENTER_RECOVERY, StopReaction.ADD_SUSPECT)
# Reactions of a rank that stopped on its own while its job recovers: its node kept for it.
_KEPT_REACTIONS = (StopReaction.COUPLED, StopReaction.ADD_SUSPECT)
# Reactions writing the rank's stop alone (gang-stopped ranks, coupled exits, a completion): no fresh read.
_RANK_ONLY_REACTIONS = (StopReaction.RECORD, StopReaction.MAYBE_COMPLETE, StopReaction.COUPLED)
# A stop whose job keeps its node (it is in recovery: reserved for its restart), or a redelivery.
_STILL_HELD = frozenset({"health_check_requested", "coupled_exit", "recorded", "duplicate",
                         "restart_requested"})
# A fault of a rank that failed on its own moves the job from these (the fault wins over a suspension).
FAULT_JOB_STATES = ACTIVE_JOB_STATES | {JobState.SUSPENDING}


@dataclass(eq=False, repr=False)
class TaskEvents:
    data: TaskEventData
    ranks: RankOperations
    suspects: FaultSuspects  # which exits name a suspect; their checks
    restarts: GangRestart
    remediation: NodeRemediation
    suspensions: Suspensions
    gang: GangOps
    notices: Notices  # the outbox
    settlement: JobSettlement
    _: KW_ONLY
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    # Told: a fault seen (its nodes reserved for its job at once); any task's stop (a node freed?).
    reactions: Reactions = field(default_factory=Reactions)

    def on_task_state_change(self, detail: EcsTaskDetail, known: Rank | None = None) -> Outcome:
        """``known``: the rank, found by the tag lookup worker. Its lookup and a stop's reads before
        its commit are tried again at once: a fault dying there left its freed node unreserved."""
        if detail.group.startswith(HEALTH_CHECK_GROUP):
            return Outcome("ignored", detail={"why": "health-check task"})
        if detail.lastStatus not in ("RUNNING", "STOPPED"):
            return Outcome("ignored", detail={"why": f"lastStatus {detail.lastStatus}"})
        try:
            rank = known or twice(lambda: self.ranks.rank_for_task(detail))
        except LookupQueued:
            self._node_may_be_free(detail, None)
            return Outcome("lookup_queued", detail={"task": detail.taskArn})
        if detail.lastStatus == "RUNNING":
            return self._on_running(detail, rank)
        outcome = self._on_stopped(detail, rank)
        if outcome.action not in _STILL_HELD:
            self._node_may_be_free(detail, rank)
        return outcome

    def _node_may_be_free(self, detail: EcsTaskDetail, rank: Rank | None) -> None:
        """A task's STOPPED event, after its own handling, unless its job keeps the node (a
        rank of a job in recovery): the node may be free now (the job waiting for it, a short
        spare pool). Best effort: the sweep does it within a minute."""
        if detail.lastStatus == "STOPPED":
            stopped = TaskStopped(detail.containerInstanceArn or "", rank.job_id if rank is not None else "")
            after_commit("placement on a task's stop", self.reactions.emit, stopped)

    # ------------------------------------------------------------------ RUNNING
    def _on_running(self, detail: EcsTaskDetail, rank: Rank | None) -> Outcome:
        if rank is None:
            return Outcome("ignored", detail={"why": "not a protected job"})
        if rank.task_arn != detail.taskArn:
            return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        now = clock.now()
        ran = min(detail.updatedAt.timestamp(), now) if detail.updatedAt is not None else now
        if rank.state is RankState.STARTING:
            self.data.rank_events.mark_running(rank, ran)
        if rank.rank != 0 and started_by.is_restart(rank.started_by):
            # A rank the start fan-out started: the batch that registered the last rank told the
            # launch or the restart, and only rank 0's RUNNING confirms a launch or marks the
            # attempt's goodput: no job read per rank.
            return Outcome("running", rank.job_id, {"rank": rank.rank})
        job = self.data.jobs.get_job(rank.job_id)
        if job and job.state is JobState.STARTING and job.attempt == rank.attempt:
            if job.restarted_attempt != job.attempt:
                # A queue launch: RUNNING once every rank is registered (a gang restart is
                # confirmed by the batch that registers its last rank, with its e-mail).
                self.restarts.confirm_running(job, f"rank {rank.rank} running")
            elif Latch.REGISTERED in self.data.latches.complete(job.job_id, job.attempt, job.world_size):
                # A gang restart still STARTING when rank 0 runs, every rank registered: the batch
                # that registered the last one died before confirming it (the sweep would, a
                # minute or more on). One read of the latch's head per restart.
                self.restarts.on_started(job)
        elif job and rank.rank == 0 and job.state is JobState.RUNNING and job.attempt == rank.attempt:
            # A gang restart is RUNNING once its last rank's StartTask was accepted; its tasks
            # then pull and start: until rank 0 runs, that is restart, not training (issue 52).
            # Once per attempt (rank 0 only: one write per restart, whatever the job's size).
            self.data.rank_events.mark_running_interval(job.job_id, job.attempt, cause=goodput.RESTART,
                                                        until=ran, reason="rank 0 running")
        return Outcome("running", rank.job_id, {"rank": rank.rank})

    # ------------------------------------------------------------------ STOPPED
    def _on_stopped(self, detail: EcsTaskDetail, rank: Rank | None) -> Outcome:
        if rank is None:
            return Outcome("ignored", detail={"why": "not a protected job"})
        if rank.task_arn != detail.taskArn:
            return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        stop = TaskStop(detail.exit_code(), detail.stopCode, detail.stoppedReason)
        kind = policy.classify_stop(stop, self.settings.suspect_exit_codes)
        # When the task ended (its event's time: a retried delivery's wait is not training, issue 52).
        stamp = detail.executionStoppedAt or detail.stoppedAt or detail.updatedAt
        ended_at = min(stamp.timestamp(), clock.now()) if stamp is not None else None
        ran_from = min(detail.startedAt.timestamp(), clock.now()) if detail.startedAt is not None else None
        fields: dict[str, Any] = {"stop_reason": policy.describe_failure(stop)[:500]}
        if stop.exit_code is not None:
            fields["exit_code"] = stop.exit_code
        repo = self.data
        assessment: Assessment | None = None
        for _ in range(_WRITE_ROUNDS):
            job = twice(partial(repo.jobs.get_job, rank.job_id))
            if job is None:
                return Outcome("ignored", rank.job_id, {"why": "job record missing"})
            rank_stop = RankStop(rank, _RANK_STATE_FOR[kind], fields) if rank.state in HOLDING_RANK_STATES \
                else None
            same_attempt = job.attempt == rank.attempt
            found = job.tally.attempt == job.attempt and job.tally.found
            reaction = policy.stop_reaction(kind, job.state, same_attempt,
                                            suspend_stopping=job.suspend_stopping, fault_found=found)
            budget: BudgetOutcome | None = None
            if kind in _JUDGED_KINDS and rank_stop is not None and same_attempt and not job.state.is_terminal:
                assessment = assessment or self._assess(job, rank, stop, detail)
                budget = self._budget(job, assessment)
                reaction = policy.fault_reaction(
                    job.state, same_attempt, node_fault=assessment.node_fault, observed=assessment.observed,
                    may_restart=bool(budget and budget.restart)
                    and self.policy.modes.executes(Effect.RESTART_JOB),
                    suspend_stopping=job.suspend_stopping, fault_found=found)
            if reaction is StopReaction.ADD_SUSPECT and self._coupled(job, rank, assessment, ended_at):
                reaction = StopReaction.COUPLED
            if self._record(job, rank, stop, reaction, rank_stop, assessment, budget, ended_at, ran_from):
                return self._follow_up(job, rank, kind, reaction, redelivered=rank_stop is None,
                                       assessment=assessment, ended_at=ended_at, ran_from=ran_from,
                                       written=_as_written(rank, rank_stop, reaction))
            rank = repo.jobs.get_rank(rank.job_id, rank.rank) or rank
            if rank.task_arn != detail.taskArn:
                return Outcome("ignored", rank.job_id, {"why": "task of an older attempt"})
        latest = repo.jobs.get_job(rank.job_id)
        if latest is None:
            return Outcome("ignored", rank.job_id, {"why": "job record missing"})
        return self._converge(latest, redelivered=True, kind=kind, rank=rank, ended_at=ended_at,
                              ran_from=ran_from)

    # ------------------------------------------------------------- judgement
    def _assess(self, job: Job, rank: Rank, stop: TaskStop, detail: EcsTaskDetail) -> Assessment:
        """The catalog's decision for this rank's exit, on its node's evidence."""
        raw = twice(lambda: self.data.instances.get_instance_item(rank.container_inst_id))
        now = clock.now()
        when = detail.updatedAt.timestamp() if detail.updatedAt is not None else now
        evidence = self.remediation.evidence(
            inst_id=rank.container_inst_id, instance_item=raw, trigger=Trigger.TASK_EXIT,
            fault_at=min(when, now), job=job, rank=rank.rank, exit_code=stop.exit_code,
            stop_code=stop.stop_code, stopped_reason=stop.stopped_reason)
        remediating = policy.stack_remediation(self.data.instances.instance_from_item(raw) if raw else None)
        return Assessment(evidence, self.remediation.plan(evidence, raw, now=now), raw, remediating)

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
                                 self.policy.escalation)
        return settle(budgets_of(job), kind, charge=charge)

    def _record(self, job: Job, rank: Rank, stop: TaskStop, reaction: StopReaction,
                rank_stop: RankStop | None, assessment: Assessment | None = None,
                budget: BudgetOutcome | None = None, exited_at: float | None = None,
                ran_from: float | None = None) -> bool:
        """Write the rank's stop and the job's reaction together; False if a race was lost."""
        repo = self.data
        now = clock.now()
        node = rank.container_inst_id
        decided = f" ({assessment.plan.decision.reason})" if assessment is not None else ""
        last_fault = assessment.record(now, node, job.attempt) if assessment is not None else None
        ledger = fault_marks(job, node, now, assessment, budget, ran_from)
        if reaction is StopReaction.USER_STOPPED:
            reason = (f"rank {rank.rank} stopped by a user ({stop.stopped_reason or 'UserInitiated'})")
            return ended(self.metrics, self.data.jobs, job.job_id, repo.jobs.finish_job(
                job.job_id, job.attempt, JobState.USER_STOPPED, reason, rank_stop=rank_stop,
                stop_ranks_of=job.attempt, stop_why=_ENDING_REASON[JobState.USER_STOPPED]))
        if reaction is StopReaction.RESTART and assessment is not None and budget is not None:
            what = ("application error" if assessment.plan.decision.budget is Budget.APPLICATION
                    else "transient fault")
            reason = f"rank {rank.rank} {what}: {policy.describe_failure(stop)}{decided}; {budget.reason}"
            spend = {Budget.INFRASTRUCTURE: SPEND_INFRASTRUCTURE,
                     Budget.APPLICATION: SPEND_APPLICATION}.get(budget.charged, "")
            return repo.rank_events.restart_in_place(
                job, from_states=FAULT_JOB_STATES, reason=reason, now=now,
                deadline_at=now + RETRY_INTERVAL_SECONDS, spend=spend,
                restart_reason=f"{what}: {budget.reason}", rank_stop=rank_stop,
                last_fault=last_fault, ledger=ledger)
        if reaction is StopReaction.FAIL_OBSERVED and assessment is not None:
            would = ", ".join(e.value for e in assessment.plan.record_only)
            reason = (f"rank {rank.rank} failed: {policy.describe_failure(stop)}; observe mode: would have "
                      f"done {would}{decided}")
            raw = repo.instances.get_instance_item(node)
            # The node's record of what would have been done, and its cordon (known bad all the
            # same), in the job's FAILED write: a retry finds the job FAILED and does nothing more.
            observed = self.remediation.observed(node, raw, assessment.plan, assessment.evidence,
                                                 [job.job_id], now)
            notices = [self.notices.for_job(
                replace(job, state=JobState.FAILED, last_error=reason[:1000]),
                repo.instances.instance_from_item(raw) if raw else None,
                NotificationKind.OBSERVED, "Observe mode: GPU fault detected, nothing done",
                what_happened=reason[:1000],
                what_was_done=("Nothing (observe mode): no StopTask, health check, reboot, drain or "
                               "termination; the job is marked FAILED in the job table"),
                operator_action="Read what would have been done below and act by hand if needed.",
                details=details_of(assessment.evidence, assessment.plan)), *observed.notices]
            done = ended(self.metrics, self.data.jobs, job.job_id, repo.jobs.finish_job(
                job.job_id, job.attempt, JobState.FAILED, reason,
                fields={"last_error": reason[:1000], "last_fault": last_fault},
                rank_stop=rank_stop, also=[*self.notices.owe(notices, now), *observed.updates]))
            if done:
                self.notices.send(notices)
                self.metrics.add_metric("ObservedFaults", "Count", 1)
                if observed.gate is not None:  # the ECS attribute (else the sweep's worklist)
                    after_commit("cordon", self.remediation.after_cordon, observed.gate, node)
            return done
        if reaction is StopReaction.FAIL_JOB:
            reason = f"rank {rank.rank} failed: {policy.describe_failure(stop)}"
            if assessment is not None and assessment.plan.decision.rule_id != "default:unmatched":
                reason += decided + (f"; {budget.reason}" if budget is not None else "")
            fields: dict[str, Any] = {"last_error": reason[:1000]}
            if last_fault is not None:
                fields["last_fault"] = last_fault
            done = ended(self.metrics, self.data.jobs, job.job_id, repo.jobs.finish_job(
                job.job_id, job.attempt, JobState.FAILED, reason, fields=fields, rank_stop=rank_stop,
                stop_ranks_of=job.attempt, stop_why=_ENDING_REASON[JobState.FAILED], ledger=ledger))
            if done:
                self.metrics.add_metric("Failures", "Count", 1)
            return done
        if reaction in _SUSPECT_REACTIONS and rank_stop is not None:
            # The node is a suspect from the very write that records the stop: out of the
            # stack's placements until its check answers (recovery.free_nodes).
            rank_stop = replace(rank_stop, fence={"job": job.job_id, "attempt": job.attempt, "at": now})
        if reaction is StopReaction.ENTER_RECOVERY:
            reason = (f"rank {rank.rank} exited {stop.exit_code} on {node}: suspected GPU fault{decided}")
            if assessment is not None and not assessment.catalog_node_fault:
                reason = (f"rank {rank.rank} exited {stop.exit_code} on {node} while the stack was "
                          f"{assessment.remediating} it: infrastructure fault of the node")
            self._open_suspect(job, rank, assessment)
            return self._enter_recovery(job, reason, rank_stop, from_states=FAULT_JOB_STATES, ledger=ledger,
                                        exited_at=exited_at)
        if reaction is StopReaction.ADD_SUSPECT:
            opened = self._open_suspect(job, rank, assessment)
            if rank_stop is not None and set(opened.ranks) <= {rank.rank}:
                # The node's first exit (a node counts once; a redelivery not again).
                self.suspects.note_exit(job, exited_at)
        if reaction is StopReaction.COUPLED and rank_stop is not None:
            rank_stop = replace(rank_stop, fields={**rank_stop.fields, "coupled": True})
        return rank_stop is None or repo.rank_events.record_stop(rank_stop)

    def _open_suspect(self, job: Job, rank: Rank, assessment: Assessment | None) -> Suspect:
        now = clock.now()
        return self.suspects.open(job, rank, assessment.record(now) if assessment is not None
                                  else {"at": now})

    def _coupled(self, job: Job, rank: Rank, assessment: Assessment | None, exited_at: float | None) -> bool:
        """A later exit of the fault with no evidence of its own (``recovery.fault_suspects``);
        a redelivered stop as its first delivery judged it."""
        if rank.coupled:
            return True
        if assessment is None or not self.suspects.coupled(
                job, assessment.evidence, assessment.plan.action, assessment.remediating, exited_at):
            return False
        # A first delivery judged it a suspect and died before its stop: a suspect it stays, counted once.
        opened = self.data.faults.get_suspect(job.job_id, job.attempt, rank.container_inst_id)
        return opened is None or rank.rank not in opened.ranks

    def _enter_recovery(self, job: Job, reason: str, rank_stop: RankStop | None,
                        from_states: Iterable[JobState], ledger: dict[str, Any] | None = None,
                        exited_at: float | None = None, also: Sequence[Update] = ()) -> bool:
        now = clock.now()
        entered = self.data.rank_events.enter_recovery(
            job.job_id, job.attempt, from_states=from_states, reason=reason,
            now=now, deadline_at=now + RETRY_INTERVAL_SECONDS, rank_stop=rank_stop, ledger=ledger,
            exited_at=exited_at, also=also)
        if entered:
            self.metrics.add_metric("FaultsDetected", "Count", 1)
            logger.info("suspected GPU fault", extra={"job_id": job.job_id, "why": reason})
        return entered

    def _follow_up(self, job: Job, rank: Rank, kind: StopKind, reaction: StopReaction, *,
                   redelivered: bool, assessment: Assessment | None = None,
                   ended_at: float | None = None, ran_from: float | None = None,
                   written: Rank | None = None) -> Outcome:
        """``written``: the rank as this delivery wrote it, when that was all its reaction
        wrote: the job goes on as read (its reaction was decided on that read), except where any
        stop may name a suspect (``health_check_all_nodes``: the latest tally is needed)."""
        rank_only = written is not None and not self.settings.check_all_nodes_on_fault
        # Read after the commit, tried twice: dying here left a peer's freed node unreserved (7207).
        fresh = job if rank_only else twice(lambda: self.data.jobs.get_job(job.job_id)) or job
        written = written if rank_only else None
        if reaction in (StopReaction.RESTART, StopReaction.FAIL_JOB) and assessment is not None \
                and not assessment.node_fault:
            self._remember_on_node(fresh, rank, assessment)
        if reaction in _STOPPING_REACTIONS and not redelivered and (
                reaction not in (StopReaction.ENTER_RECOVERY, StopReaction.RESTART)
                or reserved_first(self.reactions, fresh, rank.container_inst_id)):
            self._stop_gang(fresh)
        elif reaction in _KEPT_REACTIONS and not redelivered and fresh.attempt == rank.attempt:
            # Its node freed before the fault's delivery reserved the nodes and sent the stop (it
            # died, or is at work): this stop does both, as that redelivery would a minute on.
            self._stop_gang(fresh, reserve_for=rank.container_inst_id)
        outcome = self._converge(fresh, redelivered=redelivered, kind=kind, rank=rank,
                                 suspect=reaction in _SUSPECT_REACTIONS,
                                 coupled=reaction is StopReaction.COUPLED, ended_at=ended_at,
                                 ran_from=ran_from, written=written)
        if reaction is StopReaction.FAIL_OBSERVED and assessment is not None:
            return Outcome("observed", job.job_id, {"rank": rank.rank,
                                                    "would_have_done": [e.value for e in
                                                                        assessment.plan.record_only]})
        if reaction is StopReaction.MAYBE_COMPLETE:
            return Outcome("complete" if outcome.detail.get("complete") else "rank_done", job.job_id,
                           {"rank": rank.rank})
        if reaction is StopReaction.RESTART:
            return Outcome("restart_requested", job.job_id, {"rank": rank.rank, **outcome.detail})
        if reaction in _SUSPECT_REACTIONS:
            return Outcome("health_check_requested", job.job_id,
                           {"rank": rank.rank, "instance": rank.container_inst_id, **outcome.detail})
        if reaction is StopReaction.COUPLED:
            return Outcome("coupled_exit", job.job_id,
                           {"rank": rank.rank, "instance": rank.container_inst_id, **outcome.detail})
        if reaction is StopReaction.USER_STOPPED:
            return Outcome("user_stopped", job.job_id, {"rank": rank.rank})
        if reaction is StopReaction.FAIL_JOB:
            return Outcome("failed", job.job_id, {"rank": rank.rank, "reason": fresh.last_error})
        return outcome

    def _stop_gang(self, job: Job, reserve_for: str | None = None) -> None:
        """Dispatch the stop intent the job's reaction committed; ``reserve_for``: a dead
        delivery's fault's node ("": none known), it and the job's nodes reserved first (a job
        in recovery), as that delivery would have before its stop freed them. The sweep sends it
        again if this fails (a StopTask outage must not push this event to its DLQ)."""
        if not job.stop_fanout or job.stop_fanout.get("sent_at"):
            return
        if reserve_for is not None and job.state in RECOVERING_JOB_STATES \
                and not reserved_first(self.reactions, job, reserve_for, joining=True):
            return
        try:
            self.gang.stop(job)
        except Exception:
            logger.warning("gang stop not sent; the sweep sends it", exc_info=True,
                           extra={"job_id": job.job_id})

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

    def _converge(self, job: Job, *, redelivered: bool, kind: StopKind, rank: Rank,
                  suspect: bool = False, coupled: bool = False, ended_at: float | None = None,
                  ran_from: float | None = None, written: Rank | None = None) -> Outcome:
        """Do what the rank's stop still needs (the work a dead delivery left undone): its
        node's health check if it is a suspect, its arrival at the attempt's latches, and
        whatever completing them means for the job (``ended_at`` and ``ran_from``: when the task
        ended and started, for the ledger; ``written``: the rank as this delivery wrote it)."""
        detail: dict[str, Any] = {"rank": rank.rank, "kind": kind.value}
        repo = self.data
        current = written or twice(partial(repo.jobs.get_rank, rank.job_id, rank.rank)) or rank
        if current.attempt != rank.attempt or not current.state.is_terminal:
            return Outcome("recorded", job.job_id, {**detail, "why": "older attempt"})
        node = current.container_inst_id
        grouped = False
        if not suspect and (redelivered or self.settings.check_all_nodes_on_fault):
            suspect = self._named_suspect(job, current)
            # Named only because every node is checked: no evidence of its own to hurry it.
            grouped = suspect and self.settings.check_all_nodes_on_fault
        coupled = (coupled or current.coupled) and not suspect  # a redelivery repeats its arrival
        if suspect and job.attempt == rank.attempt:
            if self.settings.check_all_nodes_on_fault or twice(partial(
                    repo.faults.get_suspect, job.job_id, job.attempt, node)) is None:
                self._open_suspect(job, current, None)
            detail["health_checks"] = {node: self.suspects.request_check(job, node, grouped=grouped)}
        if redelivered:  # what a dead delivery committed: its reservation, then its stop
            self._stop_gang(job, reserve_for=node if job.attempt == rank.attempt else "")
        arrival = repo.latches.arrive(
            job.job_id, current.attempt, job.world_size, current.rank,
            [Latch.ENDED, *([Latch.DONE] if current.state is RankState.DONE else [])],
            suspect_node=node if suspect else "", coupled_node=node if coupled else "", node=node)
        if Latch.DONE in arrival:
            detail["complete"] = ended(self.metrics, self.data.jobs, job.job_id,
                                       self._complete(job, current.attempt, ended_at, ran_from))
        if Latch.ENDED in arrival:
            detail["ended"] = self.on_attempt_ended(twice(partial(repo.jobs.get_job, job.job_id)) or job,
                                                    current.attempt)
        return Outcome("duplicate" if redelivered else "recorded", job.job_id, detail)

    def _complete(self, job: Job, attempt: int, ended_at: float | None, ran_from: float | None) -> bool:
        """Every rank of ``attempt`` exited 0: COMPLETE. A gang restart whose confirmation never
        committed (its ranks finished first) is confirmed by the same transaction: its e-mail
        owed, its time running counted as training in the goodput ledger."""
        jobs = self.data.jobs
        if job.state is JobState.STARTING and job.attempt == attempt == job.restarted_attempt:
            notice, reason, ledger, owed = self.restarts.confirmation(job, JobState.COMPLETE)
            if jobs.finish_job(job.job_id, attempt, JobState.COMPLETE, f"every rank exited 0; {reason}",
                               from_states=[JobState.STARTING], also=owed,
                               ledger={**ledger, **goodput.end_marks(ended_at)}):
                self.restarts.recovered(job, notice)
                return True
        return jobs.finish_job(job.job_id, attempt, JobState.COMPLETE, "every rank exited 0",
                               ledger={**goodput.end_marks(ended_at), **restart_run_marks(job, ran_from)})

    def _named_suspect(self, job: Job, rank: Rank) -> bool:
        """Is this rank's node a suspect of the job's fault? Every node with
        ``health_check_all_nodes`` until the suspects are counted (its rank ended after a
        first verdict moved the job on, as a large job's stops do, is one too: the restart
        waits for its verdict); else a node whose suspect item names this rank (a redelivery
        after the job moved on still counts it, as its first delivery did)."""
        if not (job.in_fault and job.tally.attempt == rank.attempt):
            return False
        if self.settings.check_all_nodes_on_fault and job.state in RECOVERING_JOB_STATES \
                and job.tally.total is None:
            return True
        found = self.data.faults.get_suspect(job.job_id, rank.attempt, rank.container_inst_id)
        return found is not None and rank.rank in found.ranks

    def on_attempt_ended(self, job: Job, attempt: int) -> str:
        """Every rank of ``attempt`` ended (its GPUs are free): the fault's suspects are final (counted once),
        nothing is left to stop, and the job goes on - restart, suspended, canceled."""
        repo = self.data
        if job.attempt != attempt:
            return "older_attempt"
        if job.stop_fanout and int(job.stop_fanout.get("attempt") or 0) == attempt:
            self.gang.stopped(job, attempt)
        if job.in_fault and job.tally.total is None and job.state in RECOVERING_JOB_STATES:
            total = len(repo.latches.suspect_nodes(job.job_id, attempt, job.world_size))
            job = repo.faults.record_total(job, total) or repo.jobs.get_job(job.job_id) or job
            logger.info("every rank ended", extra={"job_id": job.job_id, "suspects": total})
        self.suspects.start_grouped_checks(job)
        job = twice(partial(repo.faults.counted, job))  # the verdicts counted on the tally's shards (all in?)
        if job.state is JobState.PENDING_HEALTHCHECK and job.tally.all_decided:
            return self.settlement.conclude(job)
        if job.state is JobState.PENDING_HEALTHCHECK:
            # Verdicts still to come: with a spare free, a relocatable job need not wait for them.
            return self.restarts.spare_first(job).action
        if job.state is JobState.PENDING_RESTART:
            return self.restarts.try_restart(job.job_id).action
        if job.state is JobState.SUSPENDING:
            return "suspended" if self.suspensions.finish(job) else "raced"
        if job.state is JobState.CANCELING:
            canceled = repo.jobs.mark_job_canceled(job.job_id, "every rank stopped")
            ended(self.metrics, repo.jobs, job.job_id, canceled)
            return "canceled"
        return "ended"

    # ---------------------------------------------------------- suspected fault
    def report_suspected_fault(self, job_id: str, attempt: int, inst_id: str, reason: str,
                               failing_rank: int | None = None,
                               from_states: Iterable[JobState] = ACTIVE_JOB_STATES,
                               trigger: Trigger | None = None) -> Outcome:
        """Enter the recovery loop for a suspected node fault of one attempt (the heartbeat
        service calls it for a node lost too long or a hung rank). Such a fault is always
        confirmed by the DCGM diag (its evidence is kept for the verdict: a healthy node
        after a lost node or a hang restarts the job as a transient fault)."""
        repo = self.data
        job = repo.jobs.get_job(job_id)
        if job is None or job.attempt != attempt:
            return Outcome("recorded", job_id, {"rank": failing_rank, "why": "attempt moved on"})
        states = list(from_states)
        if trigger is None:
            trigger = Trigger.NODE_LOST if states == [JobState.NODE_LOST] else Trigger.HUNG
        if job.state not in states and job.state is not JobState.PENDING_HEALTHCHECK:
            return Outcome("recorded", job_id, {"rank": failing_rank, "why": job.state.value})
        raw = repo.instances.get_instance_item(inst_id)
        now = clock.now()
        evidence = self.remediation.evidence(inst_id=inst_id, instance_item=raw, trigger=trigger,
                                             fault_at=now, job=job, rank=failing_rank)
        repo.faults.open_suspect(job_id, attempt, inst_id, rank=failing_rank,
                                 record={"at": now, "evidence": evidence.to_dict()}, now=now,
                                 retry_at=now + RETRY_INTERVAL_SECONDS)
        # The node named a suspect at the latch (the failing rank's shard: it has not ended) by
        # the write that puts the job in recovery, or at once when it is in recovery already:
        # nothing calls this again (the heartbeat moved the rank in its own write), so a death
        # after either still has it counted. Not for a job that does not enter (revived, moved
        # on): a later fault of the attempt would count a suspect whose check nobody asks for.
        counted, entered, reserved = job.state is JobState.PENDING_HEALTHCHECK, False, True
        if counted:
            repo.latches.arrive(job_id, attempt, job.world_size, failing_rank or 0, [], suspect_node=inst_id)
        elif self._enter_recovery(job, reason, None, from_states=states, also=[
                repo.latches.suspect_arrival(job_id, attempt, failing_rank or 0, inst_id)]):
            counted = entered = True
            fresh = repo.jobs.get_job(job_id)
            reserved = fresh is None or reserved_first(self.reactions, fresh, inst_id)
        job = repo.jobs.get_job(job_id)
        if job is None or job.state is not JobState.PENDING_HEALTHCHECK or job.attempt != attempt:
            state = job.state.value if job else "missing"
            return Outcome("recorded", job_id, {"rank": failing_rank, "why": state})
        if not counted:  # another fault of the attempt entered recovery first
            repo.latches.arrive(job_id, attempt, job.world_size, failing_rank or 0, [], suspect_node=inst_id)
        checks = {inst_id: self.suspects.request_check(job, inst_id)}
        if reserved:  # else the sweep sends the stop, the nodes reserved first
            self._stop_gang(job, reserve_for=None if entered else inst_id)
        return Outcome("health_check_requested", job_id,
                       {"rank": failing_rank, "instance": inst_id, "health_checks": checks})

    def converge_fault(self, job: Job) -> dict[str, str]:
        """The sweep, for a job in PENDING_HEALTHCHECK: the stop intent sent (and the stops
        asked again at a paced interval); each suspect's check is the suspect item's own
        follow-up; the coupled nodes of a fault whose checks found nothing named suspects."""
        done = {"stops": self.gang.stop_due(job, clock.now())}
        if job.tally.escalated:
            done["coupled"] = self.suspects.check_coupled(job)
        return done


def _as_written(rank: Rank, rank_stop: RankStop | None, reaction: StopReaction) -> Rank | None:
    """The rank as this delivery's own stop left it, if the reaction wrote nothing else."""
    if rank_stop is None or reaction not in _RANK_ONLY_REACTIONS:
        return None
    return replace(rank, state=rank_stop.to, coupled=rank.coupled or reaction is StopReaction.COUPLED)
