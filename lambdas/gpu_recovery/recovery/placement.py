"""Placement holds: which nodes are reserved or spare now, so that every scheduler keeps off
them (``domain.placement``: the ``gpu-recovery.unavailable`` attribute).

The holds are derived state:

* **reserved for a recovering job** — every node of a job from the moment its fault is seen
  until its restart has placed every rank (or it ends), busy or free: its healthy nodes for
  its restart, its suspect ones for their checks, the targets its relocation chose
  (``RestartNodes.held``). A scheduler that places as soon as a node frees never takes them.
  :meth:`on_fault` puts them in the invocation that sees the fault (before the gang's stops);
  :meth:`refresh` keeps them and lets them go once the restart is placed;
* **reserved for a waiting relocation** — the free nodes a relocatable job waiting for room
  will take (``reserve_for_waits``);
* **spare** — the ``spare_nodes`` pool: wholly free healthy nodes, and when too few are free,
  the next nodes to become spares marked while still busy (their running work untouched, the
  attribute keeping new work off: ``domain.placement.next_spares``), so that the pool refills
  in a cluster another scheduler keeps full.

They are recomputed by :meth:`refresh`:

* by the sweep, every minute (``Cordons.sweep`` runs it first, then syncs every node whose
  attributes are not confirmed: a dead refresh or sync is finished there);
* in the invocation that sees a fault (:meth:`on_fault`, after the job's own reservation, when
  a spare pool is configured: the spare a relocation was given is replaced at once) and after a
  restart is placed (:meth:`after_restart`);
* on a task's STOPPED event (:meth:`on_task_stopped`) of a node that may have freed: the
  relocation waiting for it tries again at once, a short pool refills. Container-instance
  events of free nodes invoke nothing (issue 40: the rule matches only rebooting nodes; that
  path cost two invocations per rank of every gang restart).

A change of holds is committed first (the worklist item, conditional on its revision, with the
changed nodes' sync members), then synced (``Cordons.sync_many``: PutAttributes /
DeleteAttributes of up to 10 nodes a call, idempotent), then confirmed. A node that becomes a
spare or a wait's reservation while ECS shows it free is taken only if ECS and the stack agree
it is free (``recovery.free_nodes``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain import placement
from gpu_recovery.domain.models import Job, container_instance_id
from gpu_recovery.domain.relocation import SpareNode, gpu_count
from gpu_recovery.domain.states import HEALTH_CHECK_STATES
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.free_nodes import LiveRanksOnNodes, unhandled_stops, views
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.ports import ListsContainerInstances
from gpu_recovery.recovery.reactions import HOLDS_SYNCING
from gpu_recovery.recovery.restart_nodes import RestartNodes
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsInstances
from gpu_recovery.repository.cordons import CordonRepository, Worklist
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

_WANTED = "spares_wanted"  # the pool's size at the last refresh (an event has no cluster count)
_ROUNDS = 3  # nodes ECS and the records disagree on are left out, the plan made again
_RELOCATED = ("restarted", "restarting", "restarted_partly")


class HoldData(HasJobs[LiveRanksOnNodes], HasInstances[ReadsInstances], Protocol):
    """The holds (on the cordon worklist), the nodes' records, the ranks recorded on a node
    ECS shows free."""

    cordons: CordonRepository


@dataclass(eq=False, repr=False)
class PlacementHolds:
    data: HoldData
    ecs: ListsContainerInstances
    cordons: Cordons
    restarts: GangRestart
    nodes: RestartNodes  # the restarts' free nodes and the holds on them
    _: KW_ONLY
    settings: Settings

    # ------------------------------------------------------------------ refresh
    def refresh(self, read: Worklist | None = None,
                job_deadlines: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Bring the holds up to date with the cluster: the recovering jobs' nodes (one read
        of the jobs in recovery and their latch shards), and, with a pool or a relocation
        waiting, one snapshot (ListContainerInstances + DescribeContainerInstances by 100, the
        instance items) for the free and busy nodes. ``read``: the worklist as the caller
        just read it (the sweep's), else read here; ``job_deadlines`` likewise, the job
        table's deadline index (the jobs holding nodes). Answers ``no_holds`` or
        ``holds_unchanged`` only when it wrote nothing."""
        repo = self.data
        read = read or repo.cordons.worklist()
        held = self.nodes.held(deadline_items=job_deadlines)
        pool = self.settings.spare_nodes
        recovering = held.with_reserved(read.holds)
        # Spares and waits' reservations need the cluster's free and busy nodes; the
        # recovering jobs' reservations do not (nor does letting a stale one go).
        snapshot = pool.configured or bool(held.waits) or any(
            h.get("why") == placement.SPARE for h in read.holds.values())
        if not snapshot and not recovering and not read.holds:
            return "no_holds"
        free: list[SpareNode] = []
        busy: list[SpareNode] = []
        placeable: set[str] = set()  # healthy and placeable, free GPUs or not (a lent spare's)
        size = 0
        if snapshot:
            described = self.ecs.container_instances()
            ids = [container_instance_id(ci["containerInstanceArn"]) for ci in described]
            for view in views(described, repo.instances.get_instances(ids) if ids else {}):
                if not view.placeable or view.node_id in recovering:
                    continue
                placeable.add(view.node_id)
                if view.node.free_gpus > 0:
                    free.append(view.node)
                if view.node.free_gpus < view.node.total_gpus:
                    busy.append(view.node)
            gpu_nodes = sum(1 for ci in described if gpu_count(ci.get("registeredResources")) > 0)
            size = pool.size(gpu_nodes)
            if size > placement.MAX_HOLDS:
                logger.warning("spare pool capped: the holds fit one DynamoDB item", extra={
                    "spare_nodes": str(pool), "gpu_nodes": gpu_nodes, "spares_wanted": size,
                    "max_holds": placement.MAX_HOLDS})
        wanted: dict[str, dict[str, str]] = {}
        for _ in range(_ROUNDS):
            wanted = placement.plan_holds(spares_wanted=size, current=read.holds, free=free, waits=held.waits,
                                          placeable=placeable, recovering=recovering, busy=busy)
            # A free node that becomes a spare or a wait's reservation: ECS and the stack agree?
            fresh = [n for n in free if n.node_id in wanted and n.node_id not in read.holds
                     and n.node_id not in recovering]
            disagree = unhandled_stops(repo.jobs, fresh) if fresh else {}
            if not disagree:
                break
            free = [n for n in free if n.node_id not in disagree]
            busy = [n for n in busy if n.node_id not in disagree]
        changes: dict[str, Mapping[str, Any] | None] = dict(placement.hold_changes(read.holds, wanted))
        releasing = sorted(n for n, h in changes.items() if h is None)
        if releasing:
            # A suspect whose check has not answered keeps its hold (its job moved on or
            # ended): the node carries an attribute from its fault until its verdict's cordon.
            for node, instance in repo.instances.get_instances(releasing).items():
                if instance.fenced or instance.state in HEALTH_CHECK_STATES:
                    del changes[node]
        if not changes:
            return "holds_unchanged"
        return self._commit(read, {n: (None if h is None else {**h, _WANTED: size})
                                   for n, h in changes.items()})

    def _commit(self, read: Worklist, changes: Mapping[str, Mapping[str, Any] | None],
                quietly: bool = True, syncing_for: str = "", committed: list[float] | None = None,
                also_sync: Sequence[str] = ()) -> str:
        """``changes`` committed on ``read`` (``syncing_for``: the job whose reservation this
        invocation puts; the try's time noted in ``committed``) and their attributes synced, with
        ``also_sync``'s (a failed sync left to the sweep, or raised when not ``quietly``: the
        caller tries again)."""
        now = clock.now()
        if committed is not None:
            committed.append(now)  # before the write: its answer may be lost, the write made
        if not self.data.cordons.set_holds(read, changes, now, syncing_for):
            return "holds_raced"  # another refresh won: the next one starts from its holds
        logger.info("placement holds changed", extra={
            "held": {n: (h or {}).get("why", "released") for n, h in sorted(changes.items())}})
        if quietly:
            self.cordons.sync_many_quietly([*changes, *also_sync])
        else:
            self.cordons.sync_many([*changes, *also_sync])
        return "holds_changed"

    # ------------------------------------------------------------------- a fault
    def on_fault(self, job: Job, failing_node: str = "", *, joining: bool = False) -> str:
        """The invocation that sees a job's fault: its nodes reserved for it at once (before
        its other ranks are stopped and their nodes free), busy or not, one write and one
        sync, tried once more at once when a call fails or another writer raced it (the stops
        free the nodes within seconds: the sweep's refresh a minute on may find another
        scheduler's task there); with a spare pool, the spare its relocation may take is
        decided here too (``GangRestart.decide_on_fault``) and the pool refilled. A step that
        fails again is left to the sweep's refresh (the job in recovery is the intent).
        HOLDS_SYNCING when another invocation's reservation is still being put (it sends the
        job's stop once it is); ``joining`` (an event of a fault already seen): first asked of
        ``failing_node``'s worklist shard alone, one item, not the sixteen (thousands of exits
        of a large gang land while its reservation is being put)."""
        if joining and failing_node and self.data.cordons.worklist_of(failing_node).being_put(
                job.job_id, clock.now(), failing_node):
            return HOLDS_SYNCING
        committed: list[float] = []
        try:
            reserved = action = twice(partial(self._reserve_nodes_of, job, failing_node, committed),
                                      done=lambda done: done != "holds_raced")
        except Exception:
            if committed:  # given up: the next invocation that sees the fault puts them
                self._stop_syncing(job.job_id, committed[-1])
            raise
        if self.settings.spare_nodes.configured:
            decided = self.restarts.decide_on_fault(job)
            if decided:
                action = self.reserve(job.job_id, decided)
            action = self.refresh()
        return HOLDS_SYNCING if reserved == HOLDS_SYNCING else action

    def _reserve_nodes_of(self, job: Job, failing_node: str, committed: list[float]) -> str:
        """The job's nodes (and ``failing_node``, its failing rank's) reserved for it and their
        attributes put (a sync that fails is raised: the try again syncs what this one
        ``committed``, pending). HOLDS_SYNCING while another invocation's reservation of them
        is being put by it (within ``SYNC_LEASE_SECONDS``), nothing read but the holds when
        ``failing_node`` is among them: a large gang's ranks exiting meanwhile, thousands at
        8,192 tasks, neither read its nodes nor put them again."""
        read = self.data.cordons.worklist()
        held = {n for n, h in read.holds.items() if h.get("job") == job.job_id}
        leased = not committed and read.being_put(job.job_id, clock.now())
        if leased and failing_node in held:
            return HOLDS_SYNCING
        nodes = sorted(self.nodes.nodes_of(job) | ({failing_node} if failing_node else set()))
        changes: dict[str, Mapping[str, Any] | None] = {}
        for node in nodes:
            hold = read.holds.get(node) or {}
            # A node another recovery reserved first stays its own (``reserved_for_another``).
            if not (hold.get(placement.LENT) or node in held
                    or placement.reserved_for_another(hold, job.job_id)):
                changes[node] = _reserved(job.job_id, hold)
        unsynced = [n for n in nodes if n in held and read.pending.get(n)]
        if changes:  # this invocation puts every pending node of the job's reservation
            return self._commit(read, changes, quietly=False, syncing_for=job.job_id, committed=committed,
                                also_sync=unsynced)
        if leased:
            return HOLDS_SYNCING
        if unsynced:
            self.cordons.sync_many(unsynced, read)
        return "holds_unchanged"

    def _stop_syncing(self, job_id: str, at: float) -> None:
        try:
            self.data.cordons.stop_syncing(job_id, at)
        except Exception:  # its lease ends in SYNC_LEASE_SECONDS anyway
            logger.warning("reservation's sync lease not released", exc_info=True, extra={"job_id": job_id})

    def reserve(self, job_id: str, nodes: Sequence[str]) -> str:
        """``nodes`` (a relocation's targets, decided) reserved for ``job_id`` now."""
        read = self.data.cordons.worklist()
        changes: dict[str, Mapping[str, Any] | None] = {
            n: _reserved(job_id, read.holds.get(n))
            for n in nodes if (read.holds.get(n) or {}).get("job") != job_id}
        return self._commit(read, changes) if changes else "holds_unchanged"

    def after_restart(self, job_id: str) -> str:
        """A restart placed every rank (or the job ended): its reservations go, a target it
        did not use goes back to the pool (one refresh: the node keeps an attribute all along)."""
        holds = self.data.cordons.worklist().holds
        if not any(h.get("job") == job_id for h in holds.values()):
            return "no_holds"
        return self.refresh()

    # ------------------------------------------------------------------- events
    def on_task_stopped(self, container_instance_arn: str, job_id: str = "") -> str:
        """A task stopped on a node (any task's STOPPED event; ``job_id``: the job it was a
        rank of, if any; one read of the holds). The node may be free: the job it is reserved
        for, waiting for it, tries its restart again at once (not on its own ranks' stops:
        the last of those moves it on anyway); a node marked to become a spare is one now
        (nothing to do); a short pool refills."""
        if not container_instance_arn:
            return "no_node"
        node = container_instance_id(container_instance_arn)
        read = self.data.cordons.worklist()
        hold = read.holds.get(node) or {}
        waiting = str(hold.get("job") or "") if hold.get("why") == placement.RESERVED else ""
        if waiting and waiting != job_id:
            outcome = self.restarts.try_restart(waiting)
            return "relocated" if outcome.action in _RELOCATED else f"reserved_{outcome.action}"
        pool = self.settings.spare_nodes
        spares = placement.spares_of(read.holds)
        wanted = max([int(h.get(_WANTED) or 0) for h in read.holds.values()] or [pool.count or 1])
        # A node that frees while the pool is short, or counts a node still busy, becomes a
        # spare at once (before any scheduler's next placement); the busy mark goes.
        if pool.configured and not hold and (len(spares) < wanted or placement.next_spares_of(read.holds)):
            return self.refresh()
        return "nothing_to_do"


def _reserved(job_id: str, hold: Mapping[str, Any] | None) -> dict[str, str]:
    return {"why": placement.RESERVED, "job": job_id, "arn": str((hold or {}).get("arn") or "")}
