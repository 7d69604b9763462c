"""Stage 2b: a node's remediation, decided by the fault catalog and carried out once.

A *node decision* is the answer to "what does this node need": a health check's
verdict (after the DCGM diag), or a definitive fault without one (the catalog's fast
path, e.g. XID 79). Both go through :meth:`NodeRemediation.apply`:

1. **plan** — evidence -> catalog decision -> the node's escalation (reboot -> replace,
   quarantine + page) -> the effects to carry out and those only recorded (observe mode);
2. **breaker** — a reboot / replacement / quarantine asks the blast-radius breaker first;
   when it is tripped the node's effects are only recorded and kept in its backlog;
3. **commit** — one transaction: the breaker's state (conditional on its version), the
   instance (new state, bounded fault history, the evidence), and every waiting job
   (its verdict for this node, its outcome, its budget); a lost race writes nothing;
4. **effects** — reboot / drain / terminate through their own crash-consistent intents
   (a deadline on the instance lets the sweep finish them if this delivery dies);
5. **tell** — one e-mail per job outcome with the evidence and the plan, one when the
   breaker trips, one when a node needs a person.

The node's remediation never depends on a job's budget: the budget only decides whether
the job restarts (:meth:`job_verdict`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.classify import Decision
from gpu_recovery.domain.escalation import (
    NodeFaultRecord,
    charges_job,
    escalate,
    fault_summary,
    history_from_item,
    history_to_item,
    record_fault,
)
from gpu_recovery.domain.evidence import Evidence, build_evidence
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Budget, Trigger
from gpu_recovery.domain.job_budgets import JobBudgets, settle
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.policy import JobOutcome
from gpu_recovery.domain.remediation_mode import Effect, effects_of
from gpu_recovery.domain.remediation_plan import (
    NODE_EFFECTS,
    RemediationPlan,
    RemediationPolicy,
    plan_remediation,
)
from gpu_recovery.domain.states import (
    RECOVERING_JOB_STATES,
    InstanceState,
    JobState,
    SuspectVerdict,
)
from gpu_recovery.recovery.breaker.gate import GateAnswer
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.notices import Owed
from gpu_recovery.recovery.ports import Deps, after_commit
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.repository import JobVerdict, NodeDecision
from gpu_recovery.repository.jobs_and_ranks import SPEND_APPLICATION, SPEND_INFRASTRUCTURE

logger = logging.getLogger(__name__)

RETRY_INTERVAL_SECONDS = 60
FOLLOW_UP_SECONDS = 60  # the sweep finishes a decision's reboot or drain after this
_APPLY_ROUNDS = 3
# The cause of a node lost with its ECS agent disconnected (no catalog rule can decide it:
# the diag cannot run on a node ECS cannot reach).
UNREACHABLE_RULE = "builtin:node-unreachable"
# A node that stays in one of these may be quarantined by that decision.
_UNREACHABLE_FROM = (InstanceState.AVAILABLE, InstanceState.SUSPECT)


def label_for(plan: RemediationPlan) -> SuspectVerdict:
    """What a waiting job records for the node once its decision is known."""
    action = plan.action
    if action not in NODE_ACTIONS:
        return SuspectVerdict.HEALTHY
    if action is Action.REBOOT:
        return SuspectVerdict.REBOOT if Effect.REBOOT in plan.execute else SuspectVerdict.BLOCKED
    if Effect.DRAIN not in plan.execute:
        return SuspectVerdict.BLOCKED
    return SuspectVerdict.OPERATOR_ACTION if action is Action.OPERATOR_ACTION else SuspectVerdict.REPLACE


def observed_node_effects(plan: RemediationPlan) -> tuple[Effect, ...]:
    """Node effects observe mode kept from happening (not those the breaker held back)."""
    if plan.blocked_by_breaker:
        return ()
    return tuple(e for e in plan.record_only if e in NODE_EFFECTS)


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


def unreachable_decided(job: Job, inst_id: str) -> bool:
    """The job's fault on ``inst_id`` (this attempt) was decided as an unreachable node."""
    stored = job.last_fault
    if stored.get("node") != inst_id or int(stored.get("attempt") or 0) != job.attempt:
        return False
    decision = (stored.get("plan") or {}).get("decision") or {}
    return decision.get("rule_id") == UNREACHABLE_RULE


def is_definitive(plan: Mapping[str, Any] | RemediationPlan | None) -> bool:
    """A stored (or fresh) plan that acts on the node without the DCGM diag (fast path)."""
    if plan is None:
        return False
    if isinstance(plan, RemediationPlan):
        return plan.action in NODE_ACTIONS and plan.decision.skip_health_check
    decision = plan.get("decision") or {}
    return plan.get("action") in {a.value for a in NODE_ACTIONS} and bool(decision.get("skip_health_check"))


def rebuild(evidence: Evidence, instance_item: Mapping[str, Any] | None, catalog: Any) -> Evidence:
    """The same fault's evidence with what the node agent reported since (late XIDs)."""
    fresh = build_evidence(
        node_id=evidence.node_id, fault_at=evidence.fault_at, trigger=evidence.trigger,
        instance_item=instance_item, job_id=evidence.job_id, attempt=evidence.attempt, rank=evidence.rank,
        exit_code=evidence.exit_code, stop_code=evidence.stop_code, stopped_reason=evidence.stopped_reason,
        catalog=catalog)
    return replace(fresh, dcgm=evidence.dcgm)


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


@dataclass(frozen=True)
class Applied:
    plan: RemediationPlan
    label: SuspectVerdict
    outcomes: list[tuple[Job, JobOutcome]]


class NodeRemediation:
    def __init__(self, deps: Deps, ranks: RankOperations, reboots: Reboots, restarts: GangRestart) -> None:
        self.deps = deps
        self.ranks = ranks
        self.reboots = reboots
        self.restarts = restarts
        self.notices = ranks.notices

    # ------------------------------------------------------------ evidence / plan
    @property
    def policy(self) -> Any:
        return self.deps.policy

    def evidence(self, *, inst_id: str, instance_item: Mapping[str, Any] | None, trigger: Trigger,
                 fault_at: float, job: Job | None = None, rank: int | None = None,
                 exit_code: int | None = None, stop_code: str = "", stopped_reason: str = "") -> Evidence:
        return build_evidence(
            node_id=inst_id, fault_at=fault_at, trigger=trigger, instance_item=instance_item,
            job_id=job.job_id if job else "", attempt=job.attempt if job else 0, rank=rank,
            exit_code=exit_code, stop_code=stop_code, stopped_reason=stopped_reason,
            catalog=self.policy.catalog)

    def plan(self, evidence: Evidence, instance_item: Mapping[str, Any] | None, *,
             now: float) -> RemediationPlan:
        history = history_from_item((instance_item or {}).get("fault_history"))
        return plan_remediation(evidence, self.policy, node_history=history, now=now)

    @staticmethod
    def fault_record(evidence: Evidence, plan: RemediationPlan, now: float,
                     label: SuspectVerdict | None = None, *, node: str = "",
                     attempt: int = 0) -> dict[str, Any]:
        record: dict[str, Any] = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict()}
        if label is not None:
            record["label"] = label.value
        if node:
            record.update(node=node, attempt=attempt)
        return record

    # ----------------------------------------------------------------- fast path
    def fast_path(self, job: Job, inst_id: str) -> str | None:
        """A pending suspect whose evidence is definitive: the node action without the
        DCGM diag. None when it does not apply (the instance is busy, the fresh evidence
        no longer says so): the caller opens (or joins) the health check instead."""
        suspect = self.deps.repo.faults.get_suspect(job.job_id, job.attempt, inst_id)
        stored = suspect.record if suspect is not None and suspect.pending else {}
        if not is_definitive(stored.get("plan")) or not stored.get("evidence"):
            return None
        for _ in range(_APPLY_ROUNDS):
            raw = self.deps.repo.get_instance_item(inst_id)
            if raw is None:
                return None
            instance = self.deps.repo.instance_from_item(raw)
            if instance.state not in (InstanceState.AVAILABLE, InstanceState.SUSPECT):
                return None
            now = clock.now()
            evidence = rebuild(Evidence.from_dict(stored["evidence"]), raw, self.policy.catalog)
            plan = self.plan(evidence, raw, now=now)
            if not is_definitive(plan):
                return None
            fresh = self.deps.repo.get_job(job.job_id)
            if fresh is None or fresh.attempt != job.attempt or fresh.state not in RECOVERING_JOB_STATES:
                return "moved_on"
            pending = self.deps.repo.faults.get_suspect(job.job_id, job.attempt, inst_id)
            if pending is None or not pending.pending:
                return "moved_on"
            applied = self.apply(instance, raw, plan, evidence, [fresh],
                                 from_states=(InstanceState.AVAILABLE, InstanceState.SUSPECT),
                                 findings={"verdict": "not run", "source": "fast path",
                                           "rule": plan.decision.rule_id, "reason": plan.decision.reason})
            if applied is not None:
                self.deps.metrics.add_metric("FastPathDecisions", "Count", 1)
                return f"fast_path_{plan.action.value}"
        return "raced"

    # ------------------------------------------------------- node unreachable
    def node_unreachable(self, job_id: str, attempt: int, inst_id: str, lost: list[Rank], lost_since: float,
                         why: str) -> str:
        """The heartbeat service's node lost too long with its ECS agent disconnected.

        One transaction: the node decision (quarantine through the breaker, or only recorded
        in observe mode), the node's history with the evidence, and the job NODE_LOST ->
        FAILED with its fault record; then the drain (its own intent, finished by the sweep)
        and the StopTask of every rank (intent per rank; ECS stops a rank on the lost node
        once its agent reconnects). A sweep that finds the job already FAILED by this
        decision asks the stops again (the lost ranks are stopped last, so they stay watched
        until every other one was asked). Returns failed | observed | converged |
        observed_before | moved_on | raced."""
        repo = self.deps.repo
        for _ in range(_APPLY_ROUNDS):
            job = repo.get_job(job_id)
            if job is None or job.attempt != attempt:
                return "moved_on"
            if job.state is JobState.FAILED and unreachable_decided(job, inst_id):
                if not self.policy.modes.executes(Effect.STOP_TASKS):
                    return "observed_before"
                self._stop_all(job, lost, job.last_error or why, reissue=True)
                return "converged"
            if job.state is not JobState.NODE_LOST:
                return "moved_on"
            raw = repo.get_instance_item(inst_id)
            now = clock.now()
            evidence = self.evidence(inst_id=inst_id, instance_item=raw, trigger=Trigger.NODE_LOST,
                                     fault_at=lost_since, job=job)
            history = history_from_item((raw or {}).get("fault_history"))
            plan = unreachable_plan(evidence, self.policy, history, now, why)
            observed = not self.policy.modes.executes(Effect.STOP_TASKS)
            instance = repo.instance_from_item(raw) if raw else None
            tripped, gate, breaker_update, decision = None, None, None, None
            after = instance or Instance(inst_id)
            if instance is not None and instance.state in _UNREACHABLE_FROM and not observed:
                plan, breaker_update, gate = self._ask_gate(plan, inst_id, [job], now)
                tripped = gate.tripped if gate is not None else None
                reason = self._unreachable_reason(why, plan)
                decision = self._node_decision(
                    plan, label_for(plan), instance, _UNREACHABLE_FROM, evidence, None,
                    self.history_with(history, plan, evidence, now), None, None, [], now, job_ids=[job_id],
                    gate=gate)
                after = projected(instance, decision)
            else:
                # Observe mode, or a node another decision owns (rebooting, in a health check,
                # quarantined already): the job fails, the node is left as it is.
                reason = self._unreachable_reason(why, plan)
                if not observed:
                    state = instance.state.value if instance is not None else "unknown to the loop"
                    reason += f"; node left {state} (another decision owns it)"
            last_fault = self.fault_record(evidence, plan, now, node=inst_id, attempt=attempt)
            failed = replace(job, state=JobState.FAILED, last_error=reason[:1000])
            notices = [self.reboots.gate.tripped_notice(tripped, inst_id) if tripped is not None else None,
                       self._cordon_notice(gate, inst_id, plan),
                       self._unreachable_notice(failed, after, plan, evidence, observed),
                       self._page_operator_notice(after, plan, evidence)
                       if plan.escalation.page_operator and not observed else None]
            owed = self.notices.owe(notices, now)
            if decision is not None and instance is not None:
                done = repo.record_node_decision(instance, decision, [], now, breaker_update,
                                                 also=[repo.lost_job_failure(job, reason, last_fault), *owed])
            else:
                done = repo.fail_lost_job(job, reason, last_fault, also=owed)
                if done and observed and raw is not None:
                    after_commit("observed fault", self._record_observed_unreachable, inst_id, job_id,
                                 self.history_with(history, plan, evidence, now), evidence, plan, now)
            if not done:
                continue
            logger.warning("node unreachable: job failed", extra={
                "job_id": job_id, "instance": inst_id, "execute": [e.value for e in plan.execute],
                "record_only": [e.value for e in plan.record_only]})
            self.notices.send(notices)
            self.deps.metrics.add_metric("Failures", "Count", 1)
            if tripped is not None:
                self.reboots.gate.tripped(tripped)
            after_commit("node unreachable", self._after_unreachable, gate, decision is not None, after, plan,
                         failed, lost, reason)
            return "observed" if observed else "failed"
        return "raced"

    def _record_observed_unreachable(self, inst_id: str, job_id: str, history: list[dict[str, Any]] | None,
                                     evidence: Evidence, plan: RemediationPlan, now: float) -> None:
        self.deps.repo.record_observed_fault(
            inst_id, fault_history=history,
            last_fault={"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": [job_id]})

    def _after_unreachable(self, gate: GateAnswer | None, decided: bool, after: Instance,
                           plan: RemediationPlan, failed: Job, lost: list[Rank], reason: str) -> None:
        """After the commit: the cordon's attribute, the drain, the ranks' stops."""
        repo = self.deps.repo
        inst_id = after.container_inst_id
        self._after_cordon(gate, inst_id)
        if decided:
            self.carry_out(repo.get_instance(inst_id) or after, plan)
        self._stop_all(repo.get_job(failed.job_id) or failed, lost, reason, reissue=False)

    @staticmethod
    def _unreachable_reason(why: str, plan: RemediationPlan) -> str:
        if observed_node_effects(plan) or Effect.STOP_TASKS in plan.record_only:
            return f"{why}; observe mode: would have done {', '.join(e.value for e in plan.record_only)}"
        if plan.blocked_by_breaker:
            return f"{why}; its quarantine held back by the blast-radius breaker"
        return why

    def _stop_all(self, job: Job, lost: list[Rank], why: str, *, reissue: bool) -> None:
        """StopTask of every live rank of the attempt (observe mode: none): the FAILED
        transition committed the intent; its fan-out is sent now, or by the sweep."""
        if job.stop_fanout and (not reissue or not job.stop_fanout.get("sent_at")):
            self.restarts.gang.stop(job)

    def _unreachable_notice(self, job: Job, instance: Instance, plan: RemediationPlan, evidence: Evidence,
                            observed: bool) -> Owed:
        details = details_of(evidence, plan)
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

    # ----------------------------------------------- faults without node action
    def record_fault_on_node(self, job: Job, inst_id: str, evidence: Evidence, plan: RemediationPlan, *,
                             spent: str = "") -> bool:
        """A fault that changed nothing on the node (a restart in place: application error
        or transient fault; a job failed without node action) joins the node's history, with
        a summary of its evidence (``spent``: the budget it cost the job, for the record), so
        escalation and the repeat rules see it. Its ``charged_job`` stays false: the flapping
        exemption is for node faults a remediation was meant to fix; a job that keeps
        failing the same way without node action must run out of budget.

        Called after the job's own commit; idempotent (the record's time is the fault's, a
        redelivered event finds it there) and conditional on the history read (a concurrent
        append is re-read, not overwritten). False: no node item, or no record to add."""
        if plan.node_record is None or plan.action in NODE_ACTIONS:
            return False
        repo = self.deps.repo
        summary = fault_summary(evidence)
        if spent:
            summary["spent"] = spent
        record = replace(plan.node_record, at=evidence.fault_at, job_id=job.job_id, charged_job=False,
                         evidence=summary)
        for _ in range(_APPLY_ROUNDS):
            raw = repo.get_instance_item(inst_id)
            if raw is None:
                return False
            history = history_from_item(raw.get("fault_history"))
            if any(r.at == record.at and r.cause == record.cause and r.job_id == record.job_id
                   for r in history):
                return True  # written by an earlier delivery
            now = clock.now()
            merged = history_to_item(record_fault(history, record, now, self.policy.escalation))
            last = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": [job.job_id]}
            if repo.record_node_fault(inst_id, fault_history=merged, last_fault=last,
                                      read_version=int(raw.get("fault_history_version") or 0)):
                return True
        return False

    # ------------------------------------------------------------------- apply
    def apply(self, instance: Instance, instance_item: Mapping[str, Any] | None, plan: RemediationPlan,
              evidence: Evidence, jobs: Iterable[Job], *, from_states: tuple[InstanceState, ...],
              hc_started_by: str | None = None, hc_jobs_count: int | None = None,
              findings: dict[str, Any] | None = None) -> Applied | None:
        """Commit the node decision with every waiting job's outcome, then carry it out.
        None when the commit lost a race (re-read and try again)."""
        repo = self.deps.repo
        inst_id = instance.container_inst_id
        now = clock.now()
        waiting = [j for j in jobs if j.state in RECOVERING_JOB_STATES]
        anywhere = Effect.TERMINATE in plan.execute and instance.is_managed_instance
        plan = self._for_this_node(plan, instance)
        plan, breaker_update, gate = self._ask_gate(plan, inst_id, waiting, now)
        tripped = gate.tripped if gate is not None else None
        label = label_for(plan)
        history = history_from_item((instance_item or {}).get("fault_history"))
        new_history = self.history_with(history, plan, evidence, now)
        verdicts = [self.job_verdict(job, inst_id, label, plan, evidence, findings or {}, history, now)
                    for job in waiting]
        decision = self._node_decision(plan, label, instance, from_states, evidence, findings, new_history,
                                       hc_started_by, hc_jobs_count, verdicts, now,
                                       job_ids=[v.job.job_id for v, _ in verdicts], gate=gate)
        after = projected(instance, decision)
        notices = self._decision_notices(after, plan, evidence, label, verdicts, gate, waiting=bool(waiting),
                                         anywhere=anywhere)
        if not repo.record_node_decision(instance, decision, [v for v, _ in verdicts], now, breaker_update,
                                         also=self.notices.owe(notices, now)):
            return None
        logger.info("node decision applied", extra={
            "instance": inst_id, "action": plan.action.value, "label": label.value,
            "execute": [e.value for e in plan.execute], "record_only": [e.value for e in plan.record_only],
            "rule": plan.decision.rule_id})
        self.notices.send(notices)
        if tripped is not None:
            self.reboots.gate.tripped(tripped)
        outcomes = [(v.job, o) for v, o in verdicts]
        self.deps.metrics.add_metric("Failures", "Count", sum(1 for _, o in outcomes if o.fails))

        # The reboot or drain has the instance's follow-up deadline, a restart its job's: the
        # sweep carries out whatever a failure here leaves.
        after_commit("node decision", self._after_decision, gate, instance, plan, decision.uncordon, outcomes)
        return Applied(plan, label, outcomes)

    def _after_decision(self, gate: GateAnswer | None, instance: Instance, plan: RemediationPlan,
                        uncordon: bool, outcomes: list[tuple[Job, JobOutcome]]) -> None:
        """After the commit: the cordon's attribute, the reboot or drain, the restarts."""
        inst_id = instance.container_inst_id
        self._after_cordon(gate, inst_id, uncordoned=uncordon and instance.cordoned)
        fresh = self.deps.repo.get_instance(inst_id) or instance
        self.carry_out(fresh, plan)
        for job, outcome in outcomes:
            # A healthy node may be the last one a job was waiting for; a job leaving an
            # unusable node moves now (once its old ranks stopped), not at the next sweep.
            if (outcome.restarts and (fresh.state is InstanceState.AVAILABLE
                                     or outcome is JobOutcome.RELOCATE)) or outcome is JobOutcome.HOLD:
                self.restarts.try_restart(job.job_id)

    def _decision_notices(self, after: Instance, plan: RemediationPlan, evidence: Evidence,
                          label: SuspectVerdict, verdicts: list[tuple[JobVerdict, JobOutcome]],
                          gate: GateAnswer | None, *, waiting: bool, anywhere: bool) -> list[Owed | None]:
        """Every e-mail a node decision owes, built before its commit (``after``: the
        instance as the decision leaves it)."""
        tripped = gate.tripped if gate is not None else None
        inst_id = after.container_inst_id
        notices: list[Owed | None] = []
        if tripped is not None:
            fates = {v.job.job_id: job_fate(o) for v, o in verdicts}
            notices.append(self.reboots.gate.tripped_notice(tripped, inst_id, fates))
        notices.append(self._cordon_notice(gate, inst_id, plan))
        for verdict, outcome in verdicts:
            job = replace(verdict.job, state=verdict.to,
                          last_error=verdict.last_error or verdict.job.last_error)
            notices.append(self.outcome_notice(job, outcome, after, plan, evidence, label))
        if plan.escalation.page_operator:
            notices.append(self._page_operator_notice(after, plan, evidence))
        elif anywhere or (plan.action is Action.OPERATOR_ACTION and not waiting):
            notices.append(self._operator_notice(after, plan, evidence))
        elif observed_node_effects(plan) and not any(o.fails for _, o in verdicts):
            # Observe mode for node effects (e.g. reboot=observe) while the job moved on:
            # no job e-mail said what the node would have had.
            notices.append(self._observed_notice(after, plan, evidence))
        return notices

    def _for_this_node(self, plan: RemediationPlan, instance: Instance) -> RemediationPlan:
        """ECS Anywhere (``mi-``) nodes are not in an Auto Scaling group: quarantine them."""
        if Effect.TERMINATE in plan.execute and instance.is_managed_instance:
            return replace(plan, execute=tuple(e for e in plan.execute if e is not Effect.TERMINATE))
        return plan

    def history_with(self, history: Iterable[NodeFaultRecord], plan: RemediationPlan,
                     evidence: Evidence | None, now: float) -> list[dict[str, Any]] | None:
        """The node's history with this decision (and a summary of its evidence) added."""
        if plan.node_record is None:
            return None
        record = replace(plan.node_record, evidence=fault_summary(evidence))
        return history_to_item(record_fault(history, record, now, self.policy.escalation))

    def _node_decision(self, plan: RemediationPlan, label: SuspectVerdict, instance: Instance,
                       from_states: tuple[InstanceState, ...], evidence: Evidence,
                       findings: dict[str, Any] | None, history: list[dict[str, Any]] | None,
                       hc_started_by: str | None, hc_jobs_count: int | None,
                       verdicts: list[tuple[JobVerdict, JobOutcome]], now: float, *,
                       job_ids: list[str], gate: GateAnswer | None = None) -> NodeDecision:
        why = f"{plan.action.value}: {plan.decision.reason}"
        last_fault = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": job_ids}
        to: InstanceState | None
        blocked = None
        if Effect.REBOOT in plan.execute:
            to = InstanceState.REBOOTING
        elif Effect.DRAIN in plan.execute:
            to = InstanceState.QUARANTINED
        elif plan.blocked_by_breaker:
            to = InstanceState.SUSPECT
            # What the release of the backlog may do: never terminate a node escalation said
            # to quarantine only (a person looks at it first).
            blocked = {"action": plan.action.value, "at": now, "reason": plan.breaker_reason[:300],
                       "rule": plan.decision.rule_id, "jobs": job_ids,
                       "quarantine_only": plan.escalation.quarantine_only}
        else:
            # Nothing done to the node: a health check leaves it as it found it; a fast
            # path (observe mode) leaves its state alone.
            to = InstanceState.AVAILABLE if InstanceState.HEALTH_CHECKING in from_states else None
        restart_jobs = tuple(v.job.job_id for v, o in verdicts
                             if o in (JobOutcome.RESTART_AFTER_REBOOT, JobOutcome.HOLD)
                             and label is SuspectVerdict.REBOOT)
        follow_up = to in (InstanceState.REBOOTING, InstanceState.QUARANTINED)
        # Known bad and not drained: cordoned (whatever the breaker or observe mode said);
        # a diag that passed clears a cordon the node had.
        cordon = gate.cordon_record(cause=plan.decision.rule_id, reason=plan.decision.reason, now=now) \
            if gate is not None and to is not InstanceState.QUARANTINED else None
        uncordon = plan.action not in NODE_ACTIONS and InstanceState.HEALTH_CHECKING in from_states
        return NodeDecision(
            from_states=from_states, to=to, findings=findings, fault_history=history, last_fault=last_fault,
            quarantine_reason=why if to is InstanceState.QUARANTINED else "",
            reboot_reason=why if to is InstanceState.REBOOTING else "",
            terminate=Effect.TERMINATE in plan.execute, breaker_blocked=blocked,
            hc_started_by=hc_started_by, hc_jobs_count=hc_jobs_count, restart_jobs=restart_jobs,
            follow_up_at=now + FOLLOW_UP_SECONDS if follow_up else None, cordon=cordon, uncordon=uncordon)

    # -------------------------------------------------------------- job outcome
    def job_verdict(self, job: Job, inst_id: str, label: SuspectVerdict, plan: RemediationPlan | None,
                    evidence: Evidence | None, findings: dict[str, Any], history: Iterable[NodeFaultRecord],
                    now: float) -> tuple[JobVerdict, JobOutcome]:
        """What the node's decision does to one waiting job: its verdict for the node, its
        outcome (from the fault's tally with this verdict counted), and the budget it spends
        (once per fault; a flapping node's repeat is not charged again)."""
        infra_hint = (label is SuspectVerdict.HEALTHY and plan is not None
                      and plan.decision.budget is Budget.INFRASTRUCTURE)
        # A reboot the breaker held back: a job that cannot move waits for the reset (HOLD).
        held = (label is SuspectVerdict.BLOCKED and plan is not None and plan.blocked_by_breaker
                and plan.action is Action.REBOOT and self.deps.settings.held_job_deadline_seconds > 0)
        tally = job.tally.with_verdict(label, held=held)
        if infra_hint:
            tally = replace(tally, infra=tally.infra + 1)
        outcome = tally.outcome(relocatable=bool(tally.fatal) and self.restarts.relocatable(job))
        reason = f"verdict {label.value} on {inst_id}" + (f" ({plan.action.value}, rule "
                                                          f"{plan.decision.rule_id})" if plan else "")
        kind = Budget.INFRASTRUCTURE
        if outcome == JobOutcome.RESTART:
            kind = plan.decision.budget if plan and plan.decision.budget is not Budget.NONE \
                else (Budget.INFRASTRUCTURE if tally.infra else Budget.APPLICATION)
        charge = True
        if plan is not None and kind is Budget.INFRASTRUCTURE and (outcome.restarts
                                                                    or outcome is JobOutcome.HOLD):
            charge = charges_job(history, job.job_id, plan.decision.cause, now, self.policy.escalation)
        settled = self._settle(job, outcome, kind, charge, inst_id, label, plan, reason)
        waits = settled.outcome in (JobOutcome.RESTART_AFTER_REBOOT, JobOutcome.HOLD) \
            and label is SuspectVerdict.REBOOT and settled.to is not JobState.FAILED
        record = None
        if evidence is not None and plan is not None:
            record = self.fault_record(evidence, plan, now, label)
        verdict = JobVerdict(job=job, to=settled.to, label=label, findings=findings, last_error=settled.error,
                             spend=settled.spend, deadline_at=settled.deadline_at(now), record=record,
                             relocate=(settled.outcome == JobOutcome.RELOCATE
                                       and settled.to is not JobState.FAILED),
                             restart_reason=settled.restart_reason, reason=settled.reason,
                             waits_for_reboot=waits,
                             infra_hint=infra_hint, held=held, hold_spend=settled.hold_spend)
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
        ended (so before the suspects were counted): the job restarts without node action,
        budget permitting."""
        if job.state is not JobState.PENDING_HEALTHCHECK or not job.tally.all_decided:
            return "waiting"
        outcome = job.tally.outcome(relocatable=bool(job.tally.fatal) and self.restarts.relocatable(job))
        if outcome is JobOutcome.WAIT:
            return "waiting"
        kind = Budget.INFRASTRUCTURE if job.tally.infra else Budget.APPLICATION
        where = f"{job.tally.total} suspect node(s)"
        settled = self._settle(job, outcome, kind, True, where, None, None,
                               f"every verdict in: {where} healthy")
        now = clock.now()
        notice = None
        if settled.outcome.fails:
            app_error = settled.outcome is JobOutcome.FAIL_APPLICATION_ERROR
            kind_ = (NotificationKind.APPLICATION_ERROR if app_error
                     else NotificationKind.OBSERVED if settled.outcome is JobOutcome.FAIL_OBSERVED
                     else NotificationKind.FAILED)
            failed = replace(job, state=JobState.FAILED, last_error=settled.error or job.last_error)
            notice = self.notices.for_job(
                failed, None, kind_, "Job failed: application error (GPUs healthy)"
                if kind_ is NotificationKind.APPLICATION_ERROR else "Job failed",
                what_happened=failed.last_error, what_was_done="Job marked FAILED",
                operator_action="Look at the job's logs: the GPUs passed DCGM diagnostics.")
        if not self.deps.repo.conclude_fault(job, settled.to, reason=settled.reason, error=settled.error,
                                             spend=settled.spend, restart_reason=settled.restart_reason,
                                             deadline_at=settled.deadline_at(now),
                                             also=self.notices.owe([notice], now)):
            return "raced"
        if settled.outcome.fails:
            self.notices.send([notice])
            self.deps.metrics.add_metric("Failures", "Count", 1)
            return "failed"
        after_commit("restart", self.restarts.try_restart, job.job_id)
        return "restart"

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

    # ------------------------------------------------------------------ breaker
    def _ask_gate(self, plan: RemediationPlan, inst_id: str, jobs: list[Job],
                  now: float) -> tuple[RemediationPlan, Any, GateAnswer | None]:
        """The breaker, for a node action about to be carried out; the cordon limit, for a
        node found bad (a node action decided) that will not be drained."""
        known_bad = plan.action in NODE_ACTIONS
        if not plan.needs_breaker and not known_bad:
            return plan, None, None
        answer = self.reboots.gate.decide(
            node=inst_id, action=plan.action.value if plan.needs_breaker else None,
            job_ids=[j.job_id for j in jobs], reason=plan.decision.reason, now=now,
            cordon_unless_drained=known_bad, drains_if_allowed=Effect.DRAIN in plan.execute)
        if answer.breaker is not None:
            plan = plan.with_breaker(answer.breaker)
        return plan, answer.update, answer

    def cordon_only(self, inst_id: str, plan: RemediationPlan) -> bool:
        """A node found bad by a decision that changes nothing else on it (observe mode for
        the whole fault): it takes no new work all the same. One transaction: its cordon,
        the worklist, the cordon limit's state. Idempotent (a node already cordoned for the
        same cause is left as it is)."""
        if plan.action not in NODE_ACTIONS:
            return False
        repo = self.deps.repo
        for _ in range(_APPLY_ROUNDS):
            instance = repo.get_instance(inst_id)
            if instance is None:
                return False
            if instance.cordoned and instance.cordon.get("cause") == plan.decision.rule_id:
                return True
            now = clock.now()
            answer = self.reboots.gate.decide(node=inst_id, action=None, job_ids=(), now=now,
                                              reason=plan.decision.reason, cordon_unless_drained=True)
            record = answer.cordon_record(cause=plan.decision.rule_id, reason=plan.decision.reason, now=now)
            notice = self._cordon_notice(answer, inst_id, plan)
            if record is None or not repo.cordons.cordon(inst_id, record, now, answer.update,
                                                         also=self.notices.owe([notice], now)):
                continue
            self.notices.send([notice])
            after_commit("cordon", self._after_cordon, answer, inst_id)
            return True
        return False

    def _cordon_notice(self, gate: GateAnswer | None, inst_id: str, plan: RemediationPlan) -> Owed | None:
        """The loud e-mail when this decision trips the cordon limit (owed with it)."""
        if gate is None or gate.cordon is None or not gate.cordon.tripped_now:
            return None
        return self.reboots.cordons.limit_tripped_notice(gate.cordon, inst_id,
                                                         f"{plan.action.value}: {plan.decision.reason}")

    def _after_cordon(self, gate: GateAnswer | None, inst_id: str, *, uncordoned: bool = False) -> None:
        """After the commit: the ECS attribute (the sweep finishes it)."""
        cordoned = gate is not None and gate.cordon is not None
        if cordoned and gate is not None and gate.cordon is not None and gate.cordon.tripped_now:
            self.reboots.cordons.limit_tripped(gate.cordon, inst_id)
        if cordoned or uncordoned:
            self.reboots.cordons.sync_quietly(inst_id)

    def cluster_gpu_nodes(self) -> int:
        """GPU container instances of the cluster (ACTIVE or DRAINING), cached a minute."""
        return self.reboots.gate.cluster_gpu_nodes()

    # ------------------------------------------------------------------ effects
    def carry_out(self, instance: Instance, plan: RemediationPlan | None = None) -> None:
        """Reboot or drain (then terminate) as the committed instance state says."""
        if instance.state is InstanceState.REBOOTING:
            self.reboots.issue(instance)
        elif instance.state is InstanceState.QUARANTINED and (instance.drain_pending
                                                               or instance.terminate_pending):
            self.reboots.quarantine(instance)

    # ------------------------------------------------------------ notifications
    def outcome_notice(self, job: Job, outcome: JobOutcome, instance: Instance, plan: RemediationPlan | None,
                       evidence: Evidence | None, label: SuspectVerdict | None) -> Owed | None:
        """The e-mail of a job's outcome (None: it owes none), built before the decision's
        commit: ``job`` and ``instance`` as the decision leaves them, ``label`` the job's
        verdict for the node."""
        if not outcome.fails:
            return None
        details = details_of(evidence, plan)
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

    def _page_operator_notice(self, instance: Instance, plan: RemediationPlan, evidence: Evidence) -> Owed:
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


def projected(instance: Instance, decision: NodeDecision) -> Instance:
    """The instance as ``decision`` leaves it (what its e-mails, built before the commit, say)."""
    to = decision.to or instance.state
    acted = to in (InstanceState.REBOOTING, InstanceState.QUARANTINED)
    return replace(instance, state=to,
                   drain_pending=instance.drain_pending or to is InstanceState.QUARANTINED,
                   terminate_pending=decision.terminate if to is InstanceState.QUARANTINED
                   else instance.terminate_pending,
                   breaker_blocked=decision.breaker_blocked or ({} if acted else instance.breaker_blocked))


def job_fate(outcome: JobOutcome) -> str:
    """What a node decision held back by the breaker did to a job, for the trip e-mail."""
    if outcome is JobOutcome.HOLD:
        return "waits HELD for the reset, not failed, budget not charged"
    if outcome is JobOutcome.RELOCATE:
        return "moves to healthy nodes"
    if outcome.fails:
        return f"failed: {outcome.value.removeprefix('fail_').replace('_', ' ')}"
    return "waits for its other nodes"


def budgets_of(job: Job) -> JobBudgets:
    def clamp(value: int) -> int:
        return max(0, min(20, value))
    return JobBudgets(max_infra_recoveries=clamp(job.max_recovery_attempts),
                      infra_recoveries_used=max(0, job.recoveries_used),
                      max_app_restarts=clamp(job.max_app_restarts),
                      app_restarts_used=max(0, job.app_restarts_used))


def details_of(evidence: Evidence | None, plan: RemediationPlan | None) -> list[str]:
    lines = evidence.render_lines() if evidence is not None else []
    return lines + (plan.render_lines() if plan is not None else [])


def describe_node_effects(instance: Instance, plan: RemediationPlan | None) -> str:
    node = instance.container_inst_id
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
