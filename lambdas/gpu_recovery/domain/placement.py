"""Placement: the one ECS attribute on every node the stack keeps off new work. Pure.

Three kinds of node take no new work from any scheduler but the stack's own relocation:

* **cordoned**: known bad (``domain.cordon``), until healthy again;
* **spare**: one of the ``spare_nodes`` hot spares (``domain.relocation.SparePool``),
  kept wholly free for relocations;
* **reserved**: a healthy free node a relocatable job waiting for nodes will take
  (``domain.relocation.reserve_for_waits``).

Each carries the custom attribute ``gpu-recovery.unavailable`` on its container instance,
its value saying why (``cordoned`` | ``reserved`` | ``spare``). Every scheduler adds the
one placement constraint ``memberOf`` ``attribute:gpu-recovery.unavailable !exists`` (a
scheduler that uses StartTask lists its candidates with that expression as the
ListContainerInstances ``filter``). The stack's own relocations use StartTask on the node
they chose, which placement constraints do not apply to.

Cordoned nodes also keep the old attribute ``gpu-recovery.cordoned`` for a release
(deprecated: ``attribute:gpu-recovery.cordoned !exists`` keeps only known-bad nodes away).

The spare and reserved nodes are the *holds* (``node -> {"why", "job", "arn", "at"}``),
kept on the attribute sync worklist's item and recomputed by :func:`plan_holds` from a
cluster snapshot: a hold ends as soon as its node stops being wholly free, healthy and
unclaimed, and the pool refills with the next node that frees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery.domain.cordon import CORDON_ATTRIBUTE, ECS_HELD
from gpu_recovery.domain.relocation import RelocationWait, SpareNode, keep_spares, reserve_for_waits

UNAVAILABLE_ATTRIBUTE = "gpu-recovery.unavailable"
PLACEMENT_EXPRESSION = f"attribute:{UNAVAILABLE_ATTRIBUTE} !exists"
PLACEMENT_CONSTRAINT = {"type": "memberOf", "expression": PLACEMENT_EXPRESSION}
# Deprecated, kept on cordoned nodes for one release: schedulers move to the one above.
DEPRECATED_CORDON_ATTRIBUTE = CORDON_ATTRIBUTE

CORDONED = "cordoned"
RESERVED = "reserved"
SPARE = "spare"
HOLD_KINDS = (RESERVED, SPARE)


def attribute_value(cordon: Mapping[str, Any] | None, hold: Mapping[str, Any] | None) -> str | None:
    """The value ``gpu-recovery.unavailable`` should have (None: absent). A cordon held by
    the cordon limit puts nothing in ECS (the limit bounds what a storm takes out of every
    scheduler's placement); such a node is never a spare nor reserved either."""
    if cordon:
        return None if cordon.get("ecs") == ECS_HELD else CORDONED
    if hold and hold.get("why") in HOLD_KINDS:
        return str(hold["why"])
    return None


def attributes_wanted(cordon: Mapping[str, Any] | None,
                      hold: Mapping[str, Any] | None) -> tuple[dict[str, str], list[str]]:
    """(attributes to put: name -> value, attribute names to delete) for a node."""
    value = attribute_value(cordon, hold)
    put: dict[str, str] = {}
    delete: list[str] = []
    if value is None:
        delete.append(UNAVAILABLE_ATTRIBUTE)
    else:
        put[UNAVAILABLE_ATTRIBUTE] = value
    if value == CORDONED:
        put[DEPRECATED_CORDON_ATTRIBUTE] = ""
    else:
        delete.append(DEPRECATED_CORDON_ATTRIBUTE)
    return put, delete


def plan_holds(*, spares_wanted: int, current: Mapping[str, Mapping[str, Any]], free: Sequence[SpareNode],
               waits: Sequence[RelocationWait]) -> dict[str, dict[str, str]]:
    """node -> {"why", "job", "arn"}: the holds the cluster should have now.

    ``free``: healthy, placeable nodes with free GPUs that no recovery holds (neither
    cordoned nor claimed). Reserved first (the waiting relocations, oldest first, as
    ``reserve_for_waits``), then the spares among the wholly free rest: the current spares
    that still qualify keep their hold (a spare does not hop from node to node), the pool
    topped up to ``spares_wanted`` the largest first (``keep_spares``)."""
    wanted: dict[str, dict[str, str]] = {}
    arns = {n.node_id: n.container_instance_arn for n in free}
    for node, job_id in reserve_for_waits(waits, free).items():
        wanted[node] = {"why": RESERVED, "job": job_id, "arn": arns[node]}
    whole = [n for n in free if n.node_id not in wanted and n.total_gpus > 0 and n.free_gpus >= n.total_gpus]
    kept = sorted(n.node_id for n in whole if (current.get(n.node_id) or {}).get("why") == SPARE)
    kept = kept[:max(0, spares_wanted)]
    topped = keep_spares(max(0, spares_wanted) - len(kept), [n for n in whole if n.node_id not in kept])
    for node in [*kept, *sorted(topped)]:
        wanted[node] = {"why": SPARE, "job": "", "arn": arns[node]}
    return wanted


def hold_changes(current: Mapping[str, Mapping[str, Any]],
                 wanted: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str] | None]:
    """node -> its new hold (None: released) for every node whose hold changes."""
    changes: dict[str, dict[str, str] | None] = {}
    for node in set(current) | set(wanted):
        old, new = current.get(node), wanted.get(node)
        if new is None:
            changes[node] = None
        elif old is None or old.get("why") != new["why"] or old.get("job", "") != new.get("job", ""):
            changes[node] = dict(new)
    return {n: c for n, c in changes.items() if not (c is None and n not in current)}


def spares_of(holds: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {n for n, h in holds.items() if h.get("why") == SPARE}


def reserved_of(holds: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {n: str(h.get("job") or "") for n, h in holds.items() if h.get("why") == RESERVED}
