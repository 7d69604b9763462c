"""One call from evidence to what to do: classify, escalate, charge the job, split the side
effects into executed and observed-only. Pure; the breaker is applied after, with its state.

    plan = plan_remediation(evidence, policy, node_history=history, now=now, job_budgets=budgets)
    if plan.needs_breaker:
        verdict = breaker.record_action(state, node=..., action=plan.action.value, ...)
        plan = plan.with_breaker(verdict)          # blocked: node effects become record-only
    # carry out plan.execute; record plan.to_dict(); append plan.node_record to the history

The node's remediation never depends on the job's budget: the budget only decides whether
the job restarts (``budget.restart``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_recovery.domain.breaker.breaker import BreakerDecision
from gpu_recovery.domain.classify import Decision, classify
from gpu_recovery.domain.escalation import (
    Escalation,
    EscalationPolicy,
    NodeFaultRecord,
    charges_job,
    escalate,
)
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_catalog import FaultCatalog
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Budget
from gpu_recovery.domain.job_budgets import BudgetOutcome, JobBudgets, settle
from gpu_recovery.domain.remediation_mode import Effect, RemediationModes, effects_of

NODE_EFFECTS = frozenset({Effect.RESET_GPU, Effect.REBOOT, Effect.DRAIN, Effect.TERMINATE})


@dataclass(frozen=True)
class RemediationPolicy:
    catalog: FaultCatalog
    escalation: EscalationPolicy = field(default_factory=EscalationPolicy)
    modes: RemediationModes = field(default_factory=RemediationModes)
    suspect_exit_codes: frozenset[int] = frozenset({1})
    replace_action: str = "quarantine"  # or "terminate_in_asg"
    # True once a recovery stage carries out reset_gpu (a privileged task resetting the node's
    # GPUs). Until then every reset_gpu rule is classified as today's reboot (same ranking, same
    # rule id, escalation and budget), so no plan, record or stage downstream sees reset_gpu.
    gpu_reset_enabled: bool = False


@dataclass(frozen=True)
class RemediationPlan:
    decision: Decision
    escalation: Escalation
    action: Action  # after escalation
    charge_job: bool  # False: a flapping node's repeat, already charged to this job
    budget: BudgetOutcome | None  # None: no budgets given, or the diag decides first
    execute: tuple[Effect, ...]  # carry these out, in order
    record_only: tuple[Effect, ...]  # observe mode / breaker: record and notify only
    node_record: NodeFaultRecord | None  # append to the node's history (None: diag pending)
    breaker_reason: str = ""
    blocked_by_breaker: bool = False

    @property
    def undiagnosed(self) -> bool:
        """The stack's own check gave no verdict (:func:`undiagnosed`): it cleared nothing."""
        return self.decision.rule_id == UNDIAGNOSED_RULE

    @property
    def needs_breaker(self) -> bool:
        """A node action is about to be carried out: ask the breaker first."""
        return self.action in NODE_ACTIONS and any(e in NODE_EFFECTS for e in self.execute)

    def with_breaker(self, verdict: BreakerDecision) -> RemediationPlan:
        """Apply the breaker's answer: when blocked, the node's effects are only recorded."""
        if verdict.allowed:
            return replace(self, breaker_reason=verdict.reason)
        blocked = tuple(e for e in self.execute if e in NODE_EFFECTS)
        record = replace(self.node_record, executed=False) if self.node_record else None
        return replace(self, execute=tuple(e for e in self.execute if e not in NODE_EFFECTS),
                       record_only=self.record_only + blocked, node_record=record,
                       breaker_reason=verdict.reason, blocked_by_breaker=True)

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "decision": self.decision.to_dict(),
                "escalation": self.escalation.to_dict(), "charge_job": self.charge_job,
                "budget": self.budget.to_dict() if self.budget else None,
                "execute": [e.value for e in self.execute],
                "record_only": [e.value for e in self.record_only],
                "breaker": self.breaker_reason, "blocked_by_breaker": self.blocked_by_breaker}

    def render_lines(self, *, job_failed: bool = False) -> list[str]:
        """Plain-text lines for the operator e-mail. ``job_failed``: the e-mail is about a job
        this decision failed, so the job was not restarted, whatever the node's plan said (a
        health check's plan knows no job budget: the job's settlement decides its fate)."""
        lines = [f"Decision: {self.action.value} ({self.decision.reason})"]
        if self.escalation.escalated or self.escalation.page_operator:
            lines.append(f"Escalation: {self.escalation.reason}")
        if self.budget is not None:
            lines.append(f"Job budget: {self.budget.reason}")
        done = [e for e in self.execute if not (job_failed and e is Effect.RESTART_JOB)]
        if done:
            lines.append("Done: " + ", ".join(e.value for e in done))
        if len(done) < len(self.execute):
            lines.append(f"Not done: {Effect.RESTART_JOB.value} (the job is marked FAILED)")
        if self.record_only:
            why = f" ({self.breaker_reason})" if self.blocked_by_breaker else " (observe mode)"
            lines.append("Would have done (not carried out): "
                         + ", ".join(e.value for e in self.record_only) + why)
        lines += [f"Note: {n}" for n in self.decision.notes]
        return lines


def plan_remediation(evidence: Evidence, policy: RemediationPolicy, *,
                     node_history: Iterable[NodeFaultRecord] = (), now: float,
                     job_budgets: JobBudgets | None = None,
                     decided: Callable[[Decision], Decision] | None = None,
                     cause: str | None = None) -> RemediationPlan:
    """``decided``: adjusts the catalog's decision (a failed validation's is always a node
    action: ``domain.validation.failure_decision``); ``cause``: the cause escalation counts the
    fault under, when not the deciding rule's (a validation failure counts under the cause of
    the repair that did not hold)."""
    history = tuple(node_history)
    # Without a reset stage, reset_gpu rules compete and act as today's reboot (classify).
    decision = classify(evidence, policy.catalog, history=history,
                        suspect_exit_codes=policy.suspect_exit_codes,
                        reset_as_reboot=not policy.gpu_reset_enabled)
    if decided is not None:
        decision = decided(decision)
    cause = cause or decision.cause
    escalation = escalate(decision.action, cause, history, now, policy.escalation)
    action = escalation.action
    charge = True
    if decision.budget is Budget.INFRASTRUCTURE and evidence.job_id:
        charge = charges_job(history, evidence.job_id, cause, now, policy.escalation)
    budget = None
    if job_budgets is not None and action is not Action.HEALTH_CHECK:
        budget = settle(job_budgets, decision.budget, charge=charge)
    effects = effects_of(action, replace_action=policy.replace_action,
                         quarantine_only=escalation.quarantine_only)
    if budget is not None and not budget.restart:
        effects = tuple(e for e in effects if e is not Effect.RESTART_JOB)
    execute, record_only = policy.modes.split(effects)
    node_record = None
    if action is not Action.HEALTH_CHECK:
        executed = action not in NODE_ACTIONS or any(e in NODE_EFFECTS for e in execute)
        node_record = NodeFaultRecord(
            at=now, cause=cause, action=action, executed=executed, job_id=evidence.job_id,
            charged_job=(budget.charged is Budget.INFRASTRUCTURE if budget is not None
                         else charge and decision.budget is Budget.INFRASTRUCTURE),
            xids=evidence.xids)
    return RemediationPlan(decision, escalation, action, charge, budget, execute, record_only, node_record)


#: the rule of a fault the stack's own check could not diagnose (no verdict in time, a check
#: that could not start): missing evidence is not bad evidence (issue 49)
UNDIAGNOSED_RULE = "builtin:health-check-undiagnosed"


def undiagnosed(plan: RemediationPlan, reason: str) -> RemediationPlan:
    """``plan`` for a fault whose DCGM check gave no verdict: nothing done to the node (it
    leaves its check as it was before it), nothing recorded in its history, no page, and the
    job's restart spends no budget (the stack's own failure, not the job's nor the node's)."""
    decision = replace(plan.decision, action=Action.NONE, rule_id=UNDIAGNOSED_RULE, reason=reason,
                       budget=Budget.NONE, skip_health_check=False, after_health_check=True,
                       expected_action=None)
    escalation = replace(plan.escalation, action=Action.NONE, escalated=False, page_operator=False)
    return replace(plan, decision=decision, escalation=escalation, action=Action.NONE, charge_job=False,
                   budget=None, execute=(), record_only=(), node_record=None, breaker_reason="",
                   blocked_by_breaker=False)
