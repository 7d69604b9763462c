"""Stage 3b: act on the driver's own warnings (docs/driver-warnings.md).

The heartbeat service records a node's warning (a catalog rule with a ``warning``: the
driver's recovery action, a pending remap, a counter rising past its rate) on the node's item
with a deadline due at once: the intent. The sweep then works it here, every minute until it
is answered (each step a conditional write, so a delivery that dies is finished by the next):

* the warning is **gone** (the driver no longer says so, the counters calmed, the report is
  older than the node's last repair): the record goes, with the cordon it put;
* the node is **idle** (no tracked rank on it, not held for a recovering job): it is repaired
  at once through the node decision (``remediation.node_decision``: the catalog's whole
  decision on its evidence, escalation, the blast-radius breaker, observe mode, the cordon
  that keeps it out of placement until it is back, the node's history). Whatever checks a
  repaired node on its way back applies to it as to any other repair;
* the node is **busy**: it is cordoned (nothing new lands there) and each job on it is asked,
  once per attempt: a queue job whose warning moves jobs is asked to **checkpoint and stop**
  (the time-sharing suspend, kind ``moved``: rank 0 learns it through the control API, saves
  and calls ``go_suspend()``; ``recovery.suspension`` moves it to the head of its priority,
  where the scheduler restarts it on healthy nodes or a spare from that checkpoint). Any other
  job keeps running (a tag-registered job has no control channel; a ``cordon`` warning does
  not move jobs): the node is repaired once it leaves. A job that does not checkpoint within
  ``warning_checkpoint_seconds`` keeps running too (``recovery.suspension``). If the GPU fails
  before the job moves, the rank's exit is an ordinary fault: the recovery loop takes it, and
  its node decision (now with the driver's own word in its evidence) answers the warning.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS, NotificationKind
from gpu_recovery.domain import placement
from gpu_recovery.domain.evidence import ITEM_TELEMETRY_AT
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Trigger
from gpu_recovery.domain.gpu_warnings import (
    DriverWarning,
    asked,
    driver_warning,
    job_entry,
    kept_rates,
    repaired_at,
)
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPlan, RemediationPolicy
from gpu_recovery.domain.states import ACTIVE_JOB_STATES, InstanceState, JobState
from gpu_recovery.domain.time_sharing import SuspendKind, suspend_record
from gpu_recovery.recovery.breaker.gate import NodeActionGate
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import MetricsPort, Outcome, after_commit
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation
from gpu_recovery.recovery.remediation.notices import describe_node_effects, details_of
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsJob, ReadsNode, ReadsNodeItems
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.warnings import WarningRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

_WARNED = (InstanceState.AVAILABLE, InstanceState.SUSPECT)
# A job that runs on the node (a recovering one will leave it, or is reserved and waited for).
_STARTED = ACTIVE_JOB_STATES | {JobState.SUSPENDING}


class WarningJobs(ReadsJob, Protocol):
    """The jobs on the warned node."""

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]: ...


class WarningNodes(ReadsNodeItems, ReadsNode, Protocol):
    """The warned node."""


class WarningData(HasJobs[WarningJobs], HasInstances[WarningNodes], Protocol):
    """The warned node, the jobs on it and the holds it is kept out of placement by."""

    cordons: CordonRepository


@dataclass(eq=False, repr=False)
class GpuWarnings:
    data: WarningData
    records: WarningRepository
    remediation: NodeRemediation
    gate: NodeActionGate
    cordons: Cordons
    notices: Notices  # the outbox
    _: KW_ONLY
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings

    # ------------------------------------------------------------------ the step
    def at_report(self, inst_id: str) -> str:
        """The node API just recorded the warning: what needs no repair happens now (the node
        cordoned; its queue jobs asked to move: rank 0 learns it within seconds), the repair
        itself at the sweep (a reboot or a drain is not the node API's to do)."""
        instance = self.data.instances.get_instance(inst_id)
        if instance is None or not instance.warning:
            return "ignored"
        return self.sweep(instance, clock.now(), repair=False)

    def sweep(self, instance: Instance, now: float, *, repair: bool = True) -> str:
        """The node's warning is due: clear it, repair the idle node (``repair``; else only
        cordon it, still due for the sweep), or cordon the busy one and ask its jobs to move."""
        repo = self.data
        inst_id = instance.container_inst_id
        raw = repo.instances.get_instance_item(inst_id)
        if raw is None:
            return "ignored"
        instance = repo.instances.instance_from_item(raw)
        record = instance.warning
        rule = str(record.get("rule") or "")
        if not rule or instance.state not in _WARNED:
            return "warning_owned_elsewhere"
        # Judged on the node's latest GPU report: one older than the evidence's window (its agent's
        # reports failing) is judged as of its own time, not taken for a report without the warning.
        report_at = raw.get(ITEM_TELEMETRY_AT)
        lookback = self.policy.catalog.lookback_seconds
        judged_at = now if report_at is None or float(report_at) >= now - lookback else float(report_at)
        evidence = self.remediation.evidence(inst_id=inst_id, instance_item=raw, trigger=Trigger.TELEMETRY,
                                             fault_at=judged_at)
        warning = driver_warning(evidence, self.policy.catalog)
        if warning is None and kept_rates(record):
            # A predicted warning stands until the node is repaired: a later report whose rate
            # dips under the limit (noise, a shorter span) does not withdraw it.
            evidence = replace(evidence, counter_rates=evidence.counter_rates + tuple(kept_rates(record)))
            warning = driver_warning(evidence, self.policy.catalog)
        repaired = repaired_at(raw)
        stale = report_at is None or (repaired is not None and float(report_at) <= repaired)
        plan = self.remediation.plan(evidence, raw, now=now)
        if record.get("decided_at") and warning is not None and not stale:
            # Decided already, the node left as it was (observe mode, or its repair held by the
            # breaker: its backlog carries it out): nothing more until it changes.
            return "warning_decided" if self.records.settle_warning(inst_id, rule) else "raced"
        if warning is None or stale or plan.action not in NODE_ACTIONS or not plan.decision.skip_health_check:
            why = ("its latest GPU report predates the node's last repair" if stale and warning is not None
                   else "the node's latest GPU report no longer shows it" if warning is None
                   else f"the catalog decides {plan.action.value} on the same evidence")
            uncordon = instance.cordoned and instance.cordon.get("cause") == rule
            if self.records.clear_warning(inst_id, rule, now, uncordon=uncordon):
                logger.info("driver warning cleared", extra={"instance": inst_id, "rule": rule, "why": why})
                if uncordon:
                    after_commit("uncordon", self.cordons.sync_quietly, inst_id)
                return "warning_cleared"
            return "raced"
        busy = repo.jobs.live_ranks_on_instance(inst_id)
        holder = self._held_for(inst_id)
        if not busy and not holder and repair:
            return self.repair(instance, raw, plan, evidence, warning, record)
        if not busy and not holder:
            if instance.cordoned:
                return "warning_idle"
            return "warning_idle_cordoned" if self._cordon(inst_id, rule, warning, now) else "raced"
        return self._busy(instance, raw, warning, record, busy, holder, now)

    def _held_for(self, inst_id: str) -> str:
        """The recovering job the node is reserved for ("": none): its restart may place ranks
        on it, so it is not repaired under it (it is looked at again each minute)."""
        hold = self.data.cordons.worklist().holds.get(inst_id) or {}
        return str(hold.get("job") or "") if hold.get("why") == placement.RESERVED else ""

    # -------------------------------------------------------------------- idle
    def repair(self, instance: Instance, raw: dict[str, Any], plan: RemediationPlan, evidence: Any,
               warning: DriverWarning, record: dict[str, Any]) -> str:
        """No job on the node: the node decision now (reset, reboot, replace as the catalog
        says; the breaker, observe mode, escalation, the cordon until it is back)."""
        since = float(record.get("since") or clock.now())
        left = sorted(str(e.get("job")) for e in (record.get("jobs") or {}).values() if isinstance(e, dict))
        headline = ("GPU node repaired on the driver's warning, once its jobs left" if left else
                    "GPU node repaired on the driver's warning, before a job found it")
        where = f"once job(s) {', '.join(left[:5])} left it" if left else "no job on the node"

        def notice(after: Instance, final: RemediationPlan) -> Owed:
            return self.notices.for_node(
                NotificationKind.GPU_WARNING, headline, container_inst_id=after.container_inst_id,
                instance_id=after.ec2_instance_id,
                what_happened=(f"The node's GPU report ({where}) showed {warning.describe()}, "
                               f"since {int(clock.now() - since)} s"),
                what_was_done=describe_node_effects(after, final) + "; kept out of placement until then",
                operator_action=("None: the node returns to service by itself when its repair passes; "
                                 "a node that keeps warning is escalated (reboot, then replace)."),
                details=details_of(evidence, final))

        applied = self.remediation.apply(
            instance, raw, plan, evidence, [], from_states=_WARNED, node_notice=notice,
            warning_rule=warning.rule_id,
            findings={"verdict": "not run", "source": "driver warning", "rule": plan.decision.rule_id,
                      "warning": warning.rule_id, "confidence": warning.confidence,
                      "reason": plan.decision.reason[:500]})
        if applied is None:
            return "raced"
        self.metrics.add_metric("WarningRepairs", "Count", 1)
        logger.warning("idle node repaired on a driver warning", extra={
            "instance": instance.container_inst_id, "rule": warning.rule_id,
            "action": applied.plan.action.value, "execute": [e.value for e in applied.plan.execute]})
        return f"warning_repair_{applied.plan.action.value}"

    # -------------------------------------------------------------------- busy
    def _busy(self, instance: Instance, raw: dict[str, Any], warning: DriverWarning, record: dict[str, Any],
              busy: list[Any], holder: str, now: float) -> str:
        repo = self.data
        inst_id = instance.container_inst_id
        rule = str(record.get("rule"))
        next_look = now + RETRY_INTERVAL_SECONDS
        if not instance.cordoned:
            if not self._cordon(inst_id, rule, warning, next_look):
                return "raced"
        elif not self.records.rearm_warning(inst_id, rule, next_look):
            return "raced"
        asked_now = 0
        for job_id in sorted({r.job_id for r in busy} | ({holder} if holder else set())):
            job = repo.jobs.get_job(job_id)
            if job is None or asked(record, job_id, job.attempt):
                continue
            asked_now += self._ask(instance, rule, record, warning, job, now)
        return "warning_moving_jobs" if asked_now else "warning_waiting_for_jobs"

    def _cordon(self, inst_id: str, rule: str, warning: DriverWarning, next_look: float) -> bool:
        """The warned node takes nothing new: its cordon, through the cordon limit."""
        now = clock.now()
        answer = self.gate.decide(node=inst_id, action=None, job_ids=(), now=now, reason=warning.reason,
                                  cordon_unless_drained=True)
        cordon = answer.cordon_record(cause=rule, reason=f"driver warning: {warning.describe()}", now=now)
        if cordon is None:
            return self.records.rearm_warning(inst_id, rule, next_look)
        limit = self.cordons.limit_tripped_notice(answer.cordon, inst_id, warning.reason) \
            if answer.cordon is not None and answer.cordon.tripped_now else None
        if not self.records.cordon_for_warning(inst_id, rule, cordon, now, next_look, answer.update,
                                               also=self.notices.owe([limit], now)):
            return False
        self.notices.send([limit])
        after_commit("cordon", self.remediation.after_cordon, answer, inst_id)
        return True

    def _ask(self, instance: Instance, rule: str, record: dict[str, Any], warning: DriverWarning, job: Job,
             now: float) -> int:
        """Ask one job on the warned node to move (1), or note that it stays (0)."""
        inst_id = instance.container_inst_id
        bound = self.settings.remediation.warning_checkpoint_seconds
        modes = self.policy.modes
        movable = (job.is_queue_job and job.state is JobState.RUNNING and warning.moves_jobs and bound > 0
                   and modes.executes(Effect.STOP_TASKS) and modes.executes(Effect.RESTART_JOB))
        if movable:
            avoid = {"node": inst_id, "rule": rule, "action": warning.action.value,
                     "confidence": warning.confidence, "reason": warning.reason[:300]}
            why = (f"driver warning on {inst_id}: {warning.describe()}; checkpoint and stop within "
                   f"{bound} s: the job restarts elsewhere from that checkpoint and the node is repaired")
            suspend = {**suspend_record(SuspendKind.MOVED, why, grace_seconds=bound, now=now), "avoid": avoid}
            entry = job_entry(job.job_id, job.attempt, now, "move")
            done = self.records.ask_job_to_move(inst_id, rule, job.job_id, job.attempt, entry, suspend,
                                                now + bound, f"move requested ({why})")
            if done:
                self.metrics.add_metric("WarningMovesRequested", "Count", 1)
                logger.warning("job asked to move off a warned node", extra={
                    "job_id": job.job_id, "instance": inst_id, "rule": rule, "grace": bound})
            return int(done)
        if job.state in _STARTED:
            why = self._why_it_stays(job, warning, bound)
            owed = self._stays_notice(job, instance, warning, why) if job.state is JobState.RUNNING else None
            entry = job_entry(job.job_id, job.attempt, now, "stays")
            owes = self.notices.owe([owed], now)
            if self.records.note_job_stays(inst_id, rule, job.job_id, entry, also=owes):
                self.notices.send([owed])
        return 0

    def _why_it_stays(self, job: Job, warning: DriverWarning, bound: int) -> str:
        modes = self.policy.modes
        if not job.is_queue_job:
            return "it is not a queue job: nothing can ask it to checkpoint (no control channel)"
        if not warning.moves_jobs:
            return f"the catalog's rule {warning.rule_id} does not move running jobs (busy_node: cordon)"
        if bound <= 0:
            return "warning_checkpoint_seconds is 0: running jobs are not asked to move"
        if not (modes.executes(Effect.STOP_TASKS) and modes.executes(Effect.RESTART_JOB)):
            return "observe mode for stop_tasks / restart_job: the move is only recorded"
        return f"the job is {job.state.value}"

    def _stays_notice(self, job: Job, instance: Instance, warning: DriverWarning, why: str) -> Owed:
        return self.notices.for_job(
            job, None, NotificationKind.GPU_WARNING, "Job runs on a GPU node with a driver warning",
            what_happened=f"Node {instance.container_inst_id} reports {warning.describe()}",
            what_was_done=(f"The job keeps running ({why}); the node takes no new work (cordoned) and is "
                           f"repaired ({warning.action.value}) once the job leaves it"),
            operator_action=("None required. To avoid the crash the warning may announce, stop the job at "
                             "a checkpoint of yours and start it again: it will not land on this node."))

    # ---------------------------------------------------------- after a move
    def after_move(self, inst_id: str) -> Outcome:
        """A job left the warned node at its checkpoint: repair it now if nothing else runs
        there (else the sweep looks again within a minute)."""
        instance = self.data.instances.get_instance(inst_id)
        if instance is None or not instance.warning or instance.state not in _WARNED:
            return Outcome("ignored", detail={"instance": inst_id})
        return Outcome(self.sweep(instance, clock.now()), detail={"instance": inst_id})
