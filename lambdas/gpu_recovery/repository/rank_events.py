"""What a rank's task event records on its job (``recovery.task_events``): the rank running,
the rank stopped, and the job's reaction written in the same transaction as the stop (the
fault entered, or a restart in place), the running interval's mark on the goodput ledger.

The preflight's handover enters recovery as a rank's fault does, and its rounds mark the
running interval the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_recovery.domain import goodput
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import JobState, RankState
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.jobs_and_ranks import SPEND_COUNTER, JobsAndRanks, RankStop


class RankEventRepository:
    """Intents of a rank's task events on its job (``repo.rank_events``)."""

    def __init__(self, jobs: JobsAndRanks) -> None:
        self.jobs = jobs
        self.db = jobs.db

    def mark_running(self, rank: Rank, at: float | None = None) -> bool:
        """STARTING -> RUNNING (``at``: its task's RUNNING time, the goodput ledger's restart end)."""
        return self.db.apply(self.jobs.rank_update(
            rank, RankState.RUNNING, from_states=[RankState.STARTING],
            set_fields={"running_at": at} if at is not None else None))

    def record_stop(self, stop: RankStop) -> bool:
        """The rank's stop alone (the job's reaction needs no write), with its node's fence."""
        updates = self.jobs.rank_stop_updates(stop)
        return self.db.transact(updates) if stop.fence else self.db.apply(updates[0])

    def enter_recovery(self, job_id: str, attempt: int, *, from_states: Iterable[JobState], reason: str,
                       now: float, deadline_at: float, rank_stop: RankStop | None = None,
                       actor: str = "recovery", ledger: Mapping[str, Any] | None = None,
                       opened_by: str = "", exited_at: float | None = None,
                       also: Sequence[Update] = ()) -> bool:
        """The first suspect of a fault: job -> PENDING_HEALTHCHECK with a fresh tally
        (``opened_by``: what opened it when not a rank's end, ``FaultTally.opened_by``;
        ``exited_at``: when the rank that opened it stopped, the fault's first exit) and the
        intent to stop every other rank (with the rank's stop in the same transaction, so a
        retry never finds one written without the other; ``also``: what else the fault's
        entry commits, e.g. its suspect's latch arrival). The suspect itself is an item of
        its own (``FaultRepository.open_suspect``), written before."""
        job = self.jobs.job_transition(
            job_id, JobState.PENDING_HEALTHCHECK, from_states=from_states, attempt=attempt,
            reason=reason, actor=actor,
            set_fields={"fault": FaultTally(attempt=attempt, opened_by=opened_by,
                                            exits=() if exited_at is None else (exited_at,)).to_item(),
                        "fault_started_at": now, "last_error": reason[:1000],
                        **self.jobs.stop_fanout_fields(attempt, reason, now),
                        # In the deadline index while in recovery: the queue scheduler holds
                        # the job's nodes, and the sweep finishes what a delivery left undone.
                        **self.jobs.job_deadline_fields(deadline_at)},
            remove_fields=["relocate", "restart_reason"], ledger=ledger,
        )
        return self.jobs.commit_with_rank_stop(job, rank_stop, also)

    def restart_in_place(self, job: Job, *, from_states: Iterable[JobState], reason: str, now: float,
                         deadline_at: float, spend: str, restart_reason: str,
                         rank_stop: RankStop | None = None,
                         last_fault: dict[str, Any] | None = None,
                         ledger: Mapping[str, Any] | None = None) -> bool:
        """A fault that needs no node action (an application error within its budget, a
        transient fault): job -> PENDING_RESTART on the same nodes, the budget charged, every
        other rank to be stopped, with the rank's stop in the same transaction."""
        fields: dict[str, Any] = {
            "fault": FaultTally(attempt=job.attempt).to_item(), "fault_started_at": now,
            "last_error": reason[:1000], "restart_reason": restart_reason[:500],
            **self.jobs.stop_fanout_fields(job.attempt, reason, now),
            **self.jobs.job_deadline_fields(deadline_at)}
        if last_fault is not None:
            fields["last_fault"] = last_fault
        update = self.jobs.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=from_states, attempt=job.attempt,
            reason=reason, actor="recovery", set_fields=fields,
            increments={SPEND_COUNTER[spend]: 1} if spend else None,
            remove_fields=["relocate"], ledger=ledger,
        )
        return self.jobs.commit_with_rank_stop(update, rank_stop)

    def mark_running_interval(self, job_id: str, attempt: int, *, cause: str, until: float,
                              reason: str) -> bool:
        """A RUNNING job's ledger mark (``goodput.interval_marks``): the RUNNING time of
        ``attempt`` so far was ``cause`` until ``until``. Once per attempt and cause (a
        redelivery finds it written: ``gp_<cause>_attempt`` on the item); nothing when the job
        left RUNNING or that attempt."""
        once_key = goodput.interval_mark_attribute(cause)
        update = self.jobs.job_transition(
            job_id, JobState.RUNNING, from_states=[JobState.RUNNING], attempt=attempt, reason=reason,
            actor="recovery", set_fields={once_key: attempt},
            extra_condition="attribute_not_exists(#once) OR #once < :att", extra_names={"#once": once_key},
            ledger=goodput.interval_marks(cause, until))
        return self.db.apply(update)
