"""Placement holds: which nodes are spare or reserved now, so that every scheduler keeps off
them (``domain.placement``: the ``gpu-recovery.unavailable`` attribute).

The holds are derived state, recomputed from one cluster snapshot by :meth:`refresh`:

* by the sweep, every minute (``Cordons.sweep`` runs it first, then syncs every node whose
  attributes are not confirmed: a dead refresh or sync is finished there): a node that
  frees (a lent spare included) is reserved for a waiting relocation, or joins a short
  spare pool, within a minute, and the waiting relocation takes it at its own next try
  (the sweep's, every minute). The container-instance events of free nodes no longer
  invoke anything (issue 40: the rule matches only rebooting nodes; the event path cost
  two invocations per rank of every gang restart to save that minute);
* after a relocation claimed nodes (:meth:`release`: their holds end without a snapshot).

A change of holds is committed first (the worklist item, conditional on its revision, with
the changed nodes' sync members), then synced (``Cordons.sync``: PutAttributes /
DeleteAttributes, idempotent), then confirmed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery import clock
from gpu_recovery.domain import placement
from gpu_recovery.domain.models import container_instance_id
from gpu_recovery.domain.relocation import SpareNode, gpu_count
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.ports import Deps

logger = logging.getLogger(__name__)

_WANTED = "spares_wanted"  # the pool's size at the last refresh (an event has no cluster count)


class PlacementHolds:
    def __init__(self, deps: Deps, cordons: Cordons, restarts: GangRestart) -> None:
        self.deps = deps
        self.cordons = cordons
        self.restarts = restarts

    # ------------------------------------------------------------------ refresh
    def refresh(self) -> str:
        """Bring the holds up to date with the cluster (one snapshot: ListContainerInstances
        + DescribeContainerInstances by 100, the instance items, the jobs in recovery)."""
        repo = self.deps.repo
        read = repo.cordons.worklist()
        held, waits = self.restarts.held_by_recoveries()
        pool = self.deps.settings.spare_nodes
        if not pool.configured and not waits and not read.holds:
            return "no_holds"
        described = self.deps.ecs.container_instances()
        ids = [container_instance_id(ci["containerInstanceArn"]) for ci in described]
        states = repo.get_instances(ids) if ids else {}
        free: list[SpareNode] = []
        placeable: set[str] = set()  # healthy and placeable, free GPUs or not (a lent spare's)
        for ci, node_id in zip(described, ids, strict=True):
            instance = states.get(node_id)
            if ci.get("status") != "ACTIVE" or not ci.get("agentConnected") or node_id in held \
                    or (instance is not None and (instance.state is not InstanceState.AVAILABLE
                                                  or instance.cordoned)):
                continue
            placeable.add(node_id)
            remaining = gpu_count(ci.get("remainingResources"))
            if remaining > 0:
                free.append(SpareNode(node_id, ci["containerInstanceArn"], str(ci.get("ec2InstanceId", "")),
                                      remaining, gpu_count(ci.get("registeredResources"))))
        gpu_nodes = sum(1 for ci in described if gpu_count(ci.get("registeredResources")) > 0)
        size = pool.size(gpu_nodes)
        if size > placement.MAX_HOLDS:
            logger.warning("spare pool capped: the holds fit one DynamoDB item", extra={
                "spare_nodes": str(pool), "gpu_nodes": gpu_nodes, "spares_wanted": size,
                "max_holds": placement.MAX_HOLDS})
        wanted = placement.plan_holds(spares_wanted=size, current=read.holds, free=free, waits=waits,
                                      placeable=placeable)
        changes: dict[str, Mapping[str, Any] | None] = dict(placement.hold_changes(read.holds, wanted))
        if not changes:
            return "holds_unchanged"
        changes = {n: (None if h is None else {**h, _WANTED: size}) for n, h in changes.items()}
        if not repo.cordons.set_holds(read, changes, clock.now()):
            return "holds_raced"  # another refresh won: the next one starts from its holds
        logger.info("placement holds changed", extra={
            "held": {n: (h or {}).get("why", "released") for n, h in sorted(changes.items())}})
        for node in sorted(changes):
            self.cordons.sync_quietly(node)
        return "holds_changed"

    def release(self, nodes: Sequence[str]) -> str:
        """A relocation claimed ``nodes``: their spare or reserved holds end now (no
        snapshot); the pool refills at the next free node or refresh."""
        repo = self.deps.repo
        read = repo.cordons.worklist()
        changes: dict[str, Mapping[str, Any] | None] = {n: None for n in nodes if n in read.holds}
        if not changes:
            return "no_holds"
        if not repo.cordons.set_holds(read, changes, clock.now()):
            return "holds_raced"  # the sweep's refresh releases them
        for node in sorted(changes):
            self.cordons.sync_quietly(node)
        return "holds_released"
