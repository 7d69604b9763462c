"""A fault's suspect nodes: which exits name one (``domain.suspects``), each suspect's check
asked for, and the coupled nodes checked when the fault's checks find nothing (issue 50).

The task-event stage (``recovery.task_events``) judges each rank's stop and hands the
suspects here; the sweep asks for the check of a suspect whose delivery died; the settlement
(``JobSettlement.conclude``) has the coupled nodes checked (``reactions.CoupledToCheck``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import KW_ONLY, dataclass
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS
from gpu_recovery.domain import suspects
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.models import Job, Rank, Suspect
from gpu_recovery.domain.states import RECOVERING_JOB_STATES, JobState
from gpu_recovery.recovery.health_checks import HealthChecks
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.latches import LatchRepository

logger = logging.getLogger(__name__)

# The coupled nodes named suspects by one call (three writes each: bounded, whatever the
# job's size; the rest by the sweep's next minutes), the checks of the first ones requested
# inline; the others' items are due at once, so the sweep's pages of due suspects ask for
# them (as for a suspect whose delivery died), in parallel rather than a few a minute.
COUPLED_PER_STEP = 256
COUPLED_CHECKS_INLINE = 16


@dataclass(eq=False, repr=False)
class FaultSuspects:
    """``check_all_nodes``: every exit of a fault names a suspect (``health_check_all_nodes``)."""

    faults: FaultRepository
    latches: LatchRepository
    health: HealthChecks
    remediation: NodeRemediation
    _: KW_ONLY
    check_all_nodes: bool

    def open(self, job: Job, rank: Rank, record: dict[str, Any]) -> Suspect:
        """The rank's node is a suspect of the job's fault: its item (with the evidence and
        decision, and this rank) exists before anything counts it."""
        now = clock.now()
        return self.faults.open_suspect(job.job_id, job.attempt, rank.container_inst_id, rank=rank.rank,
                                        record=record, now=now, retry_at=now + RETRY_INTERVAL_SECONDS)

    def coupled(self, job: Job, evidence: Evidence, action: Action, remediating: str,
                exited_at: float | None) -> bool:
        """A later exit of the fault with no evidence of its own: its node is checked only if
        the fault's checks find nothing. Every exit is a suspect with
        ``health_check_all_nodes``; an exit the catalog judged by a rule of its own (an XID,
        a GPU signal of its node) or on a node the stack is taking down is one too."""
        if self.check_all_nodes or job.tally.attempt != job.attempt:
            return False
        own = bool(evidence.xids or evidence.gpu_signals or remediating) or action is not Action.HEALTH_CHECK
        return suspects.coupled(exited_at, job.tally.exits, own_evidence=own)

    def note_exit(self, job: Job, exited_at: float | None) -> None:
        """A later suspect's stop time among the fault's first exits, when it is one of them.
        Best effort: a time not written only makes a later exit a suspect too."""
        if exited_at is None or job.tally.attempt != job.attempt:
            return
        exits = suspects.first_exits(job.tally.exits, exited_at)
        if exits == job.tally.exits:
            return
        try:
            self.faults.note_exit(job, exits)
        except Exception:
            logger.warning("the fault's first exits not written", exc_info=True, extra={"job_id": job.job_id})

    def request_check(self, job: Job, inst_id: str, *, grouped: bool = False) -> str:
        """The suspect node's decision: the fast path (definitive evidence), or its health
        check opened (or joined); then its item needs no follow-up from the sweep.
        ``grouped``: a node named only because every node is checked starts its check with
        others of the job (``recovery.health_checks``)."""
        if job.state not in RECOVERING_JOB_STATES:
            return "job_moved_on"
        faults = self.faults
        suspect = faults.get_suspect(job.job_id, job.attempt, inst_id)
        if suspect is not None and not suspect.pending:
            faults.health_check_requested(suspect)
            return "decided"  # a redelivery: its verdict is in already
        marked: list[bool] = []

        def opened() -> None:  # the check is open: its instance's deadline is the sweep's now
            if suspect is not None and not marked:
                faults.health_check_requested(suspect)
                marked.append(True)

        result = self.remediation.fast_path(job, inst_id) or self.health.request(job, inst_id, opened=opened,
                                                                                 grouped=grouped)
        opened()
        return result

    def start_grouped_checks(self, job: Job) -> None:
        """Every rank of the attempt ended: the grouped checks still waiting start now (best
        effort: the sweep's kick starts them within a minute otherwise)."""
        if not (self.check_all_nodes and job.in_fault and job.state in RECOVERING_JOB_STATES):
            return
        try:
            self.health.start_all_waiting(job.job_id)
        except Exception:
            logger.warning("grouped checks not started at the attempt's end", exc_info=True,
                           extra={"job_id": job.job_id})

    def check_coupled(self, job: Job, coupled: Collection[str] | None = None) -> str:
        """The fault's checks found nothing (``FaultTally.escalated``): each node whose rank's
        exit was coupled to it is named a suspect and checked, as every such node was before:
        its item (due: the sweep asks for its check if this dies), its fence, its place among
        the latch's suspects (the raised total counts them), its check (inline for the first
        ``COUPLED_CHECKS_INLINE``, else by the sweep's step for the due item). At most
        ``COUPLED_PER_STEP`` nodes a call; the sweep goes on each minute. ``coupled``: the
        nodes as the settlement read them (None: read from the latch, the sweep's case)."""
        if not job.tally.escalated or job.state is not JobState.PENDING_HEALTHCHECK:
            return "not_escalated"
        attempt = job.tally.attempt
        if coupled is None:
            _, coupled = self.latches.fault_nodes(job.job_id, attempt, job.world_size)
        now = clock.now()
        named = sorted(coupled)[:COUPLED_PER_STEP]
        for index, node in enumerate(named):
            inline = index < COUPLED_CHECKS_INLINE
            suspect = self.faults.open_suspect(job.job_id, attempt, node, rank=None,
                                               record={"at": now, "coupled": True}, now=now,
                                               retry_at=now + RETRY_INTERVAL_SECONDS if inline else now)
            if suspect.pending:
                fence = {"job": job.job_id, "attempt": attempt, "at": now,
                         "why": "coupled exit checked: the first checks found nothing"}
                self.faults.fence_suspect(node, fence)
            self.latches.arrive(job.job_id, attempt, job.world_size, 0, [], suspect_node=node)
            if inline:
                self.request_check(job, node)
        return f"named_{len(named)}_of_{len(coupled)}"
