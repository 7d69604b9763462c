"""Placement: the one ECS attribute on every node the stack keeps off new work. Pure.

Four kinds of node take no new work from any scheduler but the stack's own relocation:

* **cordoned**: known bad (``domain.cordon``), until healthy again;
* **validating**: repaired (rebooted, reset, replaced) and running its validation under
  load (``domain.validation``), or under the stack's check of a node no repair preceded
  (``SUSPECT_CHECKS``): a cordon whose record says so, until the validation passes;
* **spare**: one of the ``spare_nodes`` hot spares (``domain.relocation.SparePool``),
  kept wholly free for relocations;
* **reserved**: a healthy free node a relocatable job waiting for nodes will take
  (``domain.relocation.reserve_for_waits``).

Each carries the custom attribute ``gpu-recovery.unavailable`` on its container instance,
its value saying why (``cordoned`` | ``validating`` | ``aws-notice`` | ``reserved`` | ``spare``).
Every scheduler adds the
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

**Lent spares** (``lend_spares``, off by default): the stack's own queue scheduler may
lend a wholly free spare to one LOW-priority queue job (:func:`may_borrow_spare`; a
queue job can always be suspended, with its grace to checkpoint). The lend is written on
the spare's hold first (``"lent": job``), then the job is launched; the node keeps its
``spare`` attribute (the user's schedulers still keep off it) and keeps counting as a
spare while it is healthy, free or not: the pool is not refilled because a spare is lent.
A relocation that needs it asks the lent job to suspend and waits for the node like any
waiting relocation (:func:`lent_to_reclaim`); the node is claimed when it frees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery.domain.cordon import CORDON_ATTRIBUTE, ECS_HELD
from gpu_recovery.domain.relocation import (
    RelocationWait,
    SpareNode,
    choose_targets,
    keep_spares,
    reserve_for_waits,
)

UNAVAILABLE_ATTRIBUTE = "gpu-recovery.unavailable"
PLACEMENT_EXPRESSION = f"attribute:{UNAVAILABLE_ATTRIBUTE} !exists"
# Deprecated, kept on cordoned nodes for one release: schedulers move to the one above.
DEPRECATED_CORDON_ATTRIBUTE = CORDON_ATTRIBUTE

CORDONED = "cordoned"
RESERVED = "reserved"
SPARE = "spare"
# A repaired node running its validation (domain.validation): a cordon of its own kind.
VALIDATING = "validating"
# A node AWS announced it takes away (a Capacity Block's end, a Spot or reservation interruption,
# scheduled maintenance: domain.aws_notices): a cordon of its own kind (the record's ``notice``).
NOTICE = "aws-notice"
HOLD_KINDS = (RESERVED, SPARE)
LENT = "lent"  # key of a spare's hold: the queue job it is lent to ("" / absent: none)
# A fault's reservation is put by the invocation that committed it (which then sends the job's
# stop): for this long another invocation seeing the same fault (a rank exiting on its own, a
# redelivery, the sweep) leaves those nodes to it, unless it gave up (2,048 tasks, every node
# checked: 360 PutAttributes calls repeated the committer's 26).
SYNC_LEASE_SECONDS = 15.0
# The holds live on one DynamoDB item with the attribute sync worklist (repository/cordons.py)
# and an item takes at most 400 KB (DynamoDB's item limit): a hold is ~230 bytes (lent), a
# worklist member ~50 (twice per hold at worst, and as many reported refused). At most this
# many nodes are held (reserved first, then spares): a larger spare pool (spare_nodes up to
# 50 % of a 10,000-node cluster) is capped, with a WARNING at each refresh
# (recovery/placement.py).
MAX_HOLDS = 800
NEXT = "next"  # key of a spare's hold marked while its node is busy: a spare once it frees
# The only priority level a spare is lent to (domain.time_sharing.Priority.LOW): the
# lowest level, the one every other level may preempt anyway.
LENDABLE_PRIORITY = 0


def attribute_value(cordon: Mapping[str, Any] | None, hold: Mapping[str, Any] | None) -> str | None:
    """The value ``gpu-recovery.unavailable`` should have (None: absent). A cordon held by
    the cordon limit puts nothing in ECS (the limit bounds what a storm takes out of every
    scheduler's placement); such a node is never a spare nor reserved either."""
    if cordon:
        if cordon.get("ecs") == ECS_HELD:
            return None
        if cordon.get("notice"):
            return NOTICE
        return VALIDATING if cordon.get(VALIDATING) else CORDONED
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
    if value in (CORDONED, VALIDATING, NOTICE):  # not yet proven healthy / going away: off the old one too
        put[DEPRECATED_CORDON_ATTRIBUTE] = ""
    else:
        delete.append(DEPRECATED_CORDON_ATTRIBUTE)
    return put, delete


def unhandled_stop(*, free_gpus: int, total_gpus: int, recorded_gpus: int) -> bool:
    """ECS shows more of a node free than the ranks the stack records on it leave: one of
    those ranks stopped and its stop is not handled yet (``recovery.free_nodes``). A node
    whose recorded ranks hold ``recorded_gpus`` must have at least that many allocated."""
    return recorded_gpus > 0 and max(0, total_gpus - free_gpus) < recorded_gpus


def may_borrow_spare(*, lending: bool, queue_job: bool, priority: int, relocated: bool) -> bool:
    """Whether a job may run on a spare lent to it: lending on, a queue job (it can be
    suspended and requeued when the spare is taken back), of LOW priority, and not a
    relocated job (those take spares outright)."""
    return lending and queue_job and priority == LENDABLE_PRIORITY and not relocated


def lent_of(holds: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """node -> the queue job a spare is lent to (spares lent to nobody left out)."""
    return {n: str(h[LENT]) for n, h in holds.items() if h.get("why") == SPARE and h.get(LENT)}


def lend(hold: Mapping[str, Any], job_id: str) -> dict[str, Any]:
    """The spare's hold once lent to ``job_id`` (the intent a lending scheduler commits
    before it launches the job)."""
    return {**{k: v for k, v in hold.items() if k != "at"}, LENT: job_id}


def lent_to_reclaim(needs: Sequence[int], free: Sequence[SpareNode], lent: Sequence[SpareNode]) -> list[str]:
    """The lent spares a relocation needing nodes of ``needs`` GPUs must take back (their
    lent jobs asked to suspend), given that the healthy ``free`` nodes alone cannot take it
    ([]: lending cannot help either). Lent nodes count as wholly free (``total_gpus``);
    free nodes are used first, so no more work is suspended than the relocation needs."""
    whole = sorted((SpareNode(n.node_id, n.container_instance_arn, n.ec2_instance_id, n.total_gpus,
                              n.total_gpus) for n in lent if n.total_gpus > 0),
                   key=lambda n: (-n.total_gpus, n.node_id))
    ranks = dict(enumerate(needs))
    # The fewest lent nodes that make the relocation fit (the largest first), and of those
    # only the ones the placement then uses.
    for count in range(1, len(whole) + 1):
        added = whole[:count]
        chosen = choose_targets(ranks, [*free, *added])
        if chosen is not None:
            borrowed = {n.node_id for n in added}
            return sorted({n.node_id for n in chosen.values()} & borrowed)
    return []


def plan_holds(*, spares_wanted: int, current: Mapping[str, Mapping[str, Any]], free: Sequence[SpareNode],
               waits: Sequence[RelocationWait], placeable: frozenset[str] | set[str] = frozenset(),
               recovering: Mapping[str, str] | None = None, busy: Sequence[SpareNode] = (),
               ) -> dict[str, dict[str, str]]:
    """node -> {"why", "job", "arn"}: the holds the cluster should have now, at most
    :data:`MAX_HOLDS` of them.

    ``recovering``: node -> the job in recovery that holds it (its restart's nodes, from the
    fault seen until every rank is placed again): each is reserved for that job first, busy or
    free (a lent spare stays a spare). ``free``: healthy, placeable nodes with free GPUs that
    no recovery holds (neither cordoned nor claimed). Then the waiting relocations' reservations
    (oldest first, as ``reserve_for_waits``), then the spares among the wholly free rest: the
    current spares that still qualify keep their hold (a spare does not hop from node to node),
    the pool topped up to ``spares_wanted`` the largest first (``keep_spares``). Still short:
    the next spares are marked among ``busy`` (healthy, placeable nodes in use, not held):
    their running work is untouched, the attribute keeps new work off, and each is a spare the
    moment it frees (:func:`next_spares`: no node whose free GPUs some job could use now is
    taken while a wholly busy one is left).

    A spare lent to a queue job (``"lent"`` on its hold) stays a spare, lend included, while
    its node is healthy and placeable (``placeable``: such nodes whatever their free GPUs),
    free or not: it counts in the pool, which is not refilled because of it."""
    wanted: dict[str, dict[str, str]] = {}
    arns = {n.node_id: n.container_instance_arn for n in [*busy, *free]}
    lent = {n: j for n, j in lent_of(current).items() if n in placeable or n in arns}
    for node, job_id in sorted((recovering or {}).items()):
        if node not in lent:
            wanted[node] = {"why": RESERVED, "job": job_id,
                            "arn": arns.get(node) or str((current.get(node) or {}).get("arn") or "")}
    free = [n for n in free if n.node_id not in wanted]
    busy = [n for n in busy if n.node_id not in wanted]
    # A lent spare is reserved for a waiting relocation only once wholly free again (its
    # lent job suspended or ended): one still in use stays lent, so the relocation that
    # waits for it knows whose suspension it waits for.
    in_use = {n.node_id for n in free if n.free_gpus < n.total_gpus} | (set(lent) - set(arns))
    for_waits = reserve_for_waits(waits, [n for n in free
                                          if n.node_id not in in_use or n.node_id not in lent])
    for node, job_id in for_waits.items():
        if len(wanted) >= MAX_HOLDS:
            break
        wanted[node] = {"why": RESERVED, "job": job_id, "arn": arns[node]}
    # A wait still short of free nodes reserves busy ones (their work untouched): each is the
    # waiting job's the moment it frees, before any other scheduler sees it free.
    busy = [n for n in busy if n.node_id not in wanted and n.node_id not in lent]
    for node, job_id in reserve_busy_for_waits(waits, for_waits, busy).items():
        if len(wanted) >= MAX_HOLDS:
            break
        wanted[node] = {"why": RESERVED, "job": job_id, "arn": arns[node], NEXT: "busy"}
    lent = {n: j for n, j in lent.items() if n not in wanted}
    size = max(0, min(spares_wanted, MAX_HOLDS - len(wanted)))
    whole = [n for n in free if n.node_id not in wanted and n.total_gpus > 0 and n.free_gpus >= n.total_gpus]
    kept_lent = sorted(lent)[:size]
    kept = sorted(n.node_id for n in whole if (current.get(n.node_id) or {}).get("why") == SPARE
                  and n.node_id not in lent)
    kept = kept[:size - len(kept_lent)]
    topped = keep_spares(size - len(kept_lent) - len(kept),
                         [n for n in whole if n.node_id not in kept and n.node_id not in lent])
    for node in kept_lent:
        wanted[node] = {"why": SPARE, "job": "", "arn": str(arns.get(node) or current[node].get("arn") or ""),
                        LENT: lent[node]}
    for node in [*kept, *sorted(topped)]:
        wanted[node] = {"why": SPARE, "job": "", "arn": arns[node]}
    short = size - len(kept_lent) - len(kept) - len(topped)
    if short > 0:
        candidates = [n for n in busy if n.node_id not in wanted and n.node_id not in lent]
        for node in next_spares(short, candidates, current):
            wanted[node] = {"why": SPARE, "job": "", "arn": arns[node], NEXT: "busy"}
    return wanted


def reserve_busy_for_waits(waits: Sequence[RelocationWait], free_reserved: Mapping[str, str],
                           busy: Sequence[SpareNode]) -> dict[str, str]:
    """node -> job: for each waiting relocation (oldest first) the busy nodes that will take
    the ranks its free reservations (``free_reserved``: node -> job) do not cover, the fewest
    free GPUs first (a wholly busy node gives up nothing usable now), each with room for the
    rank it will take."""
    taken: dict[str, str] = {}
    ordered = sorted(busy, key=lambda n: (n.free_gpus, -n.total_gpus, n.node_id))
    for wait in sorted(waits, key=lambda w: (w.since, w.job_id)):
        have = sum(1 for job_id in free_reserved.values() if job_id == wait.job_id)
        for gpus in sorted(wait.gpus, reverse=True)[have:]:
            node = next((n for n in ordered if n.node_id not in taken and n.total_gpus >= gpus), None)
            if node is not None:
                taken[node.node_id] = wait.job_id
    return taken


def next_spares(count: int, busy: Sequence[SpareNode], current: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The ``count`` busy nodes marked to become spares when they free, so that no job is
    slowed: nodes already marked keep their mark (a mark does not hop), then the nodes with
    the fewest free GPUs (a wholly busy node gives up nothing any job could use now; a partly
    used one would), the largest first (a spare must fit any rank), then node id."""
    if count <= 0:
        return []
    marked = sorted(n.node_id for n in busy if (current.get(n.node_id) or {}).get("why") == SPARE
                    and n.total_gpus > 0)[:count]
    rest = sorted((n for n in busy if n.node_id not in marked and n.total_gpus > 0),
                  key=lambda n: (n.free_gpus, -n.total_gpus, n.node_id))
    return [*marked, *[n.node_id for n in rest[:count - len(marked)]]]


def hold_changes(current: Mapping[str, Mapping[str, Any]],
                 wanted: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str] | None]:
    """node -> its new hold (None: released) for every node whose hold changes."""
    changes: dict[str, dict[str, str] | None] = {}
    for node in set(current) | set(wanted):
        old, new = current.get(node), wanted.get(node)
        if new is None:
            changes[node] = None
        elif old is None or old.get("why") != new["why"] or old.get("job", "") != new.get("job", "") \
                or old.get(LENT, "") != new.get(LENT, "") or old.get(NEXT, "") != new.get(NEXT, ""):
            changes[node] = dict(new)
    return {n: c for n, c in changes.items() if not (c is None and n not in current)}


def spares_of(holds: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {n for n, h in holds.items() if h.get("why") == SPARE}


def next_spares_of(holds: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The spares marked while their node was busy (a spare once it frees)."""
    return {n for n, h in holds.items() if h.get("why") == SPARE and h.get(NEXT)}


def reserved_of(holds: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {n: str(h.get("job") or "") for n, h in holds.items() if h.get("why") == RESERVED}


def reserved_for_another(hold: Mapping[str, Any] | None, job_id: str) -> str:
    """The job in recovery ``hold`` reserves its node for, if not ``job_id`` ("": none). A
    node is reserved for the recovery that held it first: the stack's own placements (another
    job's reservation or restart) leave it to that job until its restart releases it."""
    hold = hold or {}
    other = str(hold.get("job") or "") if hold.get("why") == RESERVED else ""
    return other if other != job_id else ""
