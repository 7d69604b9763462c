"""A job's settlement: what a node's decision does to one waiting job, and the conclusion
of a fault whose every suspect was found healthy.

:meth:`JobSettlement.job_verdict` gives one waiting job its verdict for the node, its
outcome (from the fault's tally with this verdict counted: restart after the reboot,
relocate, wait HELD, wait for its other nodes, fail) and the budget it spends, once per
fault (a flapping node's repeat is not charged again). The node decision commits it with
the node's own change (``node_decision``). :meth:`JobSettlement.conclude` ends a fault
without node action (the last verdict came before every rank had ended): the job
restarts in place, budget permitting, or fails with its e-mail owed in the same write.

The node's remediation never depends on a job's budget: the budget only decides whether
the job restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS
from gpu_recovery.domain import goodput, suspects
from gpu_recovery.domain.escalation import NodeFaultRecord, charges_job
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.fault_vocabulary import Action, Budget, Trigger
from gpu_recovery.domain.job_budgets import JobBudgets, settle
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.policy import JobOutcome
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPlan, RemediationPolicy
from gpu_recovery.domain.states import JobState, SuspectVerdict
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import MetricsPort, after_commit
from gpu_recovery.recovery.reactions import CoupledToCheck, Reactions, RestartDue
from gpu_recovery.recovery.remediation.notices import RemediationNotices
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.jobs_and_ranks import SPEND_APPLICATION, SPEND_INFRASTRUCTURE
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.node_decisions import JobVerdict

logger = logging.getLogger(__name__)


def fault_record(evidence: Evidence, plan: RemediationPlan, now: float,
                 label: SuspectVerdict | None = None, *, node: str = "",
                 attempt: int = 0) -> dict[str, Any]:
    """A fault's record (its evidence and plan; ``label``: the job's verdict for the node;
    ``node`` and ``attempt``: where and when, on a job's ``last_fault``)."""
    record: dict[str, Any] = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict()}
    if label is not None:
        record["label"] = label.value
    if node:
        record.update(node=node, attempt=attempt)
    return record


def _opened_by_preflight(job: Job) -> bool:
    """The fault was opened by the gang preflight (before the attempt trained): no budget."""
    return job.tally.opened_by == Trigger.PREFLIGHT.value


def budgets_of(job: Job) -> JobBudgets:
    def clamp(value: int) -> int:
        return max(0, min(20, value))
    return JobBudgets(max_infra_recoveries=clamp(job.max_recovery_attempts),
                      infra_recoveries_used=max(0, job.recoveries_used),
                      max_app_restarts=clamp(job.max_app_restarts),
                      app_restarts_used=max(0, job.app_restarts_used))


@dataclass(frozen=True)
class _Settled:
    outcome: JobOutcome
    to: JobState
    spend: str
    error: str
    restart_reason: str
    reason: str
    hold_spend: str | None = None  # HOLD: what the restart spends once the held job goes on

    def deadline_at(self, now: float) -> float | None:
        return now + RETRY_INTERVAL_SECONDS if self.to is JobState.PENDING_RESTART else None


class SettlementData(Protocol):
    """The fault's tally and suspects, its nodes on the latch, the job's conclusion."""

    faults: FaultRepository
    latches: LatchRepository

    def get_job(self, job_id: str) -> Job | None: ...
    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...
    def conclude_fault(self, job: Job, to: JobState, *, reason: str, error: str, spend: str,
                       restart_reason: str, deadline_at: float | None, also: Sequence[Update] = (),
                       ledger: Mapping[str, Any] | None = None) -> bool: ...


@dataclass(eq=False, repr=False)
class JobSettlement:
    """``held_job_deadline_seconds``: how long a job may be HELD by the breaker (0: never)."""

    data: SettlementData
    notices: Notices
    owed: RemediationNotices
    _: KW_ONLY
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    held_job_deadline_seconds: int
    # Told: a fault's coupled nodes to check, a job's restart due.
    reactions: Reactions = field(default_factory=Reactions)

    def job_verdict(self, job: Job, inst_id: str, label: SuspectVerdict, plan: RemediationPlan | None,
                    evidence: Evidence | None, findings: dict[str, Any], history: Iterable[NodeFaultRecord],
                    now: float) -> tuple[JobVerdict, JobOutcome]:
        """What the node's decision does to one waiting job: its verdict for the node, its
        outcome (from the fault's tally with this verdict counted), and the budget it spends
        (once per fault; a flapping node's repeat is not charged again)."""
        infra_hint = (label is SuspectVerdict.HEALTHY and plan is not None
                      and plan.decision.budget is Budget.INFRASTRUCTURE)
        # A reboot (or GPU reset) the breaker held back: a job that cannot move waits for the
        # breaker's reset (HOLD).
        held = (label is SuspectVerdict.BLOCKED and plan is not None and plan.blocked_by_breaker
                and plan.action in (Action.REBOOT, Action.RESET_GPU)
                and self.held_job_deadline_seconds > 0)
        tally = job.tally.with_verdict(label, held=held)
        if infra_hint:
            tally = replace(tally, infra=tally.infra + 1)
        undiagnosed = plan is not None and plan.undiagnosed
        if undiagnosed:
            tally = replace(tally, undiagnosed=tally.undiagnosed + 1)
        outcome = tally.outcome(relocatable=bool(tally.fatal) and job.relocatable)
        if outcome is JobOutcome.RESTART and self._coupled_nodes(job, tally):
            # Nothing found, and nodes whose exits followed were not checked: they are, before
            # the job restarts (``conclude``, once this verdict is committed).
            outcome = JobOutcome.WAIT
        reason = f"verdict {label.value} on {inst_id}" + (f" ({plan.action.value}, rule "
                                                          f"{plan.decision.rule_id})" if plan else "")
        kind = Budget.INFRASTRUCTURE
        if outcome == JobOutcome.RESTART:
            kind = plan.decision.budget if plan and plan.decision.budget is not Budget.NONE \
                else (Budget.INFRASTRUCTURE if tally.infra_all else Budget.APPLICATION)
        if tally.unjudged:
            # The stack's own check gave no verdict on a suspect of the fault (this one or an
            # earlier one) and found no other one bad: whose the fault was is not known, so it
            # is not the job's to pay, however the other suspects' verdicts read.
            kind = Budget.NONE
        if (evidence is not None and evidence.trigger is Trigger.PREFLIGHT) or _opened_by_preflight(job):
            # Found by the gang preflight, before the attempt trained: the job lost no work
            # and restarts (or waits) without spending a recovery; the node's escalation and
            # the breaker bound how often that can happen.
            kind = Budget.NONE
        charge = True
        if plan is not None and kind is Budget.INFRASTRUCTURE and (outcome.restarts
                                                                    or outcome is JobOutcome.HOLD):
            charge = charges_job(history, job.job_id, plan.decision.cause, now, self.policy.escalation)
        settled = self._settle(job, outcome, kind, charge, inst_id, label, plan, reason)
        waits = settled.outcome in (JobOutcome.RESTART_AFTER_REBOOT, JobOutcome.HOLD) \
            and label is SuspectVerdict.REBOOT and settled.to is not JobState.FAILED
        record = None
        if evidence is not None and plan is not None:
            record = fault_record(evidence, plan, now, label)
        verdict = JobVerdict(job=job, to=settled.to, label=label, findings=findings, last_error=settled.error,
                             spend=settled.spend, deadline_at=settled.deadline_at(now), record=record,
                             relocate=(settled.outcome == JobOutcome.RELOCATE
                                       and settled.to is not JobState.FAILED),
                             restart_reason=settled.restart_reason, reason=settled.reason,
                             waits_for_reboot=waits,
                             infra_hint=infra_hint, held=held, hold_spend=settled.hold_spend,
                             undiagnosed=undiagnosed)
        return verdict, settled.outcome

    def _settle(self, job: Job, outcome: JobOutcome, kind: Budget, charge: bool, inst_id: str,
                label: SuspectVerdict | None, plan: RemediationPlan | None, reason: str) -> _Settled:
        """The job's state after an outcome: a restart leaves PENDING_HEALTHCHECK (once, its
        budget charged) or fails for want of budget (or in observe mode)."""
        to, spend, error, restart_reason = job.state, "", "", ""
        if outcome is JobOutcome.HOLD and job.state is JobState.PENDING_HEALTHCHECK:
            return self._settle_hold(job, kind, charge, inst_id, label, plan, reason)
        if outcome.restarts and job.state is JobState.PENDING_HEALTHCHECK:
            budget = settle(budgets_of(job), kind, charge=charge)
            if not budget.restart:
                outcome = (JobOutcome.FAIL_APPLICATION_ERROR if kind is Budget.APPLICATION
                           else JobOutcome.FAIL_NO_BUDGET)
                error = self._failure_text(outcome, inst_id, label, plan, job, budget.reason)
            elif not self.policy.modes.executes(Effect.RESTART_JOB):
                outcome = JobOutcome.FAIL_OBSERVED
                error = (f"observe mode: the job would have been restarted ({budget.reason}); "
                         f"{label.value if label else 'all healthy'} on {inst_id}")
            else:
                to = JobState.PENDING_RESTART
                spend = {Budget.INFRASTRUCTURE: SPEND_INFRASTRUCTURE,
                         Budget.APPLICATION: SPEND_APPLICATION}.get(budget.charged, "")
                restart_reason = budget.reason
                reason += f"; {budget.reason}"
        elif outcome == JobOutcome.FAIL_NODE_FAULT:
            error = self._failure_text(outcome, inst_id, label, plan, job, "")
        if outcome.fails:
            to = JobState.FAILED
        return _Settled(outcome, to, spend, error, restart_reason, reason)

    def _settle_hold(self, job: Job, kind: Budget, charge: bool, inst_id: str, label: SuspectVerdict | None,
                     plan: RemediationPlan | None, reason: str) -> _Settled:
        """A node's reboot held back by the breaker, the job cannot move: it waits for its
        restart (HELD once every verdict is in) if its budget would allow that restart, and
        is charged only when it goes on. No budget left: it fails as it would have anyway."""
        budget = settle(budgets_of(job), kind, charge=charge)
        if not budget.restart:
            outcome = JobOutcome.FAIL_NO_BUDGET
            error = self._failure_text(outcome, inst_id, label, plan, job, budget.reason)
            return _Settled(outcome, JobState.FAILED, "", error, "", reason)
        if not self.policy.modes.executes(Effect.RESTART_JOB):
            error = f"observe mode: the job would have waited for the breaker's reset; {inst_id} held"
            return _Settled(JobOutcome.FAIL_OBSERVED, JobState.FAILED, "", error, "", reason)
        spend = SPEND_INFRASTRUCTURE if budget.charged is Budget.INFRASTRUCTURE else \
            SPEND_APPLICATION if budget.charged is Budget.APPLICATION else ""
        return _Settled(JobOutcome.HOLD, JobState.PENDING_RESTART, "", "", "reboot held back by the breaker",
                        f"{reason}; reboot held back by the blast-radius breaker: the job waits for its "
                        "reset (budget not charged while held)", hold_spend=spend)

    def conclude(self, job: Job) -> str:
        """Every suspect of the fault decided healthy, the last verdict before every rank had
        ended (so before the suspects were counted), or two last verdicts committed at once
        (neither saw the other): the job restarts without node action, budget permitting.
        The verdicts counted on the tally's shards are added first."""
        job = self.data.faults.counted(job)
        if job.state is not JobState.PENDING_HEALTHCHECK or not job.tally.all_decided:
            return "waiting"
        outcome = job.tally.outcome(relocatable=bool(job.tally.fatal) and job.relocatable)
        if outcome is JobOutcome.WAIT:
            return "waiting"
        if outcome is JobOutcome.RESTART:
            coupled = self._check_coupled(job)
            if coupled:
                return coupled
        kind = Budget.INFRASTRUCTURE if job.tally.infra_all else Budget.APPLICATION
        if job.tally.unjudged or _opened_by_preflight(job):
            # A suspect the stack's check could not judge; or every pinned node cleared (the
            # attempt had not trained).
            kind = Budget.NONE
        where = f"{job.tally.total} suspect node(s)"
        settled = self._settle(job, outcome, kind, True, where, None, None,
                               f"every verdict in: {where} healthy")
        now = clock.now()
        notice = None
        if settled.outcome.fails:
            failed = replace(job, state=JobState.FAILED, last_error=settled.error or job.last_error)
            notice = self.owed.concluded_notice(failed, settled.outcome)
        if not self.data.conclude_fault(job, settled.to, reason=settled.reason, error=settled.error,
                                             spend=settled.spend, restart_reason=settled.restart_reason,
                                             deadline_at=settled.deadline_at(now),
                                             also=self.notices.owe([notice], now),
                                             ledger=goodput.cause_marks(goodput.wait_cause(
                                                 relocate=settled.outcome is JobOutcome.RELOCATE,
                                                 repair=settled.outcome is JobOutcome.HOLD,
                                                 application=settled.spend == SPEND_APPLICATION))):
            return "raced"
        if settled.outcome.fails:
            self.notices.send([notice])
            self.metrics.add_metric("Failures", "Count", 1)
            ended(self.metrics, self.data, job.job_id, True)
            return "failed"
        after_commit("restart", self.reactions.emit, RestartDue(job.job_id))
        return "restart"

    def _check_coupled(self, job: Job) -> str:
        """Every check of the fault found its node healthy: before the job restarts on them,
        the nodes whose exits were coupled to the fault (``domain.suspects``) are checked too,
        the total raised to count them (once). "" when there are none (fewer than two
        suspects: no exit could be coupled)."""
        tally = job.tally
        found = self._coupled_nodes(job, tally)
        if not found:
            return ""
        named, coupled = found
        escalated = self.data.faults.escalate(job, max(tally.total or 0, len(named)) + len(coupled))
        if escalated is None:
            return "raced"
        logger.warning("the fault's checks found nothing: the nodes whose exits followed are checked",
                       extra={"job_id": job.job_id, "coupled": len(coupled), "checked": len(named)})
        self.metrics.add_metric("CoupledNodesChecked", "Count", len(coupled))
        after_commit("check the coupled nodes", self.reactions.emit,
                     CoupledToCheck(escalated, frozenset(coupled)))
        return "checking_coupled"

    def _coupled_nodes(self, job: Job, tally: FaultTally) -> tuple[set[str], set[str]] | None:
        """The fault's suspect nodes and the nodes whose exits were coupled to it, when the
        latter are owed a check (none found, not escalated yet); None otherwise. Read only
        when it can be owed: two suspects at least (no exit is coupled before the second)."""
        if tally.escalated or tally.found or (tally.total or 0) < suspects.FIRST_CHECKED_EXITS:
            return None
        named, coupled = self.data.latches.fault_nodes(job.job_id, tally.attempt, job.world_size)
        return (named, coupled) if coupled else None

    def settle_counted(self, job_id: str) -> str:
        """After a verdict that left the job waiting (counted on a tally shard, or on the
        job item beside another one committing at once): with every count added, the fault
        may be complete. Concludes it (a job waiting for verdicts) or tries the restart (a
        job waiting to restart); each is conditioned on the job's state, so one wins."""
        job = self.data.get_job(job_id)
        if job is None or not job.in_fault:
            return "ignored"
        if job.state is JobState.PENDING_HEALTHCHECK:
            return self.conclude(job)
        if job.state is JobState.PENDING_RESTART:
            restarted = self.reactions.emit(RestartDue(job_id))
            return restarted.action if restarted is not None else "restart_due"
        return "ignored"

    @staticmethod
    def _failure_text(outcome: JobOutcome, inst_id: str, label: SuspectVerdict | None,
                      plan: RemediationPlan | None, job: Job, budget_reason: str) -> str:
        decided = f" ({plan.decision.reason})" if plan else ""
        if outcome == JobOutcome.FAIL_APPLICATION_ERROR:
            return (f"application error: the GPUs of {inst_id} were found healthy{decided}; "
                    f"{budget_reason or 'no application-error restart left'} ({job.last_error})")
        if outcome == JobOutcome.FAIL_NO_BUDGET:
            node = ("is rebooted and returns to service" if label is SuspectVerdict.REBOOT
                    else "was remediated")
            needed = plan.action.value if plan else (label.value.lower() if label else "a restart")
            return (f"{inst_id} needed {needed}{decided}; the "
                    f"node {node}, but the job used all {job.max_recovery_attempts} recovery attempt(s) "
                    f"({budget_reason})")
        if label is SuspectVerdict.OPERATOR_ACTION:
            return (f"{inst_id} has a configuration problem a reboot cannot fix (e.g. persistence mode "
                    f"off){decided}")
        if label is SuspectVerdict.BLOCKED:
            return f"{inst_id} needs a node action that was not carried out{decided}"
        return f"{inst_id} has a GPU fault a reboot cannot fix{decided}"
