"""A relocation's target another scheduler took before the moved ranks started there: moved
again, not waited for.

A relocation chooses a healthy free node for each node its job leaves and reserves it
(``recovery.placement``: a hold, then the ``reserved`` attribute that a scheduler honouring the
placement constraint keeps off). A scheduler that does not honour it, or one that placed a task
between the hold's commit and its attribute (a put that failed waits for the sweep's minute), may
start a task there first; StartTask then refuses the moved rank (``RESOURCE:GPU``). The restart
used to wait for that node up to ``relocation_wait_seconds`` and fail when the other job's task
held it longer (soak seed 7254 at 10 % of calls failing). Now the ranks of the node the job left
get another healthy free node if there is one, chosen as the relocation chose
(``RestartNodes.free_for``) off every node the restart uses, written on the restart's placement
item conditional on the target it replaces (two deliveries move it once) and reserved; the
restart's next send (the sweep's resume) starts them there. With no free node, or a rank of the
attempt started on the taken target already (the node stays the attempt's), the restart waits as
before (``GangRestart.start_failed``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from gpu_recovery.domain.models import Job
from gpu_recovery.domain.rank_template import RankTemplate
from gpu_recovery.domain.states import JobState
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.ports import after_commit
from gpu_recovery.recovery.reactions import FaultSeen, Reactions
from gpu_recovery.recovery.restart_nodes import RestartNodes
from gpu_recovery.recovery.stage_data import HasJobs
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.latches import LatchRepository

logger = logging.getLogger(__name__)


class ReadsJob(Protocol):
    def get_job(self, job_id: str) -> Job | None: ...


class TakenTargetData(HasJobs[ReadsJob], Protocol):
    """The job (still this restart's?), its placement item, the nodes its ranks started on."""

    faults: FaultRepository
    latches: LatchRepository


@dataclass(eq=False, repr=False)
class TakenTargets:
    """``restarts``: what a refused rank of a restart comes to otherwise (a wait, or a failure);
    ``gang``: its launch lease released for the next send."""

    data: TakenTargetData
    nodes: RestartNodes
    restarts: GangRestart
    gang: GangOps
    reactions: Reactions

    def not_placed(self, job: Job, rank: RankTemplate, why: str) -> None:
        """A restart's rank StartTask refused: moved again when its target was taken, else the
        restart's own handling."""
        if why.upper().startswith("RESOURCE") and self.move_again(job, rank):
            self.gang.release_launch(rank, job.attempt)
            return
        self.restarts.start_failed(job, rank, why)

    def move_again(self, job: Job, rank: RankTemplate) -> bool:
        """The ranks of the node ``rank`` leaves moved off ``rank.node``, their taken target,
        to another healthy free node (True too when a delivery of the same refusal moved them
        first; False: not a relocation's target, a rank of the attempt runs there, none free)."""
        fresh = self.data.jobs.get_job(job.job_id)
        if fresh is None or fresh.state is not JobState.STARTING or fresh.attempt != job.attempt \
                or not fresh.relocated or rank.previous is None:
            return False
        leaving, taken = rank.previous.container_inst_id, rank.node
        moves = self.data.faults.placement(fresh.job_id, fresh.attempt)
        move = moves.get(leaving)
        if not move:
            return False  # a node the job kept: it waits for it
        if move.get("node") != taken:
            return True  # moved already: a delivery of the same refusal came first
        if taken in self.data.latches.job_nodes(fresh.job_id, fresh.attempt, fresh.world_size):
            return False  # a rank of the attempt started there: the node stays the attempt's
        # Off every node the restart uses: its kept nodes and targets (a node it left, healthy
        # but blocked when it chose, may take the ranks now).
        uses = self.nodes.nodes_of(fresh) - (set(moves) - {m.get("node", "") for m in moves.values()})
        found = self.nodes.free_for(fresh, [taken], keep_off=uses)
        target = (found.targets or {}).get(taken)
        if target is None:
            return False
        why = f"{move.get('why', '')}; {taken} taken by another task"
        again = {"node": target.node_id, "arn": target.container_instance_arn,
                 "ec2": target.ec2_instance_id, "why": why[-200:]}
        if not self.data.faults.move_again(fresh.job_id, fresh.attempt, leaving, taken, again):
            # Moved already by another delivery (its target is reserved by it)?
            now = self.data.faults.placement(fresh.job_id, fresh.attempt).get(leaving) or {}
            return now.get("node") not in (None, taken)
        logger.warning("relocation target taken: moved again", extra={
            "job_id": fresh.job_id, "leaving": leaving, "taken": taken, "target": target.node_id})
        after_commit("reserve the new target", self.reactions.emit, FaultSeen(fresh))
        return True
