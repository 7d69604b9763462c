"""One tick's decisions for the queue, in queue order: quota, gang admission, preemption.

Pure (no I/O, no clock): the scheduler feeds it the node snapshot, the users' quotas and
(lazily) the running gangs, offers the waiting jobs in queue order and carries out each
:class:`Step`; the benchmark's simulated day drives the very same planner.

For each job offered:

1. **Quota**: a job that would take its user over the node quota of its level waits
   (``QUOTA``); it reserves nothing and preempts nothing.
2. **Admission** (:class:`~gpu_recovery.queue.admission.Admitter`): all ranks placed now
   (``ADMIT``), or the job is blocked and reserves nodes, or it is too large for the
   eligible cluster.
3. **Preemption** of a blocked job: the running queue jobs of strictly lower priority
   whose suspension makes room (``domain.time_sharing.choose_victims``) are suspended
   (``PREEMPT``); the blocked job keeps its reservation and starts on a later tick, once
   they stopped. Jobs already being suspended for it count first, so a job never
   preempts twice for the same room. A gang is a victim once per tick, and nodes freed
   for one job are not counted for another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from gpu_recovery.domain.time_sharing import (
    PreemptionLedger,
    Preemptor,
    QuotaBook,
    RunningGang,
    choose_victims,
)
from gpu_recovery.queue.admission import Admitter, Candidate, Node, Verdict


@dataclass(frozen=True)
class QueuedJob:
    """A waiting job as the planner sees it."""

    job_id: str
    user: str  # quota subject of its owner
    priority: int
    nnodes: int
    gpus_per_node: int
    relocated: bool = False  # back in the queue after a node fault: may take hot spares
    borrows_spares: bool = False  # LOW, lending on: may run on a spare lent to it


class StepKind(str, Enum):
    ADMIT = "ADMIT"  # start now on ``nodes`` (rank i on nodes[i])
    QUOTA = "QUOTA"  # its user's quota at its level is full: waits, reserves nothing
    BLOCKED = "BLOCKED"  # does not fit; reserved ``nodes``
    TOO_LARGE = "TOO_LARGE"  # cannot fit on the eligible cluster even when empty
    PREEMPT = "PREEMPT"  # blocked; ``victims`` are to be suspended to make room


@dataclass(frozen=True)
class Step:
    kind: StepKind
    job_id: str
    nodes: tuple[str, ...] = ()
    victims: tuple[str, ...] = ()
    waiting_for: tuple[str, ...] = ()  # jobs already being suspended for it
    reason: str = ""


RunningProvider = Callable[[int], Sequence[RunningGang]]


class TickPlanner:
    def __init__(self, nodes: Mapping[str, Node], quotas: QuotaBook,
                 running: RunningProvider | None = None, *, preemption: bool = True) -> None:
        self.admitter = Admitter(nodes)
        self.quotas = quotas
        self._running = running
        self.preemption = preemption and running is not None
        self.ledger = PreemptionLedger()
        self._preempted_for: dict[str, str] = {}  # victim -> job it was suspended for (this tick)

    @property
    def exhausted(self) -> bool:
        return self.admitter.exhausted

    def offer(self, job: QueuedJob) -> Step:
        refusal = self.quotas.refusal(job.user, job.priority, job.nnodes)
        if refusal:
            return Step(StepKind.QUOTA, job.job_id, reason=refusal)
        reserved_before = set(self.admitter.reserved)
        decision = self.admitter.offer(Candidate(job.job_id, job.nnodes, job.gpus_per_node, job.priority,
                                                 job.relocated, job.borrows_spares))
        if decision.verdict is Verdict.ADMITTED:
            self.quotas.charge(job.user, job.priority, job.nnodes)
            return Step(StepKind.ADMIT, job.job_id, decision.nodes)
        if decision.verdict is Verdict.TOO_LARGE:
            return Step(StepKind.TOO_LARGE, job.job_id, reason=decision.reason)
        blocked = Step(StepKind.BLOCKED, job.job_id, decision.nodes, reason=decision.reason)
        if not self.preemption:
            return blocked
        return self._preempt(job, blocked, reserved_before)

    def hold(self, job: QueuedJob) -> tuple[str, ...]:
        """A job backing off keeps its place: reserves what it would take, within its quota,
        preempting nothing (``queue.admission.holds_in_backoff``)."""
        if self.quotas.refusal(job.user, job.priority, job.nnodes):
            return ()
        return self.admitter.hold(Candidate(job.job_id, job.nnodes, job.gpus_per_node, job.priority,
                                            job.relocated, job.borrows_spares))

    def _preempt(self, job: QueuedJob, blocked: Step, reserved_before: set[str]) -> Step:
        assert self._running is not None
        free = self.admitter.free
        # Nodes held for jobs ahead of this one (their reservations, their victims' nodes)
        # are not this job's to free.
        taken = reserved_before | self.ledger.claimed
        if not job.relocated:
            taken = taken | self.admitter.spares  # room it could not use
        available = {n: gpus for n, gpus in free.items() if n not in taken}
        capacity = {n: self.admitter.nodes[n].capacity for n in available}
        gangs = [self._as_of_tick(g) for g in self._running(job.priority)]
        choice = choose_victims(
            Preemptor(job.job_id, job.user, job.priority, job.nnodes, job.gpus_per_node),
            available, capacity, gangs)
        if choice is None:
            return blocked
        pending = {g.job_id: g for g in gangs}
        for victim in (*choice.victims, *choice.waiting_for):
            gang = pending.get(victim)
            if gang is not None:
                self.ledger.claimed.update(gang.footprint)
        if not choice.victims:
            return Step(StepKind.BLOCKED, job.job_id, blocked.nodes, waiting_for=choice.waiting_for,
                        reason=f"{blocked.reason}; {choice.reason}")
        for victim in choice.victims:
            self.ledger.suspended.add(victim)
            self._preempted_for[victim] = job.job_id
        return Step(StepKind.PREEMPT, job.job_id, blocked.nodes, victims=choice.victims,
                    waiting_for=choice.waiting_for, reason=choice.reason)

    def _as_of_tick(self, gang: RunningGang) -> RunningGang:
        """A gang chosen as a victim earlier in this tick is already being suspended."""
        by = self._preempted_for.get(gang.job_id)
        if by is None or gang.preempted_for:
            return gang
        return RunningGang(gang.job_id, gang.user, gang.priority, gang.started_at, gang.footprint, by)
