"""The e-mails a node's remediation owes, built *before* the decision's commit and owed in
its transaction (``recovery.notices``: the outbox; published after the commit, or by the
sweep if the delivery dies in between).

Every builder reads what it needs then (a job's e-mail reads its suspect item: the ranks
that failed on the node), so a failed read fails nothing; it is handed the job and the
instance *as the decision leaves them* (``node_decision.projected``), so the e-mail says
what was done.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.policy import JobOutcome
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import NODE_EFFECTS, RemediationPlan
from gpu_recovery.domain.states import InstanceState, SuspectVerdict
from gpu_recovery.recovery.breaker.gate import GateAnswer, NodeActionGate
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.repository import JobVerdict


def observed_node_effects(plan: RemediationPlan) -> tuple[Effect, ...]:
    """Node effects observe mode kept from happening (not those the breaker held back)."""
    if plan.blocked_by_breaker:
        return ()
    return tuple(e for e in plan.record_only if e in NODE_EFFECTS)


def job_fate(outcome: JobOutcome) -> str:
    """What a node decision held back by the breaker did to a job, for the trip e-mail."""
    if outcome is JobOutcome.HOLD:
        return "waits HELD until the breaker closes (by itself or reset), not failed, budget not charged"
    if outcome is JobOutcome.RELOCATE:
        return "moves to healthy nodes"
    if outcome.fails:
        return f"failed: {outcome.value.removeprefix('fail_').replace('_', ' ')}"
    return "waits for its other nodes"


def details_of(evidence: Evidence | None, plan: RemediationPlan | None, *,
               job_failed: bool = False) -> list[str]:
    """The e-mail's details: the evidence, then the plan as carried out (``job_failed``: for
    a job the decision failed, which is not restarted)."""
    lines = evidence.render_lines() if evidence is not None else []
    return lines + (plan.render_lines(job_failed=job_failed) if plan is not None else [])


def describe_node_effects(instance: Instance, plan: RemediationPlan | None) -> str:
    node = instance.container_inst_id
    if instance.state is InstanceState.REBOOTING and instance.reset_pending:
        return (f"{node}'s GPUs reset (rebooted instead if the reset fails); it returns to service when it "
                "passes")
    if instance.state is InstanceState.REBOOTING:
        return f"{node} rebooted; it returns to service when it is back"
    if instance.state is InstanceState.QUARANTINED:
        done = f"{node} drained (DRAINING) so nothing new is placed on it"
        if instance.terminate_pending:
            done += "; terminated in its Auto Scaling group (capacity kept: the group launches a new node)"
        elif plan is not None and plan.action is Action.REPLACE and instance.is_managed_instance:
            done += " (ECS Anywhere: not in an Auto Scaling group, replace it by hand)"
        return done
    if instance.state is InstanceState.SUSPECT and instance.breaker_blocked:
        held = instance.breaker_blocked.get("action")
        return f"{node} marked SUSPECT: the blast-radius breaker held its {held} back"
    if plan is not None and plan.record_only:
        return f"{node} left as it is (would have done: {', '.join(e.value for e in plan.record_only)})"
    return f"{node} back in service"


@dataclass(eq=False, repr=False)
class RemediationNotices:
    """The builders of a remediation's e-mails (each returns what to owe: an
    :class:`~gpu_recovery.recovery.notices.Owed`, or None when nothing is owed)."""

    notices: Notices
    gate: NodeActionGate
    cordons: Cordons

    def decision_notices(self, after: Instance, plan: RemediationPlan, evidence: Evidence,
                         label: SuspectVerdict, verdicts: list[tuple[JobVerdict, JobOutcome]],
                         gate: GateAnswer | None, *, waiting: bool, anywhere: bool) -> list[Owed | None]:
        """Every e-mail a node decision owes, built before its commit (``after``: the
        instance as the decision leaves it)."""
        tripped = gate.tripped if gate is not None else None
        inst_id = after.container_inst_id
        notices: list[Owed | None] = []
        if tripped is not None:
            fates = {v.job.job_id: job_fate(o) for v, o in verdicts}
            notices.append(self.gate.tripped_notice(tripped, inst_id, fates))
        notices.append(self.cordon_notice(gate, inst_id, plan))
        for verdict, outcome in verdicts:
            job = replace(verdict.job, state=verdict.to,
                          last_error=verdict.last_error or verdict.job.last_error)
            notices.append(self.outcome_notice(job, outcome, after, plan, evidence, label))
        if plan.escalation.page_operator:
            notices.append(self.page_operator_notice(after, plan, evidence))
        elif anywhere or (plan.action is Action.OPERATOR_ACTION and not waiting):
            notices.append(self._operator_notice(after, plan, evidence))
        elif observed_node_effects(plan) and not any(o.fails for _, o in verdicts):
            # Observe mode for node effects (e.g. reboot=observe) while the job moved on:
            # no job e-mail said what the node would have had.
            notices.append(self._observed_notice(after, plan, evidence))
        return notices

    def outcome_notice(self, job: Job, outcome: JobOutcome, instance: Instance, plan: RemediationPlan | None,
                       evidence: Evidence | None, label: SuspectVerdict | None) -> Owed | None:
        """The e-mail of a job's outcome (None: it owes none), built before the decision's
        commit: ``job`` and ``instance`` as the decision leaves them, ``label`` the job's
        verdict for the node."""
        if not outcome.fails:
            return None
        details = details_of(evidence, plan, job_failed=True)
        node_done = describe_node_effects(instance, plan)
        if outcome == JobOutcome.FAIL_APPLICATION_ERROR:
            return self.notices.for_job(job, instance, NotificationKind.APPLICATION_ERROR,
                                        "Job failed: application error (GPUs healthy)",
                                        what_happened=job.last_error,
                                        what_was_done=f"Job marked FAILED; {node_done}",
                                        operator_action="Look at the job's logs: the GPUs passed DCGM "
                                                        "diagnostics.",
                                        details=details)
        if outcome == JobOutcome.FAIL_OBSERVED:
            return self.notices.for_job(job, instance, NotificationKind.OBSERVED,
                                        "Observe mode: fault detected, nothing done",
                                        what_happened=job.last_error,
                                        what_was_done="Nothing (observe mode): job marked FAILED in the job "
                                                      "table only",
                                        operator_action="Read what would have been done below and act "
                                                        "by hand.",
                                        details=details)
        if label is SuspectVerdict.OPERATOR_ACTION:
            kind, headline = NotificationKind.OPERATOR_ACTION, "Job failed: node configuration problem"
            todo = ("Fix the node's configuration (e.g. enable persistence mode: nvidia-smi -pm 1 or "
                    "nvidia-persistenced), set the container instance ACTIVE again, resubmit the job.")
        elif instance.state is InstanceState.QUARANTINED:
            kind, headline = NotificationKind.QUARANTINED, "Job failed: GPU node quarantined"
            todo = ("Inspect the node (DCGM verdict and evidence below), replace or repair it, then set it "
                    "ACTIVE again and resubmit the job.")
        else:
            kind, headline = NotificationKind.FAILED, "Job failed: GPU fault"
            todo = "Resubmit the job (its recovery budget is spent, or its node could not be remediated)."
        return self.notices.for_job(job, instance, kind, headline, what_happened=job.last_error,
                                    what_was_done=f"Job marked FAILED; {node_done}", operator_action=todo,
                                    details=details)

    def concluded_notice(self, failed: Job, outcome: JobOutcome) -> Owed:
        """The e-mail of a fault concluded without node action (every suspect found healthy)
        that fails the job: ``failed`` as the conclusion leaves it."""
        kind = (NotificationKind.APPLICATION_ERROR if outcome is JobOutcome.FAIL_APPLICATION_ERROR
                else NotificationKind.OBSERVED if outcome is JobOutcome.FAIL_OBSERVED
                else NotificationKind.FAILED)
        return self.notices.for_job(
            failed, None, kind, "Job failed: application error (GPUs healthy)"
            if kind is NotificationKind.APPLICATION_ERROR else "Job failed",
            what_happened=failed.last_error, what_was_done="Job marked FAILED",
            operator_action="Look at the job's logs: the GPUs passed DCGM diagnostics.")

    def cordon_notice(self, gate: GateAnswer | None, inst_id: str, plan: RemediationPlan) -> Owed | None:
        """The loud e-mail when this decision trips the cordon limit (owed with it)."""
        if gate is None or gate.cordon is None or not gate.cordon.tripped_now:
            return None
        return self.cordons.limit_tripped_notice(gate.cordon, inst_id,
                                                 f"{plan.action.value}: {plan.decision.reason}")

    def unreachable_notice(self, job: Job, instance: Instance, plan: RemediationPlan, evidence: Evidence,
                           observed: bool) -> Owed:
        details = details_of(evidence, plan, job_failed=True)
        if observed:
            return self.notices.for_job(
                job, instance, NotificationKind.OBSERVED, "Observe mode: GPU node lost, nothing done",
                what_happened=job.last_error,
                what_was_done=("Nothing (observe mode): no StopTask, drain or termination; the job is "
                               "marked FAILED in the job table only"),
                operator_action="Check the node (network, ECS agent, power) and act by hand.",
                details=details)
        return self.notices.for_job(
            job, instance, NotificationKind.NODE_LOST, "Job failed: GPU node lost",
            what_happened=job.last_error,
            what_was_done=("Job marked FAILED; its tasks were asked to stop (ECS stops the lost one once "
                           f"its agent reconnects); {describe_node_effects(instance, plan)}"),
            operator_action=("Check the node (network, ECS agent, power); once repaired set it ACTIVE "
                             "again and resubmit the job."),
            details=details)

    def agent_disconnected_notice(self, job: Job, instance: Instance, plan: RemediationPlan,
                                  evidence: Evidence, observed: bool, flagged: bool) -> Owed:
        """A lost node whose host still reports (its node agent) while its ECS agent is
        disconnected: the job failed, the node only flagged SUSPECT (``flagged``; else left as
        it was), not quarantined."""
        node = instance.container_inst_id
        node_done = (f"{node} flagged SUSPECT (no new queue work), not quarantined: its node agent "
                     "still reports, so the host is alive" if flagged else
                     f"{node} left {instance.state.value} (only an AVAILABLE node is flagged SUSPECT)")
        stops = ("Nothing stopped (observe mode): the job is marked FAILED in the job table only"
                 if observed else "Job marked FAILED; its tasks were asked to stop (ECS stops the lost one "
                                  "once its agent reconnects)")
        return self.notices.for_job(
            job, instance, NotificationKind.OBSERVED if observed else NotificationKind.NODE_LOST,
            "Job failed: ECS agent disconnected, GPU node still reporting",
            what_happened=job.last_error, what_was_done=f"{stops}; {node_done}",
            operator_action=("Look at the host's ECS agent and container runtime (memory, disk and PID "
                             "exhaustion by a container can wedge them); once its ECS agent reconnects the "
                             "stack runs its own DCGM check on a SUSPECT node and returns it to AVAILABLE "
                             "if it passes, else return it by hand as the runbook says; resubmit the job."),
            details=details_of(evidence, plan, job_failed=True))

    def page_operator_notice(self, instance: Instance, plan: RemediationPlan, evidence: Evidence) -> Owed:
        return self.notices.for_node(
            NotificationKind.OPERATOR_ACTION, "GPU node keeps failing: quarantined, needs a person",
            container_inst_id=instance.container_inst_id, instance_id=instance.ec2_instance_id,
            what_happened=plan.escalation.reason, what_was_done=describe_node_effects(instance, plan),
            operator_action="Open a hardware ticket for this node; it is kept out of service until then.",
            details=details_of(evidence, plan))

    def _observed_notice(self, instance: Instance, plan: RemediationPlan, evidence: Evidence) -> Owed:
        would = ", ".join(e.value for e in observed_node_effects(plan))
        return self.notices.for_node(
            NotificationKind.OBSERVED, f"Observe mode: GPU node needed {plan.action.value}, not done",
            container_inst_id=instance.container_inst_id, instance_id=instance.ec2_instance_id,
            what_happened=plan.decision.reason,
            what_was_done=f"Nothing on the node (observe mode for {would}); its jobs moved on as decided",
            operator_action=f"Read the evidence below and do by hand what was not done ({would}).",
            details=details_of(evidence, plan))

    def _operator_notice(self, instance: Instance, plan: RemediationPlan, evidence: Evidence) -> Owed:
        if plan.action is Action.OPERATOR_ACTION:
            headline = "GPU node configuration problem"
            todo = "Fix the node's configuration, then set the container instance ACTIVE again."
        else:
            headline = "GPU node must be replaced by hand (ECS Anywhere)"
            todo = ("This ECS Anywhere node is not in an Auto Scaling group: it was quarantined instead "
                    "of terminated. Repair or replace the host, then register it again.")
        return self.notices.for_node(
            NotificationKind.OPERATOR_ACTION, headline,
            container_inst_id=instance.container_inst_id, instance_id=instance.ec2_instance_id,
            what_happened=plan.decision.reason, what_was_done=describe_node_effects(instance, plan),
            operator_action=todo, details=details_of(evidence, plan))
