"""The node-unreachable decision: a node the heartbeat service lost too long, with its ECS
agent disconnected (read so twice, minutes apart: ``heartbeat.escalation``).

No diag can run on a node ECS cannot reach, so a node whose node agent is silent too is
quarantined (drained) for a person, never terminated or rebooted automatically (a network
partition looks the same). Observe mode and the breaker apply as to any node action. The
job fails (its rank there cannot be confirmed stopped, so it cannot move): one transaction
holds the node decision (through the gate), the node's history with the evidence, the job
NODE_LOST -> FAILED with its fault record and the e-mails owed; then the drain and the
StopTask of every rank, each through its own intent (the sweep finishes them).

A node whose node agent still reports is alive: only its ECS agent (or the container runtime
it drives, which a tenant's container can wedge) stopped answering, a missing answer that
condemns nothing. The job fails the same way, but the node gets no node decision (no
quarantine, no history record, nothing for the breaker): an AVAILABLE node is flagged SUSPECT
(no new queue work) in the job's transaction, until its ECS agent reconnects and the stack's
own check passes it (``recovery.lost_node_checks``), or a person returns it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain.classify import Decision
from gpu_recovery.domain.escalation import NodeFaultRecord, escalate, history_from_item
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import Action, Budget, Trigger
from gpu_recovery.domain.models import LOST_NODE_ORIGIN, Instance, Job, Rank
from gpu_recovery.domain.remediation_mode import Effect, effects_of
from gpu_recovery.domain.remediation_plan import NODE_EFFECTS, RemediationPlan, RemediationPolicy
from gpu_recovery.domain.states import InstanceState, JobState
from gpu_recovery.recovery.breaker.gate import GateAnswer
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.lost_node_checks import LOOK_SECONDS, mark_quietly
from gpu_recovery.recovery.notices import Owed
from gpu_recovery.recovery.ports import MetricsPort, after_commit
from gpu_recovery.recovery.remediation.job_settlement import fault_record
from gpu_recovery.recovery.remediation.node_decision import (
    APPLY_ROUNDS,
    NodeRemediation,
    label_for,
    projected,
)
from gpu_recovery.recovery.remediation.notices import observed_node_effects
from gpu_recovery.recovery.stage_data import (
    HasInstances,
    HasJobs,
    ReadsNodeItems,
    RecordsNodeDecisions,
    RecordsObservedFaults,
)

logger = logging.getLogger(__name__)

# The cause of a node lost with its ECS agent disconnected (no catalog rule can decide it:
# the diag cannot run on a node ECS cannot reach).
UNREACHABLE_RULE = "builtin:node-unreachable"
# The cause of a node lost with its ECS agent disconnected while its node agent reports.
AGENT_DISCONNECTED_RULE = "builtin:ecs-agent-disconnected"
# A node that stays in one of these may be quarantined by that decision.
_UNREACHABLE_FROM = (InstanceState.AVAILABLE, InstanceState.SUSPECT)
# The job states the decision fails: NODE_LOST (a RUNNING job's lost rank), and SUSPENDING (a
# rank lost in a suspension's grace: no stop can be confirmed, so it could never complete).
_DECIDED_FROM = (JobState.NODE_LOST, JobState.SUSPENDING)


def unreachable_plan(evidence: Evidence, policy: RemediationPolicy, history: Iterable[NodeFaultRecord],
                     now: float, why: str) -> RemediationPlan:
    """A node lost too long with its ECS agent disconnected: no diag can run on it, so it is
    quarantined (drained) for a person, never terminated or rebooted automatically (a
    network partition looks the same). Observe mode and the breaker apply as to any node
    action; the job fails (its rank there cannot be confirmed stopped, so it cannot move)."""
    history = tuple(history)
    decision = Decision(Action.REPLACE, UNREACHABLE_RULE,
                        f"{why}: the DCGM diag cannot run on a node ECS cannot reach; quarantine it "
                        "(drain) for an operator", Budget.NONE, skip_health_check=True)
    escalation = replace(escalate(Action.REPLACE, UNREACHABLE_RULE, history, now, policy.escalation),
                         quarantine_only=True)
    effects = effects_of(Action.REPLACE, replace_action=policy.replace_action, quarantine_only=True)
    execute, record_only = policy.modes.split(effects)
    record = NodeFaultRecord(at=now, cause=UNREACHABLE_RULE, action=Action.REPLACE,
                             executed=any(e in NODE_EFFECTS for e in execute), job_id=evidence.job_id,
                             xids=evidence.xids)
    return RemediationPlan(decision, escalation, Action.REPLACE, False, None, execute, record_only, record)


def agent_disconnected_plan(evidence: Evidence, policy: RemediationPolicy, now: float,
                            why: str) -> RemediationPlan:
    """A node lost too long whose ECS agent is disconnected while its node agent reports: the
    host is alive, so no node action (the most a missing answer may ask is the stack's own
    check); the job fails and its tasks are asked to stop. Nothing for the node's history."""
    decision = Decision(Action.HEALTH_CHECK, AGENT_DISCONNECTED_RULE,
                        f"{why}: the node is a suspect for the stack's own DCGM check (SUSPECT), never "
                        "quarantined on a missing answer", Budget.NONE, skip_health_check=True)
    escalation = escalate(Action.HEALTH_CHECK, AGENT_DISCONNECTED_RULE, (), now, policy.escalation)
    execute, record_only = policy.modes.split((Effect.STOP_TASKS,))
    return RemediationPlan(decision, escalation, Action.HEALTH_CHECK, False, None, execute, record_only, None)


def _in_suspension(job: Job, inst_id: str, *, reason: str) -> str:
    """The reason, for a SUSPENDING job naming the suspension that could not be completed."""
    if job.state is not JobState.SUSPENDING or "suspension could not be completed" in reason:
        return reason
    kind = str(job.suspend.get("kind") or "")
    return (f"{reason}; the job was being suspended ({kind or 'suspend'}) and its suspension could not be "
            f"completed: its rank(s) on {inst_id} cannot be confirmed stopped, so it cannot be resumed "
            "elsewhere (a rank still running could write its checkpoint)")


def unreachable_decided(job: Job, inst_id: str) -> bool:
    """The job's fault on ``inst_id`` (this attempt) was decided as a lost node (unreachable,
    or its ECS agent disconnected while it reports)."""
    stored = job.last_fault
    if stored.get("node") != inst_id or int(stored.get("attempt") or 0) != job.attempt:
        return False
    decision = (stored.get("plan") or {}).get("decision") or {}
    return decision.get("rule_id") in (UNREACHABLE_RULE, AGENT_DISCONNECTED_RULE)


class UnreachableJobs(Protocol):
    """The job whose node is lost."""

    def get_job(self, job_id: str) -> Job | None: ...
    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...


class UnreachableNodes(ReadsNodeItems, RecordsObservedFaults, Protocol):
    """The lost node, the fault observed only (observe mode)."""

    def get_instance(self, container_inst_id: str) -> Instance | None: ...


class UnreachableData(HasJobs[UnreachableJobs], HasInstances[UnreachableNodes],
                      RecordsNodeDecisions, Protocol):
    """The job and its lost node, the node's decision (or the job's failure alone), the fault
    observed only (observe mode)."""


class NodeUnreachable:
    def __init__(self, data: UnreachableData, remediation: NodeRemediation, gang: GangOps, *,
                 policy: RemediationPolicy, metrics: MetricsPort) -> None:
        self.data = data
        self.policy = policy
        self.metrics = metrics  # the service's relay: the invocation's metrics
        self.remediation = remediation
        self.notices = remediation.notices  # the outbox
        self.owed = remediation.owed_notices
        self.gate = remediation.reboots.gate
        self.gang = gang  # the job's other ranks stopped

    def decide(self, job_id: str, attempt: int, inst_id: str, lost: list[Rank], lost_since: float,
               why: str, *, host_reporting: bool = False) -> str:
        """The heartbeat service's node lost too long with its ECS agent disconnected
        (``host_reporting``: while its node agent reports, :meth:`_fail_job_only`).

        One transaction: the node decision (quarantine through the breaker, or only recorded
        in observe mode), the node's history with the evidence, and the job NODE_LOST ->
        FAILED (or, a node lost in a suspension's grace, SUSPENDING -> FAILED) with its fault
        record; then the drain (its own intent, finished by the sweep)
        and the StopTask of every rank (intent per rank; ECS stops a rank on the lost node
        once its agent reconnects). A sweep that finds the job already FAILED by this
        decision asks the stops again (the lost ranks are stopped last, so they stay watched
        until every other one was asked). Returns failed | observed | converged |
        observed_before | moved_on | raced."""
        repo = self.data
        for _ in range(APPLY_ROUNDS):
            job = repo.jobs.get_job(job_id)
            if job is None or job.attempt != attempt:
                return "moved_on"
            if job.state is JobState.FAILED and unreachable_decided(job, inst_id):
                if not self.policy.modes.executes(Effect.STOP_TASKS):
                    return "observed_before"
                self._stop_all(job, lost, job.last_error or why, reissue=True)
                return "converged"
            if job.state not in _DECIDED_FROM:
                return "moved_on"
            why = _in_suspension(job, inst_id, reason=why)
            raw = repo.instances.get_instance_item(inst_id)
            now = clock.now()
            evidence = self.remediation.evidence(inst_id=inst_id, instance_item=raw,
                                                 trigger=Trigger.NODE_LOST, fault_at=lost_since, job=job)
            if host_reporting:
                outcome = self._fail_job_only(job, inst_id, lost, raw, evidence, why, now)
                if outcome is None:
                    continue
                return outcome
            history = history_from_item((raw or {}).get("fault_history"))
            plan = unreachable_plan(evidence, self.policy, history, now, why)
            observed = not self.policy.modes.executes(Effect.STOP_TASKS)
            instance = repo.instances.instance_from_item(raw) if raw else None
            tripped, gate, breaker_update, decision = None, None, None, None
            after = instance or Instance(inst_id)
            if instance is not None and instance.state in _UNREACHABLE_FROM and not observed:
                plan, breaker_update, gate = self.remediation.ask_gate(plan, inst_id, [job], now)
                tripped = gate.tripped if gate is not None else None
                reason = self._reason(why, plan)
                decision = self.remediation.node_decision(
                    plan, label_for(plan), instance, _UNREACHABLE_FROM, evidence, None,
                    self.remediation.history_with(history, plan, evidence, now), None, None, [], now,
                    job_ids=[job_id], gate=gate)
                after = projected(instance, decision)
            else:
                # Observe mode, or a node another decision owns (rebooting, in a health check,
                # quarantined already): the job fails, the node is left as it is.
                reason = self._reason(why, plan)
                if not observed:
                    state = instance.state.value if instance is not None else "unknown to the loop"
                    reason += f"; node left {state} (another decision owns it)"
            last_fault = fault_record(evidence, plan, now, node=inst_id, attempt=attempt)
            failed = replace(job, state=JobState.FAILED, last_error=reason[:1000])
            notices = [self.gate.tripped_notice(tripped, inst_id) if tripped is not None else None,
                       self.owed.cordon_notice(gate, inst_id, plan),
                       self.owed.unreachable_notice(failed, after, plan, evidence, observed),
                       self.owed.page_operator_notice(after, plan, evidence)
                       if plan.escalation.page_operator and not observed else None]
            owed = self.notices.owe(notices, now)
            if decision is not None and instance is not None:
                failure = repo.decisions.lost_job_failure(job, reason, last_fault)
                done = repo.decisions.record(instance, decision, [], now, breaker_update,
                                             also=[failure, *owed])
            else:
                done = repo.decisions.fail_lost_job(job, reason, last_fault, also=owed)
                if done and observed and raw is not None:
                    after_commit("observed fault", self._record_observed, inst_id, job_id,
                                 self.remediation.history_with(history, plan, evidence, now), evidence, plan,
                                 now)
            if not done:
                continue
            if tripped is not None:
                self.gate.tripped(tripped)
            self._committed(notices, gate, decision is not None, after, plan, failed, lost, reason)
            return "observed" if observed else "failed"
        return "raced"

    def _fail_job_only(self, job: Job, inst_id: str, lost: list[Rank], raw: dict[str, Any] | None,
                       evidence: Evidence, why: str, now: float) -> str | None:
        """The host still reports: the job fails as for an unreachable node, in one transaction
        with the e-mail owed and, for an AVAILABLE node, its SUSPECT flag; no node decision,
        nothing in the node's history or the breaker's window. None: the job or the node
        changed since the read (decide again)."""
        repo = self.data
        plan = agent_disconnected_plan(evidence, self.policy, now, why)
        observed = not self.policy.modes.executes(Effect.STOP_TASKS)
        instance = repo.instances.instance_from_item(raw) if raw else Instance(inst_id)
        flagged = raw is not None and instance.state is InstanceState.AVAILABLE
        after = replace(instance, state=InstanceState.SUSPECT) if flagged else instance
        reason = self._reason(why, plan)
        failed = replace(job, state=JobState.FAILED, last_error=reason[:1000])
        notices = [self.owed.agent_disconnected_notice(failed, after, plan, evidence, observed, flagged)]
        # Its ECS agent's reconnect starts the stack's own check (recovery.lost_node_checks):
        # its events reach the instance monitor by its mark, the sweep looks at it meanwhile.
        flag = [repo.decisions.suspect_flag(inst_id, now, reason, origin=LOST_NODE_ORIGIN,
                                            look_at=now + LOOK_SECONDS)] if flagged else []
        if not repo.decisions.fail_lost_job(job, reason, fault_record(evidence, plan, now, node=inst_id,
                                                                      attempt=job.attempt),
                                            also=[*flag, *self.notices.owe(notices, now)]):
            return None
        if flagged:
            after_commit("lost-node mark", mark_quietly, self.remediation.reboots.ecs, after)
        self._committed(notices, None, False, after, plan, failed, lost, reason)
        return "observed" if observed else "failed"

    def _committed(self, notices: Sequence[Owed | None], gate: GateAnswer | None, decided: bool,
                   after: Instance, plan: RemediationPlan, failed: Job, lost: list[Rank],
                   reason: str) -> None:
        """After a lost node's decision commits: its e-mails and metrics; then the cordon's
        attribute, the drain (``decided``) and the ranks' stops."""
        logger.warning("node lost: job failed", extra={
            "job_id": failed.job_id, "instance": after.container_inst_id,
            "rule": plan.decision.rule_id, "execute": [e.value for e in plan.execute],
            "record_only": [e.value for e in plan.record_only]})
        self.notices.send(notices)
        self.metrics.add_metric("Failures", "Count", 1)
        ended(self.metrics, self.data.jobs, failed.job_id, True)
        after_commit("node unreachable", self._after, gate, decided, after, plan, failed, lost, reason)

    def _record_observed(self, inst_id: str, job_id: str, history: list[dict[str, Any]] | None,
                         evidence: Evidence, plan: RemediationPlan, now: float) -> None:
        self.data.instances.record_observed_fault(
            inst_id, fault_history=history,
            last_fault={"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": [job_id]})

    def _after(self, gate: GateAnswer | None, decided: bool, after: Instance, plan: RemediationPlan,
               failed: Job, lost: list[Rank], reason: str) -> None:
        """After the commit: the cordon's attribute, the drain, the ranks' stops."""
        repo = self.data
        inst_id = after.container_inst_id
        self.remediation.after_cordon(gate, inst_id)
        if decided:
            self.remediation.carry_out(repo.instances.get_instance(inst_id) or after, plan)
        self._stop_all(repo.jobs.get_job(failed.job_id) or failed, lost, reason, reissue=False)

    @staticmethod
    def _reason(why: str, plan: RemediationPlan) -> str:
        if observed_node_effects(plan) or Effect.STOP_TASKS in plan.record_only:
            return f"{why}; observe mode: would have done {', '.join(e.value for e in plan.record_only)}"
        if plan.blocked_by_breaker:
            return f"{why}; its quarantine held back by the blast-radius breaker"
        return why

    def _stop_all(self, job: Job, lost: list[Rank], why: str, *, reissue: bool) -> None:
        """StopTask of every live rank of the attempt (observe mode: none): the FAILED
        transition committed the intent; its fan-out is sent now, or by the sweep."""
        if job.stop_fanout and (not reissue or not job.stop_fanout.get("sent_at")):
            self.gang.stop(job)
