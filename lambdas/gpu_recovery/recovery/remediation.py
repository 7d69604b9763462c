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
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain import breaker as breaker_policy
from gpu_recovery.domain.escalation import (
    NodeFaultRecord,
    charges_job,
    history_from_item,
    history_to_item,
    record_fault,
)
from gpu_recovery.domain.evidence import Evidence, build_evidence
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Budget, Trigger
from gpu_recovery.domain.job_budgets import JobBudgets, settle
from gpu_recovery.domain.models import Instance, Job, fault_key
from gpu_recovery.domain.policy import JobOutcome, job_outcome
from gpu_recovery.domain.relocation import gpu_count
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPlan, plan_remediation
from gpu_recovery.domain.states import (
    RECOVERING_JOB_STATES,
    InstanceState,
    JobState,
    SuspectVerdict,
)
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.ports import Deps
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.repository import JobVerdict, NodeDecision
from gpu_recovery.repository.recovery import SPEND_APPLICATION, SPEND_INFRASTRUCTURE

logger = logging.getLogger(__name__)

RETRY_INTERVAL_SECONDS = 60
FOLLOW_UP_SECONDS = 60  # the sweep finishes a decision's reboot or drain after this
CLUSTER_COUNT_TTL_SECONDS = 60.0
_APPLY_ROUNDS = 3


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
        self._cluster_count: tuple[float, int] | None = None

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
                     label: SuspectVerdict | None = None) -> dict[str, Any]:
        record: dict[str, Any] = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict()}
        if label is not None:
            record["label"] = label.value
        return record

    # ----------------------------------------------------------------- fast path
    def fast_path(self, job: Job, inst_id: str) -> str | None:
        """A pending suspect whose evidence is definitive: the node action without the
        DCGM diag. None when it does not apply (the instance is busy, the fresh evidence
        no longer says so): the caller opens (or joins) the health check instead."""
        stored = job.faults.get(fault_key(job.attempt, inst_id)) or {}
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
            if fresh is None or fresh.attempt != job.attempt or fresh.state not in RECOVERING_JOB_STATES \
                    or fresh.suspects.get(inst_id) != SuspectVerdict.PENDING.value:
                return "moved_on"
            applied = self.apply(instance, raw, plan, evidence, [fresh],
                                 from_states=(InstanceState.AVAILABLE, InstanceState.SUSPECT),
                                 findings={"verdict": "not run", "source": "fast path",
                                           "rule": plan.decision.rule_id, "reason": plan.decision.reason})
            if applied is not None:
                self.deps.metrics.add_metric("FastPathDecisions", "Count", 1)
                return f"fast_path_{plan.action.value}"
        return "raced"

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
        breaker_update, tripped = None, None
        if plan.needs_breaker:
            plan, breaker_update, tripped = self._ask_breaker(plan, inst_id, waiting, now)
        label = label_for(plan)
        history = history_from_item((instance_item or {}).get("fault_history"))
        new_history = None
        if plan.node_record is not None:
            new_history = history_to_item(record_fault(history, plan.node_record, now,
                                                       self.policy.escalation))
        verdicts = [self.job_verdict(job, inst_id, label, plan, evidence, findings or {}, history, now)
                    for job in waiting]
        decision = self._node_decision(plan, label, instance, from_states, evidence, findings, new_history,
                                       hc_started_by, hc_jobs_count, verdicts, now)
        if not repo.record_node_decision(instance, decision, [v for v, _ in verdicts], now, breaker_update):
            return None
        logger.info("node decision applied", extra={
            "instance": inst_id, "action": plan.action.value, "label": label.value,
            "execute": [e.value for e in plan.execute], "record_only": [e.value for e in plan.record_only],
            "rule": plan.decision.rule_id})
        if tripped is not None:
            self._breaker_tripped(tripped, inst_id)
        fresh = repo.get_instance(inst_id) or instance
        self.carry_out(fresh, plan)
        outcomes = [(v.job, o) for v, o in verdicts]
        for verdict, outcome in verdicts:
            self.notify_outcome(verdict.job, outcome, fresh, plan, evidence)
        if plan.escalation.page_operator:
            self._page_operator(fresh, plan, evidence)
        elif anywhere or (plan.action is Action.OPERATOR_ACTION and not waiting):
            self._tell_operator(fresh, plan, evidence)
        for verdict, outcome in verdicts:
            # A healthy node may be the last one a job was waiting for; a job leaving an
            # unusable node moves now (once its old ranks stopped), not at the next sweep.
            if outcome.restarts and (fresh.state is InstanceState.AVAILABLE
                                     or outcome is JobOutcome.RELOCATE):
                self.restarts.try_restart(verdict.job.job_id)
        return Applied(plan, label, outcomes)

    def _for_this_node(self, plan: RemediationPlan, instance: Instance) -> RemediationPlan:
        """ECS Anywhere (``mi-``) nodes are not in an Auto Scaling group: quarantine them."""
        if Effect.TERMINATE in plan.execute and instance.is_managed_instance:
            return replace(plan, execute=tuple(e for e in plan.execute if e is not Effect.TERMINATE))
        return plan

    def _node_decision(self, plan: RemediationPlan, label: SuspectVerdict, instance: Instance,
                       from_states: tuple[InstanceState, ...], evidence: Evidence,
                       findings: dict[str, Any] | None, history: list[dict[str, Any]] | None,
                       hc_started_by: str | None, hc_jobs_count: int | None,
                       verdicts: list[tuple[JobVerdict, JobOutcome]], now: float) -> NodeDecision:
        why = f"{plan.action.value}: {plan.decision.reason}"
        last_fault = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(),
                      "jobs": [v.job.job_id for v, _ in verdicts]}
        to: InstanceState | None
        blocked = None
        if Effect.REBOOT in plan.execute:
            to = InstanceState.REBOOTING
        elif Effect.DRAIN in plan.execute:
            to = InstanceState.QUARANTINED
        elif plan.blocked_by_breaker:
            to = InstanceState.SUSPECT
            blocked = {"action": plan.action.value, "at": now, "reason": plan.breaker_reason[:300],
                       "rule": plan.decision.rule_id, "jobs": [v.job.job_id for v, _ in verdicts]}
        else:
            # Nothing done to the node: a health check leaves it as it found it; a fast
            # path (observe mode) leaves its state alone.
            to = InstanceState.AVAILABLE if InstanceState.HEALTH_CHECKING in from_states else None
        restart_jobs = tuple(v.job.job_id for v, o in verdicts
                             if o == JobOutcome.RESTART_AFTER_REBOOT and label is SuspectVerdict.REBOOT)
        follow_up = to in (InstanceState.REBOOTING, InstanceState.QUARANTINED)
        return NodeDecision(
            from_states=from_states, to=to, findings=findings, fault_history=history, last_fault=last_fault,
            quarantine_reason=why if to is InstanceState.QUARANTINED else "",
            reboot_reason=why if to is InstanceState.REBOOTING else "",
            terminate=Effect.TERMINATE in plan.execute, breaker_blocked=blocked,
            hc_started_by=hc_started_by, hc_jobs_count=hc_jobs_count, restart_jobs=restart_jobs,
            follow_up_at=now + FOLLOW_UP_SECONDS if follow_up else None)

    # -------------------------------------------------------------- job outcome
    def job_verdict(self, job: Job, inst_id: str, label: SuspectVerdict, plan: RemediationPlan | None,
                    evidence: Evidence | None, findings: dict[str, Any], history: Iterable[NodeFaultRecord],
                    now: float) -> tuple[JobVerdict, JobOutcome]:
        """What the node's decision does to one waiting job: its verdict for the node, its
        outcome, and the budget it spends (once per fault; a flapping node's repeat is
        not charged again)."""
        suspects = {**job.suspects, inst_id: label.value}
        relocatable = self.restarts.relocatable(job)
        outcome = job_outcome(suspects, relocatable=relocatable)
        spend, error, to = "", "", job.state
        reason = f"verdict {label.value} on {inst_id}" + (f" ({plan.action.value}, rule "
                                                          f"{plan.decision.rule_id})" if plan else "")
        restart_reason = ""
        if outcome.restarts:
            kind = Budget.INFRASTRUCTURE
            if outcome == JobOutcome.RESTART:
                kind = plan.decision.budget if plan and plan.decision.budget is not Budget.NONE \
                    else Budget.APPLICATION
            if job.state is JobState.PENDING_HEALTHCHECK:
                charge = True
                if plan is not None and kind is Budget.INFRASTRUCTURE:
                    charge = charges_job(history, job.job_id, plan.decision.cause, now,
                                         self.policy.escalation)
                budget = settle(budgets_of(job), kind, charge=charge)
                if not budget.restart:
                    outcome = (JobOutcome.FAIL_APPLICATION_ERROR if kind is Budget.APPLICATION
                               else JobOutcome.FAIL_NO_BUDGET)
                    error = self._failure_text(outcome, inst_id, label, plan, job, budget.reason)
                elif not self.policy.modes.executes(Effect.RESTART_JOB):
                    outcome = JobOutcome.FAIL_OBSERVED
                    error = (f"observe mode: the job would have been restarted ({budget.reason}); "
                             f"{label.value} on {inst_id}")
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
        deadline = now + RETRY_INTERVAL_SECONDS if to is JobState.PENDING_RESTART else None
        fault = None
        if evidence is not None and plan is not None:
            fault = (fault_key(job.attempt, inst_id), self.fault_record(evidence, plan, now, label))
        record = JobVerdict(job=job, to=to, label=label, findings=findings, last_error=error, spend=spend,
                            deadline_at=deadline, fault=fault,
                            relocate=outcome == JobOutcome.RELOCATE and to is not JobState.FAILED,
                            restart_reason=restart_reason, reason=reason)
        return record, outcome

    @staticmethod
    def _failure_text(outcome: JobOutcome, inst_id: str, label: SuspectVerdict, plan: RemediationPlan | None,
                      job: Job, budget_reason: str) -> str:
        decided = f" ({plan.decision.reason})" if plan else ""
        if outcome == JobOutcome.FAIL_APPLICATION_ERROR:
            return (f"application error: the GPUs of {inst_id} were found healthy{decided}; "
                    f"{budget_reason or 'no application-error restart left'} ({job.last_error})")
        if outcome == JobOutcome.FAIL_NO_BUDGET:
            node = ("is rebooted and returns to service" if label is SuspectVerdict.REBOOT
                    else "was remediated")
            return (f"{inst_id} needed {plan.action.value if plan else label.value.lower()}{decided}; the "
                    f"node {node}, but the job used all {job.max_recovery_attempts} recovery attempt(s) "
                    f"({budget_reason})")
        if label is SuspectVerdict.OPERATOR_ACTION:
            return (f"{inst_id} has a configuration problem a reboot cannot fix (e.g. persistence mode "
                    f"off){decided}")
        if label is SuspectVerdict.BLOCKED:
            return f"{inst_id} needs a node action that was not carried out{decided}"
        return f"{inst_id} has a GPU fault a reboot cannot fix{decided}"

    # ------------------------------------------------------------------ breaker
    def _ask_breaker(self, plan: RemediationPlan, inst_id: str, jobs: list[Job],
                     now: float) -> tuple[RemediationPlan, Any, Any]:
        repo = self.deps.repo
        stored = repo.get_breaker()
        read_version = int(stored.get("version") or 0) if stored else None
        decided = breaker_policy.record_action(
            stored, node=inst_id, action=plan.action.value, now=now,
            cluster_gpu_nodes=self.cluster_gpu_nodes(), policy=self.deps.settings.remediation.breaker,
            job_id=",".join(j.job_id for j in jobs), reason=plan.decision.reason[:300])
        update = None
        if decided.state != breaker_policy.normalize(stored):
            state = dict(decided.state)
            if stored and stored.get("released"):
                state["released"] = stored["released"]
            # What the decision was measured against, for `gpu-recovery-admin breaker show`.
            state.update(limit=decided.limit, cluster_gpu_nodes=self.cluster_gpu_nodes(),
                         window_seconds=self.deps.settings.remediation.breaker.window_seconds)
            update = repo.breaker_update(state, read_version)
        return plan.with_breaker(decided), update, decided if decided.tripped_now else None

    def cluster_gpu_nodes(self) -> int:
        """GPU container instances of the cluster (ACTIVE or DRAINING), cached a minute."""
        now = time.monotonic()
        if self._cluster_count and now - self._cluster_count[0] < CLUSTER_COUNT_TTL_SECONDS:
            return self._cluster_count[1]
        count = sum(1 for ci in self.deps.ecs.container_instances()
                    if gpu_count(ci.get("registeredResources")) > 0)
        self._cluster_count = (now, count)
        return count

    def _breaker_tripped(self, decided: Any, inst_id: str) -> None:
        self.deps.metrics.add_metric("BreakerTripped", "Count", 1)
        logger.error("blast-radius breaker tripped", extra={"why": decided.state.get("trip_reason")})
        self.ranks.notify_node(
            NotificationKind.BREAKER_TRIPPED, "Automatic node remediation stopped (blast-radius breaker)",
            container_inst_id=inst_id, instance_id="",
            what_happened=str(decided.state.get("trip_reason") or decided.reason),
            what_was_done=("No node is rebooted, replaced or quarantined automatically until an operator "
                           "resets the breaker; every held-back action is kept in its backlog (this one "
                           "included)"),
            operator_action=("Find the common cause (driver rollout, power, fabric). Then "
                             "`gpu-recovery-admin breaker show`, and `gpu-recovery-admin breaker reset "
                             "--resume-backlog` (carry the held-back actions out) or `--drop-backlog`."))

    # ------------------------------------------------------------------ effects
    def carry_out(self, instance: Instance, plan: RemediationPlan | None = None) -> None:
        """Reboot or drain (then terminate) as the committed instance state says."""
        if instance.state is InstanceState.REBOOTING:
            self.reboots.issue(instance)
        elif instance.state is InstanceState.QUARANTINED and (instance.drain_pending
                                                               or instance.terminate_pending):
            self.reboots.quarantine(instance)

    # ------------------------------------------------------------ notifications
    def notify_outcome(self, job: Job, outcome: JobOutcome, instance: Instance, plan: RemediationPlan | None,
                       evidence: Evidence | None) -> None:
        if not outcome.fails:
            return
        job = self.deps.repo.get_job(job.job_id) or job
        details = details_of(evidence, plan)
        self.deps.metrics.add_metric("Failures", "Count", 1)
        node_done = describe_node_effects(instance, plan)
        if outcome == JobOutcome.FAIL_APPLICATION_ERROR:
            self.ranks.notify(job, instance, NotificationKind.APPLICATION_ERROR,
                              "Job failed: application error (GPUs healthy)",
                              what_happened=job.last_error,
                              what_was_done=f"Job marked FAILED; {node_done}",
                              operator_action="Look at the job's logs: the GPUs passed DCGM diagnostics.",
                              details=details)
            return
        if outcome == JobOutcome.FAIL_OBSERVED:
            self.ranks.notify(job, instance, NotificationKind.OBSERVED,
                              "Observe mode: fault detected, nothing done",
                              what_happened=job.last_error,
                              what_was_done="Nothing (observe mode): job marked FAILED in the job table only",
                              operator_action="Read what would have been done below and act by hand.",
                              details=details)
            return
        label = SuspectVerdict(job.suspects.get(instance.container_inst_id, SuspectVerdict.REPLACE.value))
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
        self.ranks.notify(job, instance, kind, headline, what_happened=job.last_error,
                          what_was_done=f"Job marked FAILED; {node_done}", operator_action=todo,
                          details=details)

    def _page_operator(self, instance: Instance, plan: RemediationPlan, evidence: Evidence) -> None:
        self.ranks.notify_node(
            NotificationKind.OPERATOR_ACTION, "GPU node keeps failing: quarantined, needs a person",
            container_inst_id=instance.container_inst_id, instance_id=instance.ec2_instance_id,
            what_happened=plan.escalation.reason, what_was_done=describe_node_effects(instance, plan),
            operator_action="Open a hardware ticket for this node; it is kept out of service until then.",
            details=details_of(evidence, plan))

    def _tell_operator(self, instance: Instance, plan: RemediationPlan, evidence: Evidence) -> None:
        if plan.action is Action.OPERATOR_ACTION:
            headline = "GPU node configuration problem"
            todo = "Fix the node's configuration, then set the container instance ACTIVE again."
        else:
            headline = "GPU node must be replaced by hand (ECS Anywhere)"
            todo = ("This ECS Anywhere node is not in an Auto Scaling group: it was quarantined instead "
                    "of terminated. Repair or replace the host, then register it again.")
        self.ranks.notify_node(
            NotificationKind.OPERATOR_ACTION, headline,
            container_inst_id=instance.container_inst_id, instance_id=instance.ec2_instance_id,
            what_happened=plan.decision.reason, what_was_done=describe_node_effects(instance, plan),
            operator_action=todo, details=details_of(evidence, plan))


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
