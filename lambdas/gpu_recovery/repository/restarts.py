"""A job's gang restart (``recovery.gang_restart``, ``recovery.restart_waits``): claimed once per
fault, confirmed running, waiting for its nodes or for a spare, leaving its suspects before their
verdicts, or sent back to the queue to be placed elsewhere.

Each intent is a conditional write on the job's state and attempt (and, where a verdict could
land meanwhile, on the fault's tally as read): False when a duplicate or a race got there first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import QUEUE_BUCKET, QUEUE_PK, QUEUE_SK
from gpu_recovery.domain import goodput
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.relocation import RelocationWait
from gpu_recovery.domain.restart_wait import RestartWait
from gpu_recovery.domain.states import HEALTH_CHECK_STATES, JobState, SuspectVerdict
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, Update
from gpu_recovery.repository.jobs_and_ranks import SPEND_COUNTER, SPEND_INFRASTRUCTURE, JobsAndRanks


class RestartRepository:
    """Intents of a job's gang restart (``repo.restarts``)."""

    def __init__(self, jobs: JobsAndRanks) -> None:
        self.jobs = jobs
        self.db, self.faults = jobs.db, jobs.faults

    def claim(self, job: Job, *, now: float, deadline_at: float, placement: Update | None = None,
              moves: Mapping[str, Any] | None = None, reason: str = "") -> bool:
        """PENDING_RESTART -> STARTING with attempt + 1 and the intent to start every rank
        (a fan-out of StartTask batches), exactly once per fault. A relocation's placement
        item (node -> target) is written in the same transaction: whoever resumes the launch
        starts every rank where this claim said."""
        new_attempt = job.attempt + 1
        fields: dict[str, Any] = {"attempt": new_attempt, "restarted_attempt": new_attempt,
                                  "restarted_at": now, **self.jobs.job_deadline_fields(deadline_at),
                                  "start_fanout": {"attempt": new_attempt, "at": now}}
        if placement is not None:
            fields["relocated_attempt"] = new_attempt
            fields["relocations"] = [*self._relocations(job.job_id), {
                "at": now, "attempt": new_attempt, "reason": reason[:500],
                "moves": {node: str(m.get("node", "")) for node, m in list((moves or {}).items())[:20]},
                "nodes_moved": len(moves or {})}][-20:]
        owed: dict[str, Any] = {}
        if job.hold_owed in SPEND_COUNTER:
            # A held verdict whose job was never HELD: charged here, once (the condition: still
            # never held; a hold written since charges when it lets the job go on).
            owed = {"increments": {SPEND_COUNTER[job.hold_owed]: 1},
                    "extra_condition": "attribute_not_exists(#bh.#until)",
                    "extra_names": {"#bh": "breaker_hold", "#until": "until"}}
        update = self.jobs.job_transition(
            job.job_id, JobState.STARTING, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=reason or f"gang restart, attempt {new_attempt}", actor="recovery",
            set_fields=fields, ledger=goodput.stop_marks(job.stopped, job.attempt), **owed)
        return self.db.transact([update, placement]) if placement is not None else self.db.apply(update)

    def confirm_running(self, job_id: str, attempt: int, reason: str, actor: str = "recovery",
                        also: Sequence[Update] = (), ledger: Mapping[str, Any] | None = None) -> bool:
        return self.db.transact([self.jobs.job_transition(
            job_id, JobState.RUNNING, from_states=[JobState.STARTING], attempt=attempt,
            reason=reason, actor=actor, remove_fields=[*DEADLINE_ATTRIBUTES, "start_fanout"],
            ledger=ledger), *also])

    def wait_for_placement(self, job: Job, wait: RestartWait, deadline_at: float) -> bool:
        """A restart that could not be placed waits for its nodes (PENDING_RESTART before its
        claim, STARTING after it), once per attempt (a duplicate neither extends nor restarts
        the wait), with a deadline for the sweep's next try. Nothing is charged."""
        return self.db.apply(self.jobs.job_transition(
            job.job_id, job.state, from_states=[job.state], attempt=job.attempt,
            reason=wait.waiting_reason(), actor="recovery",
            set_fields={"restart_wait": wait.to_item(), **self.jobs.job_deadline_fields(deadline_at)},
            extra_condition="attribute_not_exists(#rw) OR #rw.#ra <> :att",
            extra_names={"#rw": "restart_wait", "#ra": "attempt"}))

    def wait_for_relocation(self, job: Job, wait: RelocationWait, deadline_at: float) -> bool:
        """No healthy free node for a relocatable job: it stays PENDING_RESTART with its
        wait (once per fault: a duplicate or late delivery neither extends nor restarts it)
        and a deadline, so the sweep tries again. Nothing is charged."""
        return self.db.apply(self.jobs.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=wait.waiting_reason(), actor="recovery",
            set_fields={"relocation_wait": wait.to_item(), **self.jobs.job_deadline_fields(deadline_at)},
            extra_condition="attribute_not_exists(#rw) OR #rw.#ra <> :att",
            extra_names={"#rw": "relocation_wait", "#ra": "attempt"}))

    def _relocations(self, job_id: str) -> list[dict[str, Any]]:
        item = self.jobs.get_job_item(job_id) or {}
        return list(item.get("relocations") or [])

    def leave_suspects_before_verdict(self, job: Job, nodes: Sequence[str], *, reason: str,
                                      deadline_at: float) -> bool:
        """Spare first: the job leaves its suspect ``nodes`` before their verdicts, at once
        and once per fault: PENDING_HEALTHCHECK -> PENDING_RESTART to relocate (on the tally
        as read, so a verdict landing meanwhile makes one of the two fail), one
        infrastructure recovery charged, each suspect PENDING -> LEFT, and on each node's
        open health check the job moved from ``hc_jobs`` (its verdict no longer waited for)
        to ``hc_left`` (the check goes on for the node; the evidence is on the suspect)."""
        faults = self.faults
        now = clock.now()
        condition, values, names = faults.tally_condition(job)
        updates = [self.jobs.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=[JobState.PENDING_HEALTHCHECK],
            attempt=job.attempt, reason=reason, actor="recovery",
            set_fields={"relocate": True, "restart_reason": reason[:500],
                        "left_before_verdict": {"attempt": job.attempt, "at": now, "nodes": list(nodes)},
                        **self.jobs.job_deadline_fields(deadline_at)},
            increments={"fault.decided": len(nodes), "fault.fatal": len(nodes),
                        SPEND_COUNTER[SPEND_INFRASTRUCTURE]: 1},
            extra_condition=condition, extra_values=values, extra_names=names)]
        left = f"{job.job_id}#{job.attempt}"
        for node in nodes:
            updates.append(faults.decide_suspect(
                job, node, SuspectVerdict.LEFT, findings={"source": "left before the verdict", "at": now},
                record=None, rebooting=False, now=now))
            updates.append(self.jobs.instance_update(
                node, from_states=HEALTH_CHECK_STATES, delete_from_sets={"hc_jobs": {job.job_id}},
                add_to_sets={"hc_left": {left}}, extra_condition="contains(#hcj, :job)",
                extra_values={":job": job.job_id}, extra_names={"#hcj": "hc_jobs"}))
        return self.db.transact(updates)

    def requeue_for_relocation(self, job: Job, *, queue_order: str, relocation: dict[str, Any],
                               reason: str, also: Sequence[Update] = ()) -> bool:
        """A queue job leaves its unusable nodes: PENDING_RESTART -> PENDING_RESOURCES at the
        head of its priority; the scheduler places it on healthy nodes (attempt + 1, a new
        MASTER_ADDR) and records where each rank moved. Every rank of the fault's attempt ended
        (the restart's precondition): its stop intent, if still there, ends with it."""
        return self.db.transact([self.jobs.job_transition(
            job.job_id, JobState.PENDING_RESOURCES, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=reason, actor="recovery",
            set_fields={QUEUE_PK: QUEUE_BUCKET, QUEUE_SK: queue_order, "not_before": 0,
                        "relocation": relocation},
            remove_fields=[*DEADLINE_ATTRIBUTES, "relocate", "launched_at", "launch_claimed_at",
                           "stop_fanout"],
        ), *also])
