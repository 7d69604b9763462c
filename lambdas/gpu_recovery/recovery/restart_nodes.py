"""The nodes recoveries hold, and the healthy free nodes a relocation may take.

* :meth:`RestartNodes.held` — node -> the job in recovery holding it. A job holds its nodes
  from the moment its fault is seen (PENDING_HEALTHCHECK, PENDING_RESTART, HELD) until its
  gang restart has placed every rank (STARTING, until RUNNING) or it ends: the nodes of the
  fault's attempt (its latch shards, ``ceil(n / 64)`` reads) and its relocation's targets (the
  placement item). No other placement of the stack's takes them, and they carry the
  ``reserved`` placement value for every other scheduler (``recovery.placement``). For a
  relocation's search, a queue launch in progress (STARTING, its ranks being started) holds the
  nodes its plan gave them too (one read of the plan per launch in progress; not reserved).
  With them: the relocatable jobs waiting for a free node (``RelocationWait``), oldest first.
* :meth:`RestartNodes.free_for` — one cluster snapshot (ListContainerInstances + Describe by
  100, the instance items), then a healthy free node for each node a relocating job leaves
  (``domain.relocation.choose_targets``), among the nodes ECS and the stack agree are free
  (``recovery.free_nodes``): placeable, not held by another recovery, not reserved for a job
  that has waited longer. Nodes already reserved for this job (decided when its fault was
  seen: ``GangRestart.decide_on_fault``) are taken first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_recovery.domain import placement
from gpu_recovery.domain.models import Job, Rank, container_instance_id
from gpu_recovery.domain.relocation import RelocationWait, SpareNode, choose_targets, reserve_for_waits
from gpu_recovery.domain.states import UNUSABLE_INSTANCE_STATES, JobState
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.free_nodes import LiveRanksOnNodes, unhandled_stops, views
from gpu_recovery.recovery.ports import ListsContainerInstances
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsInstances
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.scheduling import SchedulingRepository

_AGREE_ROUNDS = 3  # targets ECS and the records disagree on are dropped, the choice made again


@dataclass
class Held:
    """What recoveries hold: node -> job, and the relocation waits."""

    nodes: dict[str, str] = field(default_factory=dict)
    waits: list[RelocationWait] = field(default_factory=list)
    jobs: set[str] = field(default_factory=set)  # the jobs holding nodes

    def with_reserved(self, holds: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """node -> job: the recovering jobs' nodes, and what is reserved for them already
        (the target a relocation chose when its fault was seen stays its own; a node two
        recoveries hold stays the one's that reserved it first)."""
        kept = {n: str(h.get("job")) for n, h in holds.items()
                if h.get("why") == placement.RESERVED and h.get("job") in self.jobs}
        return {**self.nodes, **kept}


def recovering_nodes(latches: LatchRepository, faults: FaultRepository, job: Job) -> set[str]:
    """The nodes ``job`` holds while it recovers: its fault's attempt's (its latch shards),
    the attempt before while its gang restart is not placed yet, its relocation's targets (the
    placement item). The recovery's placements and the queue's tick both keep off them."""
    nodes = set(latches.job_nodes(job.job_id, job.attempt, job.world_size))
    restarting = job.state is JobState.STARTING and job.restarted_attempt == job.attempt
    if restarting and job.attempt > 1:
        nodes |= latches.job_nodes(job.job_id, job.attempt - 1, job.world_size)
    if job.relocated:
        nodes.update(m.get("node", "") for m in faults.placement(job.job_id, job.attempt).values())
    nodes.discard("")
    return nodes


@dataclass
class FreeFor:
    """A relocation's choice: the target of each node it leaves (None: not enough free), the
    GPUs each leaving node held, and the healthy nodes it may use, free GPUs or not (a lent
    spare among them may be taken back)."""

    targets: dict[str, SpareNode] | None
    gpus: list[int]
    healthy: dict[str, SpareNode]
    #: ranks recorded on a node chosen whose GPUs ECS shows free (their stop not handled yet)
    unhandled: list[Rank] = field(default_factory=list)


class HeldJobReads(LiveRanksOnNodes, Protocol):
    """A job holding nodes (its index item), the ranks recorded on a node ECS shows free."""

    def job_from_item(self, item: dict[str, Any]) -> Job: ...


class NodesHeldData(HasJobs[HeldJobReads], HasInstances[ReadsInstances], Protocol):
    """Where each job's ranks ran (the latches), its fault's moves, the holds, the nodes' records."""

    latches: LatchRepository
    faults: FaultRepository
    cordons: CordonRepository


@dataclass(eq=False, repr=False)
class RestartNodes:
    """``scheduling``: the jobs holding nodes (its index)."""

    data: NodesHeldData
    scheduling: SchedulingRepository
    ecs: ListsContainerInstances

    # ------------------------------------------------------------------ held
    def nodes_of(self, job: Job) -> set[str]:
        """The nodes ``job`` holds while it recovers (:func:`recovering_nodes`)."""
        return recovering_nodes(self.data.latches, self.data.faults, job)

    def unusable_and_reserved(self, job: Job) -> tuple[list[str], dict[str, str]]:
        """The nodes of ``job``'s attempt another fault made unusable, and those reserved for
        another job's recovery (node -> why: a user's scheduler placed a rank of this job on a
        node freed before its reservation's attribute was put; the recovery that held it first
        keeps it): the latch shards, then the nodes' items with their holds (one BatchGetItem)."""
        nodes = self.data.latches.job_nodes(job.job_id, job.attempt, job.world_size)
        if not nodes:
            return [], {}
        instances, holds = self.data.cordons.instances_and_holds(nodes)
        unusable = sorted(i for i, inst in instances.items() if inst.state in UNUSABLE_INSTANCE_STATES)
        others = {n: placement.reserved_for_another(h, job.job_id) for n, h in holds.items()}
        return unusable, {n: f"reserved for the recovery of job {o}" for n, o in others.items() if o}

    def held(self, except_job: str = "", *, launches: bool = False,
             deadline_items: Sequence[Mapping[str, Any]] | None = None) -> Held:
        """node -> the job in recovery holding it (but ``except_job``), and the relocation
        waits: read once per relocation or holds refresh, never per event
        (``deadline_items``: the job table's deadline index as the sweep just read it).
        ``launches``: the queue launches in progress hold nodes too (a relocation's search); the
        placement holds leave them out (their nodes are not reserved for a recovery)."""
        out = Held()
        for item in self.scheduling.jobs_holding_nodes(deadline_items):
            other = self.data.jobs.job_from_item(item)
            launching = bool(self.scheduling.launches_in_progress([item]))
            if other.job_id == except_job or (launching and not launches):
                continue
            out.jobs.add(other.job_id)
            # A queue launch in progress: the nodes its plan gave its ranks (one read of the plan
            # per launch in progress), started or not yet.
            planned = self.scheduling.planned_nodes(item) if launching else set()
            for node in sorted(self.nodes_of(other) | planned):
                out.nodes.setdefault(node, other.job_id)
            if other.relocation_wait is not None and other.state is JobState.PENDING_RESTART:
                out.waits.append(other.relocation_wait)
        return out

    # -------------------------------------------------------------- free for
    def free_for(self, job: Job, leaving: list[str], keep_off: Collection[str] = ()) -> FreeFor:
        """A healthy free node for each node of ``leaving`` (see the module docstring), none of
        ``keep_off``. Reads only, so taken again at once when a call fails: a waiting
        relocation's minute lost to one failed read left a node that freed in it to another
        scheduler (soak seed 7210, 6 %)."""
        return twice(lambda: self._free_for(job, leaving, keep_off))

    def _free_for(self, job: Job, leaving: list[str], keep_off: Collection[str]) -> FreeFor:
        repo = self.data
        described = self.ecs.container_instances()
        ids = [container_instance_id(ci["containerInstanceArn"]) for ci in described]
        cluster = views(described, repo.instances.get_instances(ids) if ids else {})
        held = self.held(job.job_id, launches=True)
        own = repo.latches.job_nodes(job.job_id, job.attempt, job.world_size)
        registered = {v.node_id: v.node.total_gpus for v in cluster}
        candidates = [v.node for v in cluster if v.placeable and v.node_id not in held.nodes
                      and v.node_id not in own and v.node_id not in leaving and v.node_id not in keep_off]
        mine = job.relocation_wait
        first = [w for w in held.waits if mine is None or (w.since, w.job_id) < (mine.since, mine.job_id)]
        reserved = reserve_for_waits(first, candidates)
        spares = [s for s in candidates if s.node_id not in reserved]
        healthy = {s.node_id: s for s in spares}
        gpus = [registered.get(node, 0) or 1 for node in leaving]
        holds = repo.cordons.worklist().holds
        decided = {n for n, j in placement.reserved_of(holds).items() if j == job.job_id}
        unhandled: list[Rank] = []
        for _ in range(_AGREE_ROUNDS):
            needs = dict(enumerate(gpus))
            # The nodes reserved for this job when its fault was seen first, then any.
            chosen = choose_targets(needs, [s for s in spares if s.node_id in decided]) \
                or choose_targets(needs, spares)
            if chosen is None:
                return FreeFor(None, gpus, healthy, unhandled)
            disagree = unhandled_stops(repo.jobs, chosen.values())
            if not disagree:
                return FreeFor({leaving[index]: node for index, node in chosen.items()}, gpus, healthy,
                               unhandled)
            unhandled += [r for ranks in disagree.values() for r in ranks]
            spares = [s for s in spares if s.node_id not in disagree]
            healthy = {n: s for n, s in healthy.items() if n not in disagree}
        return FreeFor(None, gpus, healthy, unhandled)
