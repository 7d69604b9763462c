"""Relocation: which healthy free node takes each rank that must leave its node. Pure.

A rank keeps its node unless the node is unusable (quarantined, replaced, a node action
held back) or rebooting with ``relocate_instead_of_wait``. The ranks that move take
distinct spare nodes (one rank per node, never a node the job keeps), each with at
least the GPUs the rank held, best fit first (fewest free GPUs that fit, then node id):
the same input gives the same placement, and large free nodes stay free for large jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpareNode:
    node_id: str  # container instance id
    container_instance_arn: str
    ec2_instance_id: str
    free_gpus: int
    total_gpus: int


def gpu_count(resources: list[Mapping[str, Any]] | None) -> int:
    """The GPU count in ECS ``registeredResources`` / ``remainingResources`` (0: none)."""
    for r in resources or []:
        if r.get("name") == "GPU":
            if r.get("type") == "STRINGSET":
                return len(r.get("stringSetValue") or [])
            return int(r.get("integerValue") or 0)
    return 0


def choose_targets(needs: Mapping[int, int], spares: list[SpareNode]) -> dict[int, SpareNode] | None:
    """rank -> spare node for every rank in ``needs`` (rank -> GPUs), or None when the
    spares cannot take them all."""
    free = sorted(spares, key=lambda n: (n.free_gpus, n.node_id))
    taken: set[str] = set()
    chosen: dict[int, SpareNode] = {}
    # The largest ranks first, so a small rank never takes the only node a large one fits.
    for rank in sorted(needs, key=lambda r: (-needs[r], r)):
        node = next((n for n in free if n.node_id not in taken and n.free_gpus >= needs[rank]), None)
        if node is None:
            return None
        taken.add(node.node_id)
        chosen[rank] = node
    return chosen


def describe_moves(moves: Mapping[Any, tuple[str, str]]) -> str:
    """``"rank 1 node-b -> node-c"`` for every rank that changes node."""
    ordered = sorted(moves.items(), key=lambda m: int(m[0]))
    parts = [f"rank {rank} {old} -> {new}" for rank, (old, new) in ordered if old != new]
    return ", ".join(parts) or "no rank moved"
