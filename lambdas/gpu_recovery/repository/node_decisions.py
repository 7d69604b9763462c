"""Node decisions: one transaction over a node and every job waiting for it.

A health check's verdict (or a definitive fault without one), a timed-out check or
reboot, a node lost with its agent disconnected: each moves the instance, decides the
suspect item and the tally of every waiting job (and each job's state and budget), the
breaker's item and the cordon worklist together, or writes nothing (a lost race: the
caller reads again and decides again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import JOB_PK, job_item_key
from gpu_recovery.domain import goodput
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.states import FATAL_SUSPECT_VERDICTS, InstanceState, JobState, SuspectVerdict
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.health_check_slots import HealthCheckSlots
from gpu_recovery.repository.instances import PAST_REBOOT_ATTRIBUTES, Instances
from gpu_recovery.repository.jobs_and_ranks import SPEND_APPLICATION, SPEND_COUNTER, JobsAndRanks


@dataclass(frozen=True)
class SuspectFlag:
    """A node left SUSPECT, not AVAILABLE, by a decision that leaves it as it was: a suspect
    for the stack's own check (``origin``: what returns it), looked at by the sweep at
    ``look_at``. Not a node action: nothing in its history, nothing for the breaker."""

    reason: str
    origin: str
    look_at: float | None = None

    def fields(self, now: float) -> dict[str, Any]:
        return {"suspect_since": now, "suspect_reason": self.reason[:500], "suspect_origin": self.origin}


@dataclass(frozen=True)
class JobVerdict:
    """What one node decision (a health-check verdict, or a definitive fault) does to one
    waiting job."""

    job: Job
    to: JobState
    label: SuspectVerdict
    findings: dict[str, Any]
    last_error: str = ""
    spend: str = ""  # "infrastructure" | "application" | "" (nothing charged)
    deadline_at: float | None = None  # PENDING_RESTART: when the sweep looks again
    record: dict[str, Any] | None = None  # the suspect's evidence + plan (+ label)
    relocate: bool = False  # the restart moves ranks off unusable nodes
    restart_reason: str = ""
    reason: str = ""  # the history entry (default: "verdict <label> on <instance>")
    waits_for_reboot: bool = False  # the job's restart waits until the node is back
    infra_hint: bool = False  # healthy, and the catalog charges a restart to the infrastructure budget
    held: bool = False  # the node's reboot was held back by the breaker (counted in the tally)
    # HOLD: the budget the restart spends once the held job goes on ("": not charged again).
    hold_spend: str | None = None
    undiagnosed: bool = False  # the stack's own check gave no verdict (``FaultTally.undiagnosed``)

    @property
    def shard_kind(self) -> str:
        """How a verdict that only counts is counted on its tally shard."""
        return "undiagnosed" if self.undiagnosed else "infra" if self.infra_hint else "healthy"

    @property
    def counts_only(self) -> bool:
        """A healthy verdict that changes nothing on the job but its count: counted on a
        tally shard, off the job item, after its transaction (``count_healthy_verdicts``)."""
        return (self.label is SuspectVerdict.HEALTHY and self.to is self.job.state
                and not self.to.is_terminal and not self.held and not self.waits_for_reboot
                and not self.relocate and not self.spend and not self.last_error
                and not self.restart_reason and self.hold_spend is None)


@dataclass(frozen=True)
class NodeDecision:
    """What a node decision does to the instance item (see ``NodeDecisionRepository.record``)."""

    from_states: tuple[InstanceState, ...]
    to: InstanceState | None  # None: the state stays
    findings: dict[str, Any] | None = None  # last_verdict
    fault_history: list[dict[str, Any]] | None = None
    last_fault: dict[str, Any] | None = None
    quarantine_reason: str = ""
    reboot_reason: str = ""
    terminate: bool = False  # replace by TerminateInstanceInAutoScalingGroup after the drain
    breaker_blocked: dict[str, Any] | None = None  # SUSPECT: the action the breaker held back
    hc_started_by: str | None = None  # the verdict of this health check only
    hc_jobs_count: int | None = None  # ... and only if no job joined it since it was read
    restart_jobs: tuple[str, ...] = ()  # jobs restarting once the node is back
    follow_up_at: float | None = None  # a reboot or drain still to do: the sweep finishes it
    cordon: dict[str, Any] | None = None  # known bad: cordon it (domain.cordon.cordon_record)
    uncordon: bool = False  # healthy again (a passed diag): clear its cordon
    reset: bool = False  # REBOOTING by a GPU reset first (recovery.gpu_resets)
    # A driver warning's decision that leaves the node as it is (observe mode, the breaker
    # held it): its record stays, marked decided, so the warning is not decided again.
    warning_decided: bool = False
    # A failed validation's decision (recovery.validations): written only on that validation
    # and its claim (``ValidationRepository.validation_condition``), and, when the node leaves repair,
    # letting its waiting jobs go in the same transaction (their updates in ``also``).
    validation: tuple[str, dict[str, Any], dict[str, str]] | None = None
    release_waiting: bool = False
    last_validation: dict[str, Any] | None = None
    suspect: SuspectFlag | None = None  # ``to`` SUSPECT by this flag (its deadline: ``follow_up_at``)


@dataclass(frozen=True)
class JobFailure:
    """A job failed (or, ``moves``, goes on elsewhere) because an instance it waits for
    timed out."""

    job: Job
    reason: str
    label: SuspectVerdict
    moves: bool = False  # relocatable and waiting to restart: the node no longer holds it
    suspect_pending: bool = False  # its verdict for the node was still to come (counted now)
    suspect_rebooting: bool = False  # it waited for the node's reboot (no longer)


class NodeDecisionRepository:
    """The transactions that decide a node and the jobs waiting for it (``repo.decisions``):
    written over both tables, with the jobs' and the instances' builders."""

    def __init__(self, jobs: JobsAndRanks, instances: Instances) -> None:
        self.jobs, self.instances = jobs, instances
        self.db, self.job_table_name = jobs.db, jobs.job_table_name
        self.cordons, self.faults, self.slots = instances.cordons, instances.faults, instances.slots

    def record(self, instance: Instance, decision: NodeDecision, jobs: Sequence[JobVerdict], now: float,
               breaker: Update | None = None, also: Sequence[Update] = ()) -> bool:
        """One node decision (a health check's verdict, or a definitive fault without one)
        on the instance, every job waiting for it and the blast-radius breaker, atomically.
        A verdict applies only to its own check (its startedBy) and only if no job joined
        it since it was read. A reboot or a drain still to do keeps a deadline
        (``follow_up_at``) so the sweep finishes it if this delivery dies. ``also``: other
        updates built here (e.g. :meth:`lost_job_failure`) that belong to the decision."""
        fields: dict[str, Any] = {}
        # The node is judged: whatever fenced it as a suspect is answered (domain.placement).
        # A driver's warning on it is answered too (repaired, or decided and left).
        remove = ["hc_jobs", "hc_left", "hc_lease_until", "suspect_fence", "validation",
                  *HealthCheckSlots.held_attributes(), *HealthCheckSlots.wait_attributes()]
        if decision.warning_decided:
            fields["warning.decided_at"] = now
        else:
            remove.append("warning")
        if decision.release_waiting:
            remove.append("waiting_jobs")
        if decision.last_validation is not None:
            fields["last_validation"] = decision.last_validation
        if decision.findings is not None:
            fields["last_verdict"] = decision.findings
        if decision.fault_history is not None:
            fields["fault_history"] = decision.fault_history
        if decision.last_fault is not None:
            fields["last_fault"] = decision.last_fault
        to = decision.to
        if to is InstanceState.REBOOTING:
            fields.update(reboot_requested_at=now, reboot_reason=decision.reboot_reason[:300])
            remove += [*PAST_REBOOT_ATTRIBUTES, "breaker_blocked"]
            remove += ["reset_started_by", "reset_claimed_at", "reset_task_arn"]
            if decision.reset:
                fields["reset_pending"] = True
            else:
                remove.append("reset_pending")
        if to is InstanceState.QUARANTINED:
            fields.update(quarantine_reason=decision.quarantine_reason[:500], drain_pending=True)
            if decision.terminate:
                fields["terminate_pending"] = True
            remove += ["breaker_blocked"]
        if decision.breaker_blocked is not None:
            fields["breaker_blocked"] = decision.breaker_blocked
        if decision.suspect is not None and to is InstanceState.SUSPECT:
            fields.update(decision.suspect.fields(now))
        cordon_sync: list[Update] = []
        if decision.cordon is not None:
            fields.update(self.cordons.cordon_fields(decision.cordon, now))
            cordon_sync.append(self.cordons.sync_update(instance.container_inst_id, now))
        elif decision.uncordon and instance.cordoned and not instance.cordon.get("notice"):  # AWS's: it stays
            more, gone, sync = self.cordons.uncordon_updates(instance.container_inst_id, now)
            fields.update(more)
            remove += gone
            cordon_sync.append(sync)
        extra: list[str] = []
        values: dict[str, Any] = {}
        names: dict[str, str] = {}
        if decision.hc_started_by is not None:
            extra.append("#sb = :sb")
            values[":sb"] = decision.hc_started_by
            names["#sb"] = "hc_started_by"
        if decision.warning_decided:
            extra.append("attribute_exists(#wd)")
            names["#wd"] = "warning"
        if decision.validation is not None:
            condition, more_values, more_names = decision.validation
            extra.append(condition)
            values.update(more_values)
            names.update(more_names)
        if decision.hc_jobs_count is not None:
            # No job left waiting (they all left before the verdict): the emptied set is gone.
            extra.append("(attribute_not_exists(#hcj) OR size(#hcj) = :hcn)" if decision.hc_jobs_count == 0
                         else "size(#hcj) = :hcn")
            values[":hcn"] = decision.hc_jobs_count
            names["#hcj"] = "hc_jobs"
        follow_up = decision.follow_up_at is not None
        updates = [self.instances.instance_update(
            instance.container_inst_id, from_states=decision.from_states, to=to,
            set_fields=fields, remove_fields=remove,
            deadline_at=decision.follow_up_at, clear_deadline=not follow_up,
            add_to_sets={"waiting_jobs": set(decision.restart_jobs)} if decision.restart_jobs else None,
            extra_condition=" AND ".join(extra) or None, extra_values=values, extra_names=names,
        )]
        for verdict in jobs:
            updates += self.job_verdict_updates(instance.container_inst_id, verdict)
        updates += self.faults.verdict_after_leaving(instance, decision.findings, to or instance.state, now)
        releasing = instance.state is InstanceState.HEALTH_CHECKING \
            and InstanceState.HEALTH_CHECKING in decision.from_states
        if releasing:
            updates += self.slots.release(instance)
        if breaker is not None:
            updates.append(breaker)
        updates += cordon_sync
        updates += list(also)
        return self.instances.commit_leaving_check(instance, updates, leaving=releasing)

    def lost_job_failure(self, job: Job, reason: str, last_fault: dict[str, Any] | None = None) -> Update:
        """NODE_LOST (or SUSPENDING: a node lost in a suspension's grace) -> FAILED on the same
        attempt (its node unreachable), from the state as read, with the fault's evidence and
        decision and the intent to stop its ranks; for :meth:`record` (``also``) or
        :meth:`fail_lost_job`."""
        if job.state not in (JobState.NODE_LOST, JobState.SUSPENDING):
            raise ValueError(f"a lost node fails a NODE_LOST or SUSPENDING job, not {job.state.value}")
        now = clock.now()
        fields: dict[str, Any] = {"last_error": reason[:1000],
                                  **self.jobs.stop_fanout_fields(job.attempt, reason, now),
                                  **self.jobs.job_deadline_fields(now + 60)}
        if last_fault is not None:
            fields["last_fault"] = last_fault
        return self.jobs.job_transition(
            job.job_id, JobState.FAILED, from_states=[job.state], attempt=job.attempt,
            reason=reason, actor="heartbeat", set_fields=fields)

    def fail_lost_job(self, job: Job, reason: str, last_fault: dict[str, Any] | None = None,
                      also: Sequence[Update] = ()) -> bool:
        """The same, without a node decision (the node is not AVAILABLE / SUSPECT, or observe
        mode leaves it alone and this is recorded separately)."""
        return self.db.transact([self.lost_job_failure(job, reason, last_fault), *also])

    def suspect_flag(self, inst_id: str, now: float, reason: str, *, origin: str, allow_missing: bool = False,
                     look_at: float | None = None) -> Update:
        """AVAILABLE (or, ``allow_missing``, unknown) -> SUSPECT: no new queue work; a passing
        health check returns it. The heartbeat service's flag on telemetry, and for
        :meth:`fail_lost_job`'s ``also`` when the lost node's host still reports (``origin``
        LOST_NODE_ORIGIN: its ECS agent's reconnect starts the stack's own check; ``look_at``:
        the sweep's look, which finds a reconnect whose event never came). Not a node
        decision: nothing in its history, nothing for the breaker."""
        return self.instances.instance_update(
            inst_id, from_states=[InstanceState.AVAILABLE], to=InstanceState.SUSPECT,
            allow_missing=allow_missing, deadline_at=look_at,
            set_fields=SuspectFlag(reason, origin, look_at).fields(now))

    def record_verdict_of_busy_instance(self, instance: Instance, verdict: JobVerdict,
                                        restart: bool, also: Sequence[Update] = ()) -> bool:
        """A job joins an instance already rebooting or quarantined by another job's fault:
        the verdict it waits for is already known."""
        updates = [self.instances.instance_update(
            instance.container_inst_id, from_states=[instance.state],
            add_to_sets={"waiting_jobs": {verdict.job.job_id}} if restart else None)]
        updates += self.job_verdict_updates(instance.container_inst_id, verdict)
        return self.db.transact([*updates, *also])

    def job_verdict_updates(self, inst_id: str, verdict: JobVerdict) -> list[Update]:
        """The suspect's verdict (PENDING -> label, once) and the job's tally and state, on the
        tally as read: a concurrent verdict makes the transaction fail and the caller decide
        again on fresh counts. A verdict that only counts writes nothing on the job: after
        its commit the caller counts it on a tally shard (:meth:`count_healthy_verdicts`),
        then adds the shards and settles the job if every verdict is in."""
        faults = self.faults
        job = verdict.job
        now = clock.now()
        on_shard = verdict.shard_kind if verdict.counts_only else ""
        suspect = faults.decide_suspect(job, inst_id, verdict.label, findings=verdict.findings,
                                        record=verdict.record, rebooting=verdict.waits_for_reboot, now=now,
                                        counted_on_shard=on_shard)
        if verdict.counts_only:
            # No state change, nothing else to write on the job: no hot job item, and no
            # shared item in the transaction (FaultRepository.count_healthy, after it).
            return [suspect]
        fields: dict[str, Any] = {}
        if verdict.last_error:
            fields["last_error"] = verdict.last_error[:1000]
        if verdict.deadline_at is not None:
            fields.update(self.jobs.job_deadline_fields(verdict.deadline_at))
        if verdict.relocate:
            fields["relocate"] = True
        if verdict.restart_reason:
            fields["restart_reason"] = verdict.restart_reason[:500]
        if verdict.to.is_terminal:
            why = verdict.last_error or verdict.reason
            fields.update(self.jobs.stop_fanout_fields(job.attempt, why, now))
            fields.update(self.jobs.job_deadline_fields(now + 60))
        counts = {"fault.decided": 1}
        if verdict.label in FATAL_SUSPECT_VERDICTS:
            counts["fault.fatal"] = 1
        if verdict.label is SuspectVerdict.REBOOT:
            counts["fault.reboot"] = 1
        if verdict.waits_for_reboot:
            counts["fault.rebooting"] = 1
        if verdict.infra_hint:
            counts["fault.infra"] = 1
        if verdict.undiagnosed:
            counts["fault.undiagnosed"] = 1
        if verdict.held:
            counts["fault.held"] = 1
        if verdict.hold_spend is not None:
            # Charged when the held job goes on (BreakerHold.spend), not while it waits.
            fields["breaker_hold"] = {"attempt": job.attempt, "spend": verdict.hold_spend}
        if verdict.spend:
            counts[SPEND_COUNTER[verdict.spend]] = 1
        condition, values, names = faults.tally_condition(job)
        update = self.jobs.job_transition(
            job.job_id, verdict.to, from_states=[job.state], attempt=job.attempt,
            reason=verdict.reason or f"verdict {verdict.label.value} on {inst_id}", actor="recovery",
            set_fields=fields, increments=counts, extra_condition=condition, extra_values=values,
            extra_names=names, ledger={**goodput.stop_marks(job.stopped, job.attempt), **goodput.cause_marks(
                goodput.wait_cause(relocate=verdict.relocate, repair=verdict.waits_for_reboot or verdict.held,
                                   application=verdict.spend == SPEND_APPLICATION))})
        if verdict.to is job.state:
            # Not a state change: the verdict is on the suspect item. One history entry per
            # checked node would fill the job's bounded history (pushing its real changes
            # out) and make the hot job item, written by every verdict, grow with the job.
            update.history_entry = None
        return [suspect, update]

    def count_healthy_verdicts(self, inst_id: str, verdicts: Sequence[JobVerdict]) -> None:
        """After a committed decision: its verdicts that only count, on their tally shards
        (idempotent; the sweep counts any left out, ``FaultRepository.recount``)."""
        for verdict in verdicts:
            if verdict.counts_only:
                self.faults.count_healthy(verdict.job, inst_id, verdict.shard_kind)

    def time_out_instance(self, instance: Instance, *, quarantine: bool, what: str,
                          failures: Sequence[JobFailure], actor: str = "sweep",
                          fault_history: list[dict[str, Any]] | None = None,
                          breaker_blocked: dict[str, Any] | None = None,
                          breaker: Update | None = None, cordon: dict[str, Any] | None = None,
                          also: Sequence[Update] = ()) -> bool:
        """The instance's health check or reboot ran out of time: the instance leaves
        recovery (QUARANTINED, or SUSPECT when nothing proved it faulty, when the breaker
        held its quarantine back — ``breaker_blocked`` — or observe mode left it undrained)
        and every job waiting for it fails (or, relocatable, no longer waits for it and
        counts it unusable), atomically, with the breaker's new state."""
        faults = self.faults
        inst_id = instance.container_inst_id
        fields: dict[str, Any] = {"quarantine_reason": what[:500]}
        if quarantine:
            fields["drain_pending"] = True
        if fault_history is not None:
            fields["fault_history"] = fault_history
        if breaker_blocked is not None and not quarantine:
            fields["breaker_blocked"] = breaker_blocked
        cordon_sync: list[Update] = []
        if cordon is not None:  # out of placement by its cordon (a drained node: until DRAINING)
            version = clock.now()
            fields.update(self.cordons.cordon_fields(cordon, version))
            cordon_sync.append(self.cordons.sync_update(inst_id, version))
        updates = [self.instances.instance_update(
            inst_id, from_states=[instance.state],
            to=InstanceState.QUARANTINED if quarantine else InstanceState.SUSPECT,
            set_fields=fields, remove_fields=["hc_jobs", "hc_left", "waiting_jobs", "hc_lease_until",
                                              "suspect_fence", *HealthCheckSlots.held_attributes(),
                                              *HealthCheckSlots.wait_attributes()],
            deadline_at=clock.now() + 60 if quarantine else None, clear_deadline=not quarantine)]
        if breaker is not None:
            updates.append(breaker)
        updates += cordon_sync
        if instance.state is InstanceState.HEALTH_CHECKING:
            updates += self.slots.release(instance)
        now = clock.now()
        updates += self.faults.verdict_after_leaving(
            instance, {"verdict": "timeout", "reason": what[:300]},
            InstanceState.QUARANTINED if quarantine else InstanceState.SUSPECT, now)
        for failure in failures:
            job = failure.job
            if failure.moves:
                # Relocatable, waiting to restart: the node is unusable now, not awaited.
                counts = {"fault.fatal": 1}
                if failure.suspect_pending:
                    counts["fault.decided"] = 1
                    updates.append(faults.decide_suspect(job, inst_id, failure.label, findings={},
                                                         record=None, rebooting=False, now=now))
                else:
                    updates.append(faults.relabel_suspect(job, inst_id, failure.label))
                    if failure.suspect_rebooting:
                        counts["fault.rebooting"] = -1
                condition, values, names = faults.tally_condition(job)
                updates.append(Update(
                    table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
                    increments=counts, set_fields={"relocate": True},
                    condition=f"#st = :st AND {condition}",
                    condition_values={":st": job.state.value, **values},
                    condition_names={"#st": "job_state", **names}))
                continue
            updates.append(faults.relabel_suspect(job, inst_id, failure.label))
            updates.append(self.jobs.job_transition(
                job.job_id, JobState.FAILED, from_states=[job.state], attempt=job.attempt,
                reason=failure.reason, actor=actor,
                set_fields={"last_error": failure.reason[:1000],
                            **self.jobs.stop_fanout_fields(job.attempt, failure.reason, now),
                            **self.jobs.job_deadline_fields(now + 60)}))
        return self.instances.commit_leaving_check(instance, [*updates, *also],
                                                   leaving=instance.state is InstanceState.HEALTH_CHECKING)
