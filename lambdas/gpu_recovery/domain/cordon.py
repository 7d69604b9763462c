"""Cordon: a node known to be bad takes no new work until it is healthy again. Pure.

A node is *known bad* from the moment its diag fails (a verdict that needs a node action),
a definitive fault is seen (the catalog's fast path, e.g. XID 79), its reboot or health
check times out, or it is lost with its ECS agent disconnected — whatever the blast-radius
breaker or observe mode decides about *fixing* it. Until it is healthy again (back after
its reboot, replaced, or uncordoned by an operator):

* the queue scheduler and relocation never place a rank on it (the instance item's
  ``cordon``), unconditionally: that costs no capacity that was usable;
* ECS placement of tag-registered jobs avoids it through a custom attribute on its
  container instance (``gpu-recovery.cordoned``, no value) and the placement constraint
  users add: ``memberOf`` ``attribute:gpu-recovery.cordoned !exists``.

The ECS attribute is visible to every workload that uses the constraint, so putting it
has its own limit (NVSentinel: 50 % of the nodes within 5 minutes), higher than the
breaker's for disruptive actions (reboot, terminate). When even that limit trips, the
node stays out of our own placements, its attribute waits (``held``) until the
operator resets the breaker, and the operator is told at once, never silently.

The limit's state is a sub-dict (``cordons``) of the breaker's item, written in the same
transaction as the decision that cordons the node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_recovery.domain.breaker.causes import independent_causes, kept, one_cause_note

# The ECS custom attribute (name only: DeleteAttributes takes the name and target, not the
# value) of cordoned container instances (the constraint to keep off: domain.placement).
CORDON_ATTRIBUTE = "gpu-recovery.cordoned"

# Where the attribute stands (the instance item's ``cordon.ecs``).
ECS_PENDING = "pending"  # intent committed, PutAttributes not confirmed yet
ECS_APPLIED = "applied"  # PutAttributes confirmed
ECS_HELD = "held"  # the cordon limit tripped: out of our placements only, until a reset

CLOSED = "closed"
TRIPPED = "tripped"
# The limit's window lives on the breaker's item (one DynamoDB item, 400 KB: see
# domain.breaker.breaker.MAX_WINDOW_NODES): at most this many nodes a window, whatever the share.
MAX_WINDOW_NODES = 1000


@dataclass(frozen=True)
class CordonPolicy:
    """The cordon limit: unique nodes given the ECS attribute within a sliding window."""

    max_share: float = 0.50  # of the cluster's GPU nodes (NVSentinel's circuit breaker default)
    window_seconds: float = 300.0  # 5 minutes (NVSentinel)
    min_allowed: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.max_share <= 1 or self.window_seconds <= 0 or self.min_allowed < 0:
            raise ValueError(f"cordon policy: bad values {self}")

    def allowed_nodes(self, cluster_gpu_nodes: int) -> int:
        share = max(math.floor(self.max_share * max(0, cluster_gpu_nodes) + 1e-9), self.min_allowed)
        return min(share, MAX_WINDOW_NODES)


def new_state() -> dict[str, Any]:
    return {"state": CLOSED, "window": [], "tripped_at": None, "trip_reason": "", "trips": 0}


def normalize(stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The limit's state from the breaker item's ``cordons`` (missing fields defaulted)."""
    state = new_state()
    if not stored:
        return state
    state["state"] = TRIPPED if stored.get("state") == TRIPPED else CLOSED
    state["window"] = [{"node": str(e["node"]), "at": float(e["at"]), **kept(e)}
                       for e in stored.get("window") or ()]
    state["tripped_at"] = float(stored["tripped_at"]) if stored.get("tripped_at") is not None else None
    state["trip_reason"] = str(stored.get("trip_reason") or "")
    state["trips"] = int(stored.get("trips") or 0)
    return state


@dataclass(frozen=True)
class CordonDecision:
    allowed: bool  # put the ECS attribute now
    state: dict[str, Any]  # the limit's new state (the breaker item's ``cordons``)
    tripped_now: bool  # this call tripped it: tell the operator (once)
    reason: str
    nodes_in_window: int
    limit: int


def admit(stored: Mapping[str, Any] | None, *, node: str, now: float, cluster_gpu_nodes: int,
          policy: CordonPolicy | None = None, cause: Mapping[str, str] | None = None) -> CordonDecision:
    """May ``node`` get the ECS attribute now? Idempotent for a node already in the window.
    ``cause`` (``breaker.causes.cause_of``): recorded on the window's entry; past the limit, a
    window whose nodes share one cause (one job's own evidence) refuses without tripping."""
    policy = policy or CordonPolicy()
    current = normalize(stored)
    limit = policy.allowed_nodes(cluster_gpu_nodes)
    window = [e for e in current["window"] if now - policy.window_seconds < e["at"] <= now]
    nodes = {e["node"] for e in window}
    current["window"] = window
    if current["state"] == TRIPPED:
        return CordonDecision(False, current, False,
                              f"cordon limit tripped at {current['tripped_at']}: {current['trip_reason']}",
                              len(nodes), limit)
    if node in nodes:
        return CordonDecision(True, current, False, f"{node} already cordoned in this window",
                              len(nodes), limit)
    entry = {"node": node, "at": now, **(cause or {})}
    if len(nodes) + 1 > limit and independent_causes([*window, entry]) <= 1:
        return CordonDecision(False, current, False, f"cordon of {node} refused: {len(nodes) + 1} nodes "
                              f"past the limit {limit}, but {one_cause_note([*window, entry])}",
                              len(nodes), limit)
    if len(nodes) + 1 > limit:
        why = (f"{len(nodes) + 1} of {cluster_gpu_nodes} GPU nodes would be cordoned within "
               f"{policy.window_seconds:g} s (limit {limit}: {policy.max_share:.0%} of the cluster)")
        current.update(state=TRIPPED, tripped_at=now, trip_reason=why, trips=current["trips"] + 1)
        return CordonDecision(False, current, True, f"cordon limit tripped: {why}", len(nodes), limit)
    current["window"] = [*window, entry]
    return CordonDecision(True, current, False, f"{len(nodes) + 1} of {limit} cordons allowed in the window",
                          len(nodes) + 1, limit)


def reset(stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """Closed with an empty window (the operator's breaker reset); held cordons are then
    put a window's allowance at a time by the sweep."""
    current = normalize(stored)
    current.update(state=CLOSED, window=[], tripped_at=None, trip_reason="")
    return current


def cordon_record(*, cause: str, reason: str, now: float, ecs: str) -> dict[str, Any]:
    """The instance item's ``cordon``: why the node is known bad, since when, and where its
    ECS attribute stands."""
    return {"at": now, "cause": cause[:100], "reason": reason[:300], "ecs": ecs}


def validating_record(*, repair: str, reason: str, now: float, ecs: str) -> dict[str, Any]:
    """The ``cordon`` of a repaired node during its validation (``domain.validation``): out of
    every placement as a cordoned node is, its attribute's value ``validating``. Never
    admitted by the cordon limit: every repair validated was admitted by the breaker."""
    record = cordon_record(cause=f"validation:{repair}", reason=reason, now=now, ecs=ecs)
    return {**record, "validating": True}


def check_cordon(current: Mapping[str, Any] | None, *, repair: str, reason: str,
                 now: float) -> dict[str, Any] | None:
    """The ``validating`` cordon a check opens over the node's ``current`` cordon (the stack's
    check of a node no repair preceded: ``domain.validation.SUSPECT_CHECKS``), as a repaired
    node's validation has: never admitted by the cordon limit (it is the check's, not a
    judgement), held if the limit holds the cordon it replaces. None: an AWS notice's cordon
    stays (the node goes away whatever the check says; a pass leaves it, as a reboot does)."""
    if current and current.get("notice"):
        return None
    held = (current or {}).get("ecs") == ECS_HELD
    return validating_record(repair=repair, reason=reason, now=now, ecs=ECS_HELD if held else ECS_PENDING)


def failed_check_cordon(current: Mapping[str, Any] | None, *, cause: str, reason: str,
                        now: float) -> dict[str, Any] | None:
    """A check of a node no repair preceded found a fault (a DCGM verdict of the stack's own
    task: trustworthy evidence): the node is known bad, its ``validating`` cordon becomes a
    ``cordoned`` one in the same write. Not admitted by the cordon limit: the node was out of
    every placement already (its check's cordon), only the attribute's value changes; a held
    one stays held. None: an AWS notice's cordon stays."""
    if current and current.get("notice"):
        return None
    held = (current or {}).get("ecs") == ECS_HELD
    return cordon_record(cause=cause, reason=reason, now=now, ecs=ECS_HELD if held else ECS_PENDING)


def sync_entry(node: str, version: float) -> str:
    """A pending ECS attribute sync (the worklist's member): node and the cordon version."""
    return f"{node}#{version!r}"


def parse_sync_entry(entry: str) -> tuple[str, float] | None:
    node, _, version = str(entry).rpartition("#")
    try:
        return (node, float(version)) if node else None
    except ValueError:
        return None
