"""Blast-radius breaker: automatic reboots, replacements and quarantines stop when too many
of the cluster's GPU nodes were acted on within a sliding window.

Pure functions over one state dict (one DynamoDB item; the caller writes it back with a
condition on ``version``). The breaker trips when acting on one more node would exceed
``floor(max_share x GPU nodes)`` (default 20 %, never below ``min_allowed``) or
``max_nodes``; while tripped every node action is refused and kept in a backlog.

It closes by itself (``auto_close``, half-open) when the evidence says remediation worked:
a window after the trip, every node it had acted on in the window that tripped it is back
healthy (AVAILABLE, uncordoned), none failed again since, and no storm of new nodes goes on
(:func:`assess_auto_close`); its backlog is then released at the window's rate as an
operator's ``reset --resume-backlog`` releases it. When the reboots did not fix those nodes
(one failed again, or did not come back within ``auto_close_windows`` windows) it stays
open until an operator resets it and chooses to resume or drop the backlog (stale backlogs
replayed after a long trip are a known hazard: NVSentinel #450).

Anchors: NVSentinel fault-quarantine circuit breaker (sliding window of unique nodes,
persistent state, manual reset), Karpenter node repair (blocked above 20 % unhealthy), EKS
``maxUnhealthyNodeThresholdCount|Percentage`` (node auto repair resumes by itself once the
share of unhealthy nodes falls below it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from gpu_recovery.domain.breaker import causes
from gpu_recovery.domain.breaker.causes import independent_causes, one_cause_note
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.states import InstanceState

CLOSED = "closed"
TRIPPED = "tripped"
# The breaker's state is one DynamoDB item (400 KB at most): every node of its window, the
# nodes it tripped on, its backlog, and the cordon limit's window (domain.cordon). Bounds that
# keep it under the limit at any cluster size (20 % of 10,000 nodes is 2,000):
MAX_WINDOW_NODES = 1000  # distinct nodes acted on within a window, whatever the share
MAX_BACKLOG = 500  # actions kept while tripped; past it one is refused and counted, not kept
MAX_BACKLOG_REASON = 200  # characters of an action's reason kept in the backlog
# ``last_reset_by`` of a breaker that closed itself (an operator's reset names the operator).
CLOSED_BY_ITSELF = "the breaker itself (auto close)"


@dataclass(frozen=True)
class BreakerPolicy:
    enabled: bool = True
    max_share: float = 0.20  # of the cluster's GPU nodes
    max_nodes: int | None = None  # absolute cap on nodes acted on per window (None: share only)
    window_seconds: float = 600.0
    min_allowed: int = 1  # a small cluster can still fix one node per window
    auto_close: bool = True  # close by itself once the nodes it acted on are back healthy
    auto_close_windows: int = 3  # a node not back within this many windows: an operator decides

    def __post_init__(self) -> None:
        problems = []
        if self.auto_close_windows < 1:
            problems.append(f"auto_close_windows must be >= 1, got {self.auto_close_windows}")
        if not 0 < self.max_share <= 1:
            problems.append(f"max_share must be in (0, 1], got {self.max_share}")
        if self.max_nodes is not None and self.max_nodes < 1:
            problems.append(f"max_nodes must be >= 1 or unset, got {self.max_nodes}")
        if self.window_seconds <= 0:
            problems.append(f"window_seconds must be > 0, got {self.window_seconds}")
        if self.min_allowed < 0:
            problems.append(f"min_allowed must be >= 0, got {self.min_allowed}")
        if problems:
            raise ValueError("breaker policy: " + "; ".join(problems))

    def allowed_nodes(self, cluster_gpu_nodes: int) -> int:
        """How many distinct nodes may be acted on within one window."""
        limit = math.floor(self.max_share * max(0, cluster_gpu_nodes) + 1e-9)
        if self.max_nodes is not None:
            limit = min(limit, self.max_nodes)
        limit = min(limit, MAX_WINDOW_NODES)
        return max(limit, self.min_allowed)


def new_state() -> dict[str, Any]:
    return {"state": CLOSED, "version": 0, "window": [], "backlog": [], "tripped_at": None,
            "trip_reason": "", "trips": 0, "last_reset_at": None, "last_reset_by": "",
            "tripped_nodes": [], "needs_operator": {}, "backlog_dropped": 0}


def normalize(item: Mapping[str, Any] | None) -> dict[str, Any]:
    """A state dict from a stored item (missing fields defaulted, numbers as float/int)."""
    state = new_state()
    if not item:
        return state
    state["state"] = TRIPPED if item.get("state") == TRIPPED else CLOSED
    state["version"] = int(item.get("version") or 0)
    state["trips"] = int(item.get("trips") or 0)
    state["trip_reason"] = str(item.get("trip_reason") or "")
    state["last_reset_by"] = str(item.get("last_reset_by") or "")
    for key in ("tripped_at", "last_reset_at"):
        state[key] = float(item[key]) if item.get(key) is not None else None
    state["window"] = [{"node": str(e["node"]), "action": str(e.get("action", "")), "at": float(e["at"]),
                        **causes.kept(e)} for e in item.get("window") or ()]
    state["backlog"] = [{"node": str(e["node"]), "action": str(e.get("action", "")), "at": float(e["at"]),
                         "job_id": str(e.get("job_id", "")), "reason": str(e.get("reason", ""))}
                        for e in item.get("backlog") or ()]
    state["tripped_nodes"] = sorted({str(n) for n in item.get("tripped_nodes") or ()})
    state["backlog_dropped"] = int(item.get("backlog_dropped") or 0)
    needs = item.get("needs_operator") or {}
    state["needs_operator"] = ({"at": float(needs.get("at") or 0), "reason": str(needs.get("reason") or "")}
                               if needs else {})
    return state


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _in_window(state: Mapping[str, Any], now: float, policy: BreakerPolicy) -> list[dict[str, Any]]:
    return [e for e in state["window"] if now - policy.window_seconds < e["at"] <= now]


def _nodes(window: list[dict[str, Any]]) -> set[str]:
    return {e["node"] for e in window}


def _with(window: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The window with ``entry``, replacing the node's earlier entry of the same action (its
    latest time keeps it in the window as long; the item does not grow per repeat)."""
    return [*(e for e in window if (e["node"], e["action"]) != (entry["node"], entry["action"])), entry]


def _backlog_entry(entry: dict[str, Any], job_id: str, reason: str) -> dict[str, Any]:
    return {**entry, "job_id": job_id, "reason": reason[:MAX_BACKLOG_REASON]}


def needs_cluster_count(state: Mapping[str, Any] | None, *, node: str, now: float,
                        policy: BreakerPolicy | None = None) -> bool:
    """Can the cluster's size change the answer to acting on ``node`` now? Not when the
    breaker is off or tripped, the node is already in the window, or one more node fits
    even the smallest limit (``allowed_nodes`` never falls below ``allowed_nodes(0)``):
    then nobody needs to list the cluster (the common single fault costs no ECS call)."""
    policy = policy or BreakerPolicy()
    current = normalize(state)
    if not policy.enabled or current["state"] == TRIPPED:
        return False
    nodes = _nodes(_in_window(current, now, policy))
    return node not in nodes and len(nodes) + 1 > policy.allowed_nodes(0)


def is_busy(state: Mapping[str, Any] | None, *, now: float, policy: BreakerPolicy | None = None) -> bool:
    """Tripped, holding a backlog, or with actions still inside the window."""
    policy = policy or BreakerPolicy()
    current = normalize(state)
    return (current["state"] == TRIPPED or bool(current["backlog"])
            or bool((state or {}).get("released")) or bool(_in_window(current, now, policy)))


@dataclass(frozen=True)
class BreakerDecision:
    allowed: bool  # carry the action out now
    state: dict[str, Any]  # write back (conditional on the version read)
    tripped_now: bool  # this call tripped it: notify once
    reason: str
    nodes_in_window: int
    limit: int


def _read(state: Mapping[str, Any] | None, now: float, cluster_gpu_nodes: int, policy: BreakerPolicy | None
          ) -> tuple[BreakerPolicy, dict[str, Any], list[dict[str, Any]], set[str], int]:
    """(the policy, the state normalized, its window's entries and their nodes at ``now``, the
    cluster's limit of nodes acted on in a window)."""
    policy = policy or BreakerPolicy()
    current = normalize(state)
    window = _in_window(current, now, policy)
    return policy, current, window, _nodes(window), policy.allowed_nodes(cluster_gpu_nodes)


def record_action(state: Mapping[str, Any] | None, *, node: str, action: str, now: float,
                  cluster_gpu_nodes: int, policy: BreakerPolicy | None = None, job_id: str = "",
                  reason: str = "", cause: Mapping[str, str] | None = None) -> BreakerDecision:
    """Ask to act on ``node`` (reboot / replace / quarantine). Idempotent for a node already
    acted on in the window and for an entry already in the backlog. ``cause``
    (``causes.cause_of``): recorded on the window's entry; past the limit, a window whose
    nodes share one cause (one job's own evidence) refuses this node without tripping."""
    policy, current, window, nodes, limit = _read(state, now, cluster_gpu_nodes, policy)
    if not policy.enabled:
        return BreakerDecision(True, current, False, "breaker disabled", len(nodes), limit)
    entry: dict[str, Any] = {"node": node, "action": action, "at": now, **(cause or {})}
    if current["state"] == TRIPPED:
        kept = "kept in the backlog"
        if not any(b["node"] == node and b["action"] == action for b in current["backlog"]):
            if len(current["backlog"]) < MAX_BACKLOG:
                current["backlog"].append(_backlog_entry(entry, job_id, reason))
            else:
                current["backlog_dropped"] += 1
                kept = f"not kept: the backlog is full ({MAX_BACKLOG} actions)"
            current["version"] += 1
        return BreakerDecision(False, current, False,
                               f"breaker tripped at {current['tripped_at']}: {current['trip_reason']}; "
                               f"{action} of {node} {kept}", len(nodes), limit)
    if node in nodes:
        current["window"] = _with(window, entry)
        current["version"] += 1
        return BreakerDecision(True, current, False, f"{node} already acted on in this window",
                               len(nodes), limit)
    if len(nodes) + 1 > limit and independent_causes([*window, entry]) <= 1:
        return BreakerDecision(False, current, False, f"{action} of {node} refused: "
                               f"{len(nodes) + 1} nodes past the limit {limit}, but "
                               f"{one_cause_note([*window, entry])}; the breaker not tripped",
                               len(nodes), limit)
    if len(nodes) + 1 > limit:
        why = (f"{len(nodes) + 1} of {cluster_gpu_nodes} GPU nodes would be acted on within "
               f"{policy.window_seconds:g} s (limit {limit}: {policy.max_share:.0%} of the cluster"
               + (f", at most {policy.max_nodes}" if policy.max_nodes is not None else "") + ")")
        current.update(state=TRIPPED, tripped_at=now, trip_reason=why, window=window,
                       tripped_nodes=sorted(nodes), needs_operator={},
                       backlog=[_backlog_entry(entry, job_id, reason)],
                       trips=current["trips"] + 1, version=current["version"] + 1)
        return BreakerDecision(False, current, True, f"breaker tripped: {why}; {action} of {node} "
                               "kept in the backlog", len(nodes), limit)
    current["window"] = _with(window, entry)
    current["version"] += 1
    return BreakerDecision(True, current, False, f"{len(nodes) + 1} of {limit} allowed nodes in the window",
                           len(nodes) + 1, limit)


def admit_release(state: Mapping[str, Any] | None, *, node: str, action: str, now: float,
                  cluster_gpu_nodes: int, policy: BreakerPolicy | None = None) -> BreakerDecision:
    """May a released backlog entry be carried out now? Only while the window has room (a
    node already in it is free): after a reset the backlog comes back at most a window's
    allowance at a time, never all at once. A refusal never trips the breaker and leaves
    the state as it is (the entry waits for a later sweep); a tripped breaker holds it."""
    policy, current, window, nodes, limit = _read(state, now, cluster_gpu_nodes, policy)
    if not policy.enabled:
        return BreakerDecision(True, current, False, "breaker disabled", len(nodes), limit)
    if current["state"] == TRIPPED:
        return BreakerDecision(False, current, False, f"breaker tripped again at {current['tripped_at']}: "
                               f"{action} of {node} waits for the next reset", len(nodes), limit)
    if node not in nodes and len(nodes) + 1 > limit:
        return BreakerDecision(False, current, False,
                               f"{len(nodes)} of {limit} allowed nodes already acted on within "
                               f"{policy.window_seconds:g} s: {action} of {node} waits", len(nodes), limit)
    current["window"] = _with(window, {"node": node, "action": action, "at": now})
    current["version"] += 1
    acted = len(nodes | {node})
    return BreakerDecision(True, current, False, f"released backlog entry: {acted} of {limit} allowed nodes "
                           "in the window", acted, limit)


@dataclass(frozen=True)
class BreakerReset:
    state: dict[str, Any]
    released: tuple[dict[str, Any], ...]  # backlog entries to carry out now
    dropped: tuple[dict[str, Any], ...]


def reset(state: Mapping[str, Any] | None, *, now: float, resume_backlog: bool,
          max_backlog_age_seconds: float | None = None, by: str = "") -> BreakerReset:
    """Close the breaker. ``resume_backlog`` releases the backlog (entries older than
    ``max_backlog_age_seconds`` are dropped anyway); otherwise it is dropped. The window
    starts empty, so released actions do not trip it again at once."""
    current = normalize(state)
    backlog = current["backlog"]
    if resume_backlog:
        fresh = [b for b in backlog
                 if max_backlog_age_seconds is None or now - b["at"] <= max_backlog_age_seconds]
        stale = [b for b in backlog if b not in fresh]
    else:
        fresh, stale = [], list(backlog)
    current.update(state=CLOSED, window=[], backlog=[], tripped_at=None, trip_reason="",
                   tripped_nodes=[], needs_operator={}, backlog_dropped=0,
                   last_reset_at=now, last_reset_by=by, version=current["version"] + 1)
    return BreakerReset(current, tuple(fresh), tuple(stale))


# ------------------------------------------------------------------ closing by itself
class AutoClose(str, Enum):
    """The breaker's answer to "may it close by itself now?"."""

    NOT_TRIPPED = "not_tripped"  # closed: nothing to decide
    OFF = "off"  # breaker_auto_close is false: only an operator closes it (as before)
    CLOSE = "close"  # close now, releasing the backlog at the window's rate
    WAIT = "wait"  # stays open for now; may close by itself later
    OPERATOR = "operator"  # stays open until an operator resets it


@dataclass(frozen=True)
class ActedOnNode:
    """What the caller read about a node the breaker had acted on when it tripped (its
    instance item). ``failed_again``: a fault decided on it after the trip (its fault
    history); a node whose new action the breaker keeps in its backlog failed again too."""

    state: InstanceState | None  # None: no item (gone from the loop)
    cordoned: bool = False
    failed_again: bool = False


@dataclass(frozen=True)
class AutoCloseAnswer:
    verdict: AutoClose
    reason: str
    nodes: tuple[str, ...] = ()  # the nodes it had acted on

    @property
    def standing(self) -> str:
        """What ``breaker show`` calls the state."""
        if self.verdict is AutoClose.NOT_TRIPPED:
            return "closed"
        if self.verdict in (AutoClose.WAIT, AutoClose.CLOSE):
            return "open, waiting to close by itself"
        return "open until an operator resets it"


def acted_on_nodes(state: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The nodes the breaker had acted on in the window that tripped it (an item written
    before they were recorded: its window, which a tripped breaker never changes)."""
    current = normalize(state)
    return tuple(current["tripped_nodes"] or sorted(_nodes(current["window"])))


# Actions whose success is the node out of service (quarantined, drained, or terminated in
# its Auto Scaling group): such a node is never "back healthy", and need not be.
TAKING_OUT_ACTIONS = frozenset({Action.REPLACE.value, Action.OPERATOR_ACTION.value})


def _taken_out(state: Mapping[str, Any]) -> set[str]:
    """Nodes whose latest action in the window that tripped the breaker took them out."""
    latest: dict[str, str] = {}
    for entry in sorted(state["window"], key=lambda e: float(e.get("at") or 0)):
        latest[str(entry["node"])] = str(entry.get("action") or "")
    return {node for node, action in latest.items() if action in TAKING_OUT_ACTIONS}


def _named(nodes: list[str]) -> str:
    more = f" and {len(nodes) - 10} more" if len(nodes) > 10 else ""
    return ", ".join(nodes[:10]) + more


def _where(node: str, view: ActedOnNode) -> str:
    state = view.state.value if view.state is not None else "-"
    return f"{node} ({state}{', cordoned' if view.cordoned else ''})"


def assess_auto_close(state: Mapping[str, Any] | None, *, now: float, policy: BreakerPolicy,
                      nodes_now: Mapping[str, ActedOnNode], cluster_gpu_nodes: int) -> AutoCloseAnswer:
    """May the tripped breaker close by itself now? ``nodes_now``: what was read about each
    of :func:`acted_on_nodes` (a node missing from it has no item).

    A node it took out of service (replace, operator action) is done once QUARANTINED or
    gone. It stays open until an operator resets it when a node it acted on failed again (a
    new fault since the trip, a new action held back for it, SUSPECT, or QUARANTINED or gone
    after a reboot: its remediation did not fix it), or is still not back ``auto_close_windows`` windows after
    the trip. It waits while the window since the trip has not passed, while a node is not
    back yet (rebooting, in a health check, uncordoning), or while more new nodes than the
    limit needed an action within the last window (the storm goes on). Otherwise it closes."""
    current = normalize(state)
    nodes = acted_on_nodes(current)
    if current["state"] != TRIPPED:
        return AutoCloseAnswer(AutoClose.NOT_TRIPPED, "the breaker is closed", nodes)
    if not policy.auto_close:
        return AutoCloseAnswer(AutoClose.OFF, "breaker_auto_close is false: only an operator's reset closes "
                               "the breaker", nodes)
    if current["needs_operator"]:
        return AutoCloseAnswer(AutoClose.OPERATOR, current["needs_operator"]["reason"], nodes)
    tripped_at = float(current["tripped_at"] or 0)
    held_again = {b["node"] for b in current["backlog"]}
    taken_out = _taken_out(current)
    settled = set()  # taken out of service as decided: its remediation is done, not failed
    for node in nodes:
        view = nodes_now.get(node, ActedOnNode(None))
        if view.failed_again or node in held_again:
            return AutoCloseAnswer(AutoClose.OPERATOR, f"{node} failed again after its remediation (a new "
                                   "fault since the breaker tripped): the reboots did not fix it", nodes)
        if node in taken_out and (view.state is InstanceState.QUARANTINED or view.state is None):
            settled.add(node)
            continue
        if view.state in (InstanceState.SUSPECT, InstanceState.QUARANTINED) or view.state is None:
            where = view.state.value if view.state is not None else "gone (no item)"
            return AutoCloseAnswer(AutoClose.OPERATOR, f"{node} is {where} after its remediation, not back "
                                   "healthy", nodes)
    earliest = tripped_at + policy.window_seconds
    if now < earliest:
        return AutoCloseAnswer(AutoClose.WAIT, f"a window ({policy.window_seconds:g} s) has not passed since "
                               f"the trip: it may close by itself from {_utc(earliest)}", nodes)
    not_back = [n for n in nodes if n not in settled
                and (nodes_now[n].state is not InstanceState.AVAILABLE or nodes_now[n].cordoned)]
    if not_back:
        late = now >= tripped_at + policy.auto_close_windows * policy.window_seconds
        where = ", ".join(_where(n, nodes_now[n]) for n in not_back[:10])
        if late:
            return AutoCloseAnswer(AutoClose.OPERATOR, f"{_named(not_back)} did not come back within "
                                   f"{policy.auto_close_windows} windows of the trip: {where}", nodes)
        return AutoCloseAnswer(AutoClose.WAIT, f"not back yet: {where}", nodes)
    limit = policy.allowed_nodes(cluster_gpu_nodes)
    storm = sorted({b["node"] for b in current["backlog"] if now - policy.window_seconds < b["at"] <= now})
    if len(storm) > limit:
        return AutoCloseAnswer(AutoClose.WAIT, f"{len(storm)} new nodes needed an action within the last "
                               f"window (limit {limit}): the storm goes on ({_named(storm)})", nodes)
    healthy = [n for n in nodes if n not in settled]
    back = _named(healthy) if healthy else "none acted on"
    out = f" ({_named(sorted(settled))} taken out of service as decided)" if settled else ""
    return AutoCloseAnswer(AutoClose.CLOSE, f"nodes {back} back healthy{out} and none failed again in "
                           f"{now - tripped_at:.0f} s since the trip", nodes)


def needs_operator(state: Mapping[str, Any] | None, *, now: float, reason: str) -> dict[str, Any]:
    """The tripped breaker's state once it decided it stays open until an operator resets
    it (recorded once: the sweep does not decide again, ``breaker show`` says why)."""
    current = normalize(state)
    current.update(needs_operator={"at": now, "reason": reason[:500]}, version=current["version"] + 1)
    return current


@dataclass(frozen=True)
class BreakerStatus:
    state: str
    nodes_in_window: int
    limit: int
    cluster_gpu_nodes: int
    utilization: float  # nodes in the window / limit
    backlog: tuple[dict[str, Any], ...]
    tripped_at: float | None
    trip_reason: str
    trips: int
    released: int = 0  # released by a reset, waiting for room in the window

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "nodes_in_window": self.nodes_in_window, "limit": self.limit,
                "cluster_gpu_nodes": self.cluster_gpu_nodes, "utilization": self.utilization,
                "backlog": list(self.backlog), "tripped_at": self.tripped_at,
                "trip_reason": self.trip_reason, "trips": self.trips, "released": self.released}

    def metrics(self) -> dict[str, float]:
        """CloudWatch metric values (cf. NVSentinel fault_quarantine_breaker_state / _utilization).
        The backlog counts every held-back action not carried out yet, released ones included."""
        return {"BreakerTripped": 1.0 if self.state == TRIPPED else 0.0,
                "BreakerUtilization": self.utilization,
                "BreakerBacklog": float(len(self.backlog) + self.released)}


def status(state: Mapping[str, Any] | None, *, now: float, cluster_gpu_nodes: int,
           policy: BreakerPolicy | None = None) -> BreakerStatus:
    policy = policy or BreakerPolicy()
    current = normalize(state)
    limit = policy.allowed_nodes(cluster_gpu_nodes)
    in_window = len(_nodes(_in_window(current, now, policy)))
    released = len(dict((state or {}).get("released") or {}))
    return BreakerStatus(current["state"], in_window, limit, cluster_gpu_nodes,
                         in_window / limit if limit else 0.0, tuple(current["backlog"]),
                         current["tripped_at"], current["trip_reason"], current["trips"], released)
