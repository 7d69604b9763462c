"""Which nodes the stack's own placements treat as free: only those where ECS's view of the
node and the stack's agree.

ECS frees a task's GPUs the moment the task stops; the stack hears of the stop from its
STOPPED event, which EventBridge delivers about a second later (minutes later when the first
delivery fails and Lambda retries it). In between, ECS shows the node free and nothing in the
stack knows yet that its task may have died of a GPU fault: issue 41 saw the sweep relocate
another job's rank onto such a node half a second after the fault, and nothing ever checked
the node. So a node is free for the stack's relocations, its spare pool and reservations and
the queue scheduler only when all three agree:

1. **ECS**: ACTIVE, agent connected, enough GPUs in ``remainingResources``;
2. **its instance item** (``Instance.placeable``): AVAILABLE, not cordoned, and no *suspect
   fence*. The fence is written with the rank's stop that named the node a suspect (fault
   evidence), in the same transaction, and is lifted only by the node's decision (its check's
   verdict, the fast path), its return from a reboot, or an operator's uncordon;
3. **the ranks recorded on it** (:func:`unhandled_stops`): what the stack records as still
   holding the node's GPUs (the sparse by-container-instance index of live ranks) must be
   allocated in ECS too. A recorded rank whose GPUs ECS already shows free has stopped, and
   its STOPPED event is not handled yet: the node is a suspect until that stop is judged.

Why the rank's record for (3), rather than the STOPPED event or DescribeTasks of the node's
recently stopped tasks: the event is exactly what is late; DescribeTasks costs two ECS calls
per node against the control plane's shared rate limit and would still not say whether the
stack has judged the stop. The record is the stack's own view, one Query per node, asked only
of the nodes a placement is about to take (never of the whole cluster: cost follows the
placements made, not the cluster's size). The fence (2) covers the other order — the stop is
recorded (the rank left the index) but its check has not answered yet — on an item read
strongly consistently, written in the same transaction as the stop, so it does not wait for
an index or for the health check's own write to catch up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_recovery.domain import ecs_instance_status as ecs_status
from gpu_recovery.domain import placement
from gpu_recovery.domain.models import Instance, Rank, container_instance_id
from gpu_recovery.domain.relocation import SpareNode, gpu_count

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeView:
    """One container instance as ECS describes it, with the stack's item of it."""

    node: SpareNode  # id, ARN, EC2 id, free and registered GPUs (ECS's)
    ecs_ready: bool  # ACTIVE and agent connected
    instance: Instance | None

    @property
    def node_id(self) -> str:
        return self.node.node_id

    @property
    def placeable(self) -> bool:
        """ECS and the item agree the node may take work (the recorded ranks are asked
        separately, of the nodes a placement chooses: :func:`unhandled_stops`)."""
        return self.ecs_ready and (self.instance is None or self.instance.placeable)


def views(described: Iterable[Mapping[str, Any]], instances: Mapping[str, Instance]) -> list[NodeView]:
    """The cluster's nodes (DescribeContainerInstances' answer) with their items."""
    out = []
    for ci in described:
        node_id = container_instance_id(ci["containerInstanceArn"])
        out.append(NodeView(
            SpareNode(node_id, ci["containerInstanceArn"], str(ci.get("ec2InstanceId", "")),
                      gpu_count(ci.get("remainingResources")), gpu_count(ci.get("registeredResources"))),
            ci.get("status") == ecs_status.ACTIVE and bool(ci.get("agentConnected")), instances.get(node_id)))
    return out


class LiveRanksOnNodes(Protocol):
    """Of the jobs aggregate: the ranks still holding a node's GPUs."""

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]: ...


def unhandled_stops(jobs: LiveRanksOnNodes, nodes: Iterable[SpareNode]) -> dict[str, list[Rank]]:
    """node id -> the ranks recorded there, for each of ``nodes`` (as ECS describes them) where
    ranks the stack records as holding GPUs have them free in ECS: a stop not handled yet (one
    Query of the live ranks on each node)."""
    found: dict[str, list[Rank]] = {}
    for node in nodes:
        live = jobs.live_ranks_on_instance(node.node_id)
        recorded = sum(max(1, int(r.gpus or 0)) for r in live)
        if live and placement.unhandled_stop(free_gpus=node.free_gpus, total_gpus=node.total_gpus,
                                             recorded_gpus=recorded):
            found[node.node_id] = sorted(live, key=lambda r: (r.job_id, r.rank))
    if found:
        logger.warning("nodes left out: ECS shows their GPUs free, a rank recorded there has not ended",
                       extra={"nodes": {n: f"rank {r[0].rank} of job {r[0].job_id}"
                                        for n, r in found.items()}})
    return found
