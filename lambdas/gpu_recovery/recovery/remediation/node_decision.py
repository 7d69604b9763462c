"""The node decision: plan, gate, commit, carry out.

A *node decision* is the answer to "what does this node need": a health check's verdict
(after the DCGM diag), or a definitive fault without one (the catalog's fast path, e.g.
XID 79). Both go through :meth:`NodeRemediation.apply`:

1. **plan** — evidence -> catalog decision -> the node's escalation (reboot -> replace,
   quarantine + page) -> the effects to carry out and those only recorded (observe mode);
2. **gate** — a reboot / replacement / quarantine asks the blast-radius breaker first
   (``recovery.breaker.gate``); when it is tripped the node's effects are only recorded
   and kept in its backlog;
3. **commit** — one transaction (``repository.node_decisions``): the breaker's state
   (conditional on its version), the instance (new state, bounded fault history, the
   evidence), every waiting job (its verdict for this node, its outcome, its budget:
   ``job_settlement``) and the e-mails owed (``notices``); a lost race writes nothing;
4. **carry out** — after the commit (``ports.after_commit``): reboot / drain / terminate
   through their own crash-consistent intents (a deadline on the instance lets the sweep
   finish them if this delivery dies), then the e-mails and the restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain import cordon as cordon_policy
from gpu_recovery.domain.breaker import causes
from gpu_recovery.domain.escalation import (
    NodeFaultRecord,
    fault_summary,
    history_from_item,
    history_to_item,
    record_fault,
    stored_history_with,
)
from gpu_recovery.domain.evidence import Evidence, build_evidence
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Trigger
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.policy import JobOutcome
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import (
    NODE_EFFECTS,
    RemediationPlan,
    RemediationPolicy,
    plan_remediation,
)
from gpu_recovery.domain.states import RECOVERING_JOB_STATES, InstanceState, SuspectVerdict
from gpu_recovery.recovery.breaker.gate import GateAnswer, NodeActionGate
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.gpu_resets import GpuResets
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import MetricsPort, after_commit
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.recovery.reactions import Reactions, RestartDue
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.remediation.job_settlement import JobSettlement
from gpu_recovery.recovery.remediation.notices import RemediationNotices
from gpu_recovery.recovery.remediation.tenant_evidence import TenantEvidence
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsNodeItems, RecordsNodeDecisions
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.node_decisions import JobVerdict, NodeDecision, SuspectFlag

logger = logging.getLogger(__name__)

FOLLOW_UP_SECONDS = 60  # the sweep finishes a decision's reboot or drain after this
APPLY_ROUNDS = 3  # a decision whose commit lost a race is read and decided again


def label_for(plan: RemediationPlan) -> SuspectVerdict:
    """What a waiting job records for the node once its decision is known."""
    action = plan.action
    if action not in NODE_ACTIONS:
        return SuspectVerdict.HEALTHY
    if action is Action.REBOOT:
        return SuspectVerdict.REBOOT if Effect.REBOOT in plan.execute else SuspectVerdict.BLOCKED
    if action is Action.RESET_GPU:
        # A reset is waited for as a reboot (restart once the node is back; a failed reset
        # becomes the reboot itself: recovery.gpu_resets).
        return SuspectVerdict.REBOOT if Effect.RESET_GPU in plan.execute else SuspectVerdict.BLOCKED
    if Effect.DRAIN not in plan.execute:
        return SuspectVerdict.BLOCKED
    return SuspectVerdict.OPERATOR_ACTION if action is Action.OPERATOR_ACTION else SuspectVerdict.REPLACE


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
    return replace(fresh, dcgm=evidence.dcgm, preflight=evidence.preflight)


def projected(instance: Instance, decision: NodeDecision) -> Instance:
    """The instance as ``decision`` leaves it (what its e-mails, built before the commit, say)."""
    to = decision.to or instance.state
    acted = to in (InstanceState.REBOOTING, InstanceState.QUARANTINED)
    return replace(instance, state=to,
                   reset_pending=decision.reset if to is InstanceState.REBOOTING else instance.reset_pending,
                   drain_pending=instance.drain_pending or to is InstanceState.QUARANTINED,
                   terminate_pending=decision.terminate if to is InstanceState.QUARANTINED
                   else instance.terminate_pending,
                   breaker_blocked=decision.breaker_blocked or ({} if acted else instance.breaker_blocked),
                   suspect_origin=decision.suspect.origin if decision.suspect else instance.suspect_origin)


@dataclass(frozen=True)
class Observed:
    """A fault observed only, on its node (:meth:`NodeRemediation.observed`): ``updates`` for the
    transaction of the decision that observed it, the e-mails they owe (``notices``), and the
    cordon limit's answer (``gate``: after the commit, :meth:`NodeRemediation.after_cordon`
    puts the attribute; None: no cordon written)."""

    updates: list[Update]
    notices: list[Owed | None]
    gate: GateAnswer | None = None


@dataclass(frozen=True)
class Applied:
    plan: RemediationPlan
    label: SuspectVerdict
    outcomes: list[tuple[Job, JobOutcome]]


class DecisionJobs(Protocol):
    """The jobs a node's decision settles."""

    def get_job(self, job_id: str) -> Job | None: ...
    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...


class DecisionNodes(ReadsNodeItems, Protocol):
    """The node decided: read, its fault history, a fault observed only."""

    def get_instance(self, container_inst_id: str) -> Instance | None: ...
    def record_node_fault(self, inst_id: str, *, fault_history: list[dict[str, Any]],
                          last_fault: dict[str, Any] | None, read_version: int) -> bool: ...
    def observed_fault_updates(self, inst_id: str, *, fault_history: list[dict[str, Any]] | None,
                               last_fault: dict[str, Any], cordon: Mapping[str, Any] | None = None,
                               version: float = 0.0) -> list[Update]: ...


class DecisionData(HasJobs[DecisionJobs], HasInstances[DecisionNodes], RecordsNodeDecisions, Protocol):
    """The node (its item, its fault history), the suspects and jobs its decision settles, the
    decision's one transaction, and the holds it may cordon the node by."""

    faults: FaultRepository
    cordons: CordonRepository


@dataclass(eq=False, repr=False)
class NodeRemediation:
    """The node decision; built by the composition root with the stages it hands over to: the
    jobs' settlement, the GPU reset, the tenant-evidence clearances, and the e-mails it owes."""

    data: DecisionData
    ranks: RankOperations
    reboots: Reboots
    gate: NodeActionGate
    cordons: Cordons
    notices: Notices  # the outbox
    owed_notices: RemediationNotices
    settlement: JobSettlement
    resets: GpuResets
    tenant_evidence: TenantEvidence
    _: KW_ONLY
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    # Told: a verdict lets a job restart (or leave its node).
    reactions: Reactions = field(default_factory=Reactions)

    # ------------------------------------------------------------ evidence / plan

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

    # ----------------------------------------------------------------- fast path
    def fast_path(self, job: Job, inst_id: str) -> str | None:
        """A pending suspect whose evidence is definitive: the node action without the
        DCGM diag. None when it does not apply (the instance is busy, the fresh evidence
        no longer says so): the caller opens (or joins) the health check instead."""
        suspect = self.data.faults.get_suspect(job.job_id, job.attempt, inst_id)
        stored = suspect.record if suspect is not None and suspect.pending else {}
        if not is_definitive(stored.get("plan")) or not stored.get("evidence"):
            return None
        for _ in range(APPLY_ROUNDS):
            raw = self.data.instances.get_instance_item(inst_id)
            if raw is None:
                return None
            instance = self.data.instances.instance_from_item(raw)
            if instance.state not in (InstanceState.AVAILABLE, InstanceState.SUSPECT):
                return None
            now = clock.now()
            evidence = rebuild(Evidence.from_dict(stored["evidence"]), raw, self.policy.catalog)
            plan = self.plan(evidence, raw, now=now)
            if not is_definitive(plan):
                return None
            fresh = self.data.jobs.get_job(job.job_id)
            if fresh is None or fresh.attempt != job.attempt or fresh.state not in RECOVERING_JOB_STATES:
                return "moved_on"
            pending = self.data.faults.get_suspect(job.job_id, job.attempt, inst_id)
            if pending is None or not pending.pending:
                return "moved_on"
            applied = self.apply(instance, raw, plan, evidence, [fresh],
                                 from_states=(InstanceState.AVAILABLE, InstanceState.SUSPECT),
                                 findings={"verdict": "not run", "source": "fast path",
                                           "rule": plan.decision.rule_id, "reason": plan.decision.reason})
            if applied is not None:
                self.metrics.add_metric("FastPathDecisions", "Count", 1)
                return f"fast_path_{plan.action.value}"
        return "raced"

    # ------------------------------------------------------------------- apply
    def apply(self, instance: Instance, instance_item: Mapping[str, Any] | None, plan: RemediationPlan,
              evidence: Evidence, jobs: Iterable[Job], *, from_states: tuple[InstanceState, ...],
              hc_started_by: str | None = None, hc_jobs_count: int | None = None,
              findings: dict[str, Any] | None = None,
              node_notice: Callable[[Instance, RemediationPlan], Owed | None] | None = None,
              warning_rule: str = "", suspect: SuspectFlag | None = None) -> Applied | None:
        """Commit the node decision with every waiting job's outcome, then carry it out.
        None when the commit lost a race (re-read and try again). ``node_notice``: one more
        e-mail about the node, built with it as the decision leaves it; ``warning_rule``: the
        decision answers the node's driver warning (``recovery.warnings``)."""
        repo = self.data
        inst_id = instance.container_inst_id
        if not instance.ec2_instance_id and any(e in NODE_EFFECTS for e in plan.execute):
            # Registration leaves the id out (no DescribeContainerInstances per rank): what the
            # node is (EC2 or ECS Anywhere) decides an action on the node, so look it up once
            # now. A verdict that leaves the node alone (a cascade's healthy peers, hundreds
            # ending at once) needs none.
            instance = replace(instance, ec2_instance_id=self.ranks.ec2_instance_id(instance))
        now = clock.now()
        # Each job's tally with the verdicts counted on its shards: this verdict may be the last.
        waiting = [repo.faults.counted(j) for j in jobs if j.state in RECOVERING_JOB_STATES]
        anywhere = Effect.TERMINATE in plan.execute and instance.is_managed_instance
        plan = self._for_this_node(plan, instance)
        cause = causes.cause_of(evidence, [j.job_id for j in waiting])
        plan, breaker_update, gate = self.ask_gate(plan, inst_id, waiting, now, cause=cause)
        tripped = gate.tripped if gate is not None else None
        label = label_for(plan)
        history = history_from_item((instance_item or {}).get("fault_history"))
        new_history = self.history_with(history, plan, evidence, now)
        verdicts = [self.settlement.job_verdict(job, inst_id, label, plan, evidence, findings or {}, history,
                                                now) for job in waiting]
        decision = self.node_decision(plan, label, instance, from_states, evidence, findings, new_history,
                                      hc_started_by, hc_jobs_count, verdicts, now,
                                      job_ids=[v.job.job_id for v, _ in verdicts], gate=gate, suspect=suspect)
        if warning_rule and decision.to not in (InstanceState.REBOOTING, InstanceState.QUARANTINED):
            decision = replace(decision, warning_decided=True)
        after = projected(instance, decision)
        notices = self.owed_notices.decision_notices(after, plan, evidence, label, verdicts, gate,
                                                     waiting=bool(waiting), anywhere=anywhere)
        if node_notice is not None:
            notices.append(node_notice(after, plan))
        # A suspect the stack's own check cleared: counted per evidence source, and per job and
        # user when the evidence was the tenant's, with the decision (issue 49). A check that
        # gave no verdict cleared nothing: the tenant's word is not judged by a missing answer.
        clearance = None if plan.undiagnosed else self.tenant_evidence.clearance(evidence, label, from_states)
        also = self.notices.owe(notices, now)
        if clearance is not None:
            also += [*clearance.updates, *self.notices.owe([clearance.notice], now)]
        if not repo.decisions.record(instance, decision, [v for v, _ in verdicts], now, breaker_update,
                                     also=also):
            return None
        # Healthy verdicts that only count, on their tally shards before anyone settles the
        # job (a failure here is counted by the sweep: FaultRepository.recount).
        after_commit("healthy verdicts counted", repo.decisions.count_healthy_verdicts, inst_id,
                     [v for v, _ in verdicts])
        after_commit("cleared suspect counted", self.tenant_evidence.counted, clearance, evidence.job_id)
        logger.info("node decision applied", extra={
            "instance": inst_id, "action": plan.action.value, "label": label.value,
            "execute": [e.value for e in plan.execute], "record_only": [e.value for e in plan.record_only],
            "rule": plan.decision.rule_id})
        self.notices.send(notices)
        if tripped is not None:
            self.gate.tripped(tripped)
        outcomes = [(v.job, o) for v, o in verdicts]
        self.metrics.add_metric("Failures", "Count", sum(1 for _, o in outcomes if o.fails))
        for failed in (job for job, outcome in outcomes if outcome.fails):
            ended(self.metrics, self.data.jobs, failed.job_id, True)

        # The reboot or drain has the instance's follow-up deadline, a restart its job's: the
        # sweep carries out whatever a failure here leaves.
        after_commit("node decision", self._after_decision, gate, instance, plan, decision.uncordon, outcomes,
                     decision.cordon is not None)
        return Applied(plan, label, outcomes)

    def _after_decision(self, gate: GateAnswer | None, instance: Instance, plan: RemediationPlan,
                        uncordon: bool, outcomes: list[tuple[Job, JobOutcome]],
                        cordoned: bool = False) -> None:
        """After the commit: the cordon's attribute first (a node judged bad is off every
        scheduler before anything else is tried: a failure of any later step leaves it
        cordoned), then the reboot or drain, the restarts. Each has its own intent in the
        committed state: the sweep finishes what fails here, the cordon at its very next run
        (it works the attribute worklist before anything else)."""
        inst_id = instance.container_inst_id
        self.after_cordon(gate, inst_id, uncordoned=uncordon and instance.cordoned, cordoned=cordoned)
        fresh = self.data.instances.get_instance(inst_id) or instance
        self.carry_out(fresh, plan)
        for job, outcome in outcomes:
            # A healthy node may be the last one a job was waiting for; a job leaving an
            # unusable node moves now (once its old ranks stopped), not at the next sweep.
            if (outcome.restarts and (fresh.state is InstanceState.AVAILABLE
                                     or outcome is JobOutcome.RELOCATE)) or outcome is JobOutcome.HOLD:
                self.reactions.emit(RestartDue(job.job_id))
            elif outcome is JobOutcome.WAIT:
                # Counted off the job item, or beside another verdict committing at once:
                # with every count added, this may have been the last one.
                self.settlement.settle_counted(job.job_id)

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

    def node_decision(self, plan: RemediationPlan, label: SuspectVerdict, instance: Instance,
                      from_states: tuple[InstanceState, ...], evidence: Evidence,
                      findings: dict[str, Any] | None, history: list[dict[str, Any]] | None,
                      hc_started_by: str | None, hc_jobs_count: int | None,
                      verdicts: list[tuple[JobVerdict, JobOutcome]], now: float, *,
                      job_ids: list[str], gate: GateAnswer | None = None,
                      suspect: SuspectFlag | None = None) -> NodeDecision:
        why = f"{plan.action.value}: {plan.decision.reason}"
        # A check ends here (a verdict, or none to be had: a check that could not start).
        checked = bool({InstanceState.HEALTH_CHECKING, InstanceState.HEALTH_CHECK_PENDING} & set(from_states))
        last_fault = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": job_ids}
        to: InstanceState | None
        blocked = None
        reset = Effect.RESET_GPU in plan.execute
        if Effect.REBOOT in plan.execute or reset:
            to = InstanceState.REBOOTING  # a reset first (recovery.gpu_resets), else the reboot
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
            to = InstanceState.AVAILABLE if checked else None
        flag = suspect if to is InstanceState.AVAILABLE else None
        if flag is not None:
            to = InstanceState.SUSPECT  # a suspect for the stack's own check (the flag's origin)
        restart_jobs = tuple(v.job.job_id for v, o in verdicts
                             if o in (JobOutcome.RESTART_AFTER_REBOOT, JobOutcome.HOLD)
                             and label is SuspectVerdict.REBOOT)
        follow_up = to in (InstanceState.REBOOTING, InstanceState.QUARANTINED)
        # Known bad: cordoned (whatever the breaker or observe mode said); a diag that passed
        # clears a cordon the node had. A node to be drained is cordoned too, until ECS has
        # its DRAINING (``record_drained`` clears it): the drain is a call after the commit
        # that may fail (or a read before it), and meanwhile its free GPUs would take other
        # schedulers' work. Not counted by the cordon limit: the breaker allowed the drain.
        cordon = gate.cordon_record(cause=plan.decision.rule_id, reason=plan.decision.reason, now=now) \
            if gate is not None and to is not InstanceState.QUARANTINED else None
        if to is InstanceState.QUARANTINED:
            cordon = cordon_policy.cordon_record(cause=plan.decision.rule_id, reason=plan.decision.reason,
                                                 now=now, ecs=cordon_policy.ECS_PENDING)
        uncordon = plan.action not in NODE_ACTIONS and checked
        return NodeDecision(
            from_states=from_states, to=to, findings=findings, fault_history=history, last_fault=last_fault,
            quarantine_reason=why if to is InstanceState.QUARANTINED else "",
            reboot_reason=why if to is InstanceState.REBOOTING else "",
            terminate=Effect.TERMINATE in plan.execute, breaker_blocked=blocked,
            hc_started_by=hc_started_by, hc_jobs_count=hc_jobs_count, restart_jobs=restart_jobs,
            follow_up_at=now + FOLLOW_UP_SECONDS if follow_up else (flag.look_at if flag else None),
            cordon=cordon, uncordon=uncordon, reset=reset, suspect=flag)

    # ------------------------------------------------------------ gate, cordon
    def ask_gate(self, plan: RemediationPlan, inst_id: str, jobs: list[Job], now: float,
                 cause: Mapping[str, str] | None = None) -> tuple[RemediationPlan, Any, GateAnswer | None]:
        """The breaker, for a node action about to be carried out; the cordon limit, for a
        node found bad (a node action decided) that will not be drained."""
        known_bad = plan.action in NODE_ACTIONS
        if not plan.needs_breaker and not known_bad:
            return plan, None, None
        answer = self.gate.decide(
            node=inst_id, action=plan.action.value if plan.needs_breaker else None,
            job_ids=[j.job_id for j in jobs], reason=plan.decision.reason, now=now,
            cordon_unless_drained=known_bad, drains_if_allowed=Effect.DRAIN in plan.execute, cause=cause)
        if answer.breaker is not None:
            plan = plan.with_breaker(answer.breaker)
        return plan, answer.update, answer

    def observed(self, inst_id: str, instance_item: Mapping[str, Any] | None, plan: RemediationPlan,
                 evidence: Evidence, job_ids: list[str], now: float) -> Observed:
        """Observe mode for the whole fault (nothing done to the node): the node's last fault
        and history with what would have been done and, found bad (a node action decided), its
        cordon with the cordon limit's state and e-mail, all built before the decision that
        observed it commits and written in its transaction (:class:`Observed`): a delivery that
        dies after that commit leaves the node cordoned (the sweep syncs its attribute from the
        worklist). Nothing for a node the loop does not know; a node already cordoned for the
        same cause keeps its cordon as it is."""
        if instance_item is None:
            return Observed([], [])
        history = None
        if plan.node_record is not None:
            history = stored_history_with(instance_item.get("fault_history"), plan.node_record, now,
                                          self.policy.escalation)
        last_fault = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": job_ids}
        instance = self.data.instances.instance_from_item(instance_item)
        gate, record = None, None
        if plan.action in NODE_ACTIONS and not (instance.cordoned
                                                and instance.cordon.get("cause") == plan.decision.rule_id):
            # Known bad all the same: no new work on it (domain.cordon).
            gate = self.gate.decide(node=inst_id, action=None, job_ids=(), now=now,
                                    reason=plan.decision.reason, cordon_unless_drained=True)
            record = gate.cordon_record(cause=plan.decision.rule_id, reason=plan.decision.reason, now=now)
        updates = self.data.instances.observed_fault_updates(inst_id, fault_history=history,
                                                             last_fault=last_fault, cordon=record,
                                                             version=now)
        if record is None or gate is None:
            return Observed(updates, [])
        return Observed([*updates, *([gate.update] if gate.update is not None else [])],
                        [self.owed_notices.cordon_notice(gate, inst_id, plan)], gate)

    def after_cordon(self, gate: GateAnswer | None, inst_id: str, *, uncordoned: bool = False,
                     cordoned: bool = False) -> None:
        """After the commit: the ECS attribute (the sweep finishes it)."""
        cordoned = cordoned or (gate is not None and gate.cordon is not None)
        if cordoned and gate is not None and gate.cordon is not None and gate.cordon.tripped_now:
            self.cordons.limit_tripped(gate.cordon, inst_id)
        if cordoned or uncordoned:
            self.cordons.sync_quietly(inst_id)

    # ------------------------------------------------------------------ effects
    def carry_out(self, instance: Instance, plan: RemediationPlan | None = None) -> None:
        """Reset, reboot or drain (then terminate) as the committed instance state says."""
        if instance.state is InstanceState.REBOOTING and instance.reset_pending:
            self.resets.start(instance)
        elif instance.state is InstanceState.REBOOTING:
            self.reboots.issue(instance)
        elif instance.state is InstanceState.QUARANTINED and (instance.drain_pending
                                                               or instance.terminate_pending):
            self.reboots.quarantine(instance)

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
        repo = self.data
        summary = fault_summary(evidence)
        if spent:
            summary["spent"] = spent
        record = replace(plan.node_record, at=evidence.fault_at, job_id=job.job_id, charged_job=False,
                         evidence=summary)
        for _ in range(APPLY_ROUNDS):
            raw = repo.instances.get_instance_item(inst_id)
            if raw is None:
                return False
            history = history_from_item(raw.get("fault_history"))
            if any(r.at == record.at and r.cause == record.cause and r.job_id == record.job_id
                   for r in history):
                return True  # written by an earlier delivery
            now = clock.now()
            merged = history_to_item(record_fault(history, record, now, self.policy.escalation))
            last = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": [job.job_id]}
            if repo.instances.record_node_fault(inst_id, fault_history=merged, last_fault=last,
                                                read_version=int(raw.get("fault_history_version") or 0)):
                return True
        return False
