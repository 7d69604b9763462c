"""A rank's own exit as the fault catalog judged it (``recovery.task_events``), and the
goodput facts of its fault."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_recovery.domain import goodput
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Budget
from gpu_recovery.domain.job_budgets import BudgetOutcome
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPlan


@dataclass(frozen=True)
class Assessment:
    """A rank's own exit, judged by the fault catalog against its node's evidence."""

    evidence: Evidence
    plan: RemediationPlan
    instance_item: dict[str, Any] | None
    # What the stack is doing to the rank's node (policy.stack_remediation): the rank was
    # killed by our own reboot or replacement, an infrastructure fault of that node.
    remediating: str = ""

    @property
    def catalog_node_fault(self) -> bool:
        return self.plan.action is Action.HEALTH_CHECK or self.plan.action in NODE_ACTIONS

    @property
    def node_fault(self) -> bool:
        return self.catalog_node_fault or bool(self.remediating)

    @property
    def observed(self) -> bool:
        """Observe mode keeps the recovery from beginning (ranks not stopped, no diag)."""
        needed = {Effect.STOP_TASKS} | ({Effect.HEALTH_CHECK} if self.plan.action is Action.HEALTH_CHECK
                                        else set())
        return bool(needed & set(self.plan.record_only))

    def record(self, now: float, node: str = "", attempt: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {"at": now, "evidence": self.evidence.to_dict(), "plan": self.plan.to_dict()}
        if node:
            out.update(node=node, attempt=attempt)
        return out


def fault_marks(job: Job, node: str, now: float, assessment: Assessment | None,
                budget: BudgetOutcome | None, ran_from: float | None = None) -> dict[str, Any]:
    """The goodput facts of a rank's fault (``domain.goodput``): when it happened (the
    evidence's time: the task's stop), the last checkpoint reported before it, its node
    and catalog rule, whether it is the job's own (an application error), and when its task
    started (``ran_from``) if the gang restart it ends was never marked running."""
    fault_at = assessment.evidence.fault_at if assessment is not None else now
    rule = assessment.plan.decision.rule_id if assessment is not None else ""
    own = budget is not None and budget.charged is Budget.APPLICATION
    if assessment is not None and not assessment.node_fault and \
            assessment.plan.decision.budget is Budget.APPLICATION:
        own = True
    checkpoint_at = goodput.checkpoint_before(job.checkpoint, fault_at)
    marks = goodput.fault_marks(fault_at=fault_at, checkpoint_at=checkpoint_at, node=node, rule=rule, own=own)
    return {**marks, **restart_run_marks(job, ran_from)}


def restart_run_marks(job: Job, ran_from: float | None) -> dict[str, Any]:
    """``goodput.ran_from_marks`` for a transition out of a gang restart's RUNNING that rank 0's
    RUNNING event never marked ({} for any other)."""
    return goodput.ran_from_marks(ran_from if job.restart_ran_unmarked else None)
