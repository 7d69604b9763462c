"""A job held by the blast-radius breaker: it waits instead of failing. Pure.

When the breaker holds back a node's reboot, a job that can move (relocatable) moves to
healthy nodes as for any unusable node. A job that cannot move would fail for a node that
only needs the reboot the breaker is keeping back; instead it waits in HELD
(:class:`BreakerHold` on its job item, its budget not charged for the wait) until

* the reboot is carried out (``breaker reset --resume-backlog``, or the breaker closing by
  itself once the nodes it acted on are back healthy) and every node it waits for is back
  and healthy: it goes on with its normal recovery (the gang restart on its
  nodes, charged once for the fault as any reboot would have been);
* the operator drops the backlog (``--drop-backlog``): nothing will reboot the node, so it
  fails at once with that reason (the node stays SUSPECT and cordoned for a person);
* a node it waits for is lost otherwise (its reboot timed out and it was quarantined,
  an operator drained it): it fails as a job on a quarantined node does;
* ``held_job_deadline_seconds`` pass: it fails naming the node and the hold.

The sweep looks at a held job once a minute (its deadline in the sparse due index) and
:func:`judge_hold` decides from what it read: the nodes' states and the breaker's backlog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpu_recovery.domain.states import HEALTH_CHECK_STATES, InstanceState

# How long a job that cannot move waits for the breaker's reset (0: it fails at once, as
# before the hold existed). An hour: an operator paged by the trip has time to find the
# common cause and reset; a job is not kept from its owner for a day.
DEFAULT_HELD_JOB_DEADLINE_SECONDS = 3600
MAX_HELD_JOB_DEADLINE_SECONDS = 7 * 24 * 3600
REBOOT = "reboot"  # a held action a job waits for (a replacement never lets it back)
# ... and a GPU reset (a reboot if the reset fails): the node comes back either way.
HOLDABLE_ACTIONS = frozenset({REBOOT, "reset_gpu"})


@dataclass(frozen=True)
class BreakerHold:
    """A job of ``attempt`` waiting since ``since`` until ``until`` for ``nodes`` whose
    reboot the breaker held back (job item ``breaker_hold``). ``spend``: the budget its
    restart is charged once it goes on ("" when the node's repeat is not charged again).
    Written once per fault: re-entering the hold (one node back, another still held) keeps
    its deadline."""

    job_id: str
    attempt: int
    since: float
    until: float
    nodes: tuple[str, ...]
    spend: str = "infrastructure"
    why: str = ""
    resumed_at: float | None = None  # every node back: the job went on with its restart

    @classmethod
    def start(cls, job_id: str, attempt: int, now: float, seconds: float, nodes: Sequence[str], *,
              spend: str, why: str) -> BreakerHold:
        return cls(job_id, attempt, now, now + seconds, tuple(sorted(nodes)), spend, why[:500])

    @classmethod
    def from_item(cls, job_id: str, raw: Mapping[str, Any] | None, attempt: int) -> BreakerHold | None:
        """The hold of ``attempt`` (None: none, or an older fault's, or only its budget)."""
        if not raw or int(raw.get("attempt") or 0) != attempt or raw.get("until") is None:
            return None
        return cls(job_id, attempt, float(raw.get("since") or 0), float(raw.get("until") or 0),
                   tuple(str(n) for n in raw.get("nodes") or ()), str(raw.get("spend") or ""),
                   str(raw.get("why") or ""),
                   float(raw["resumed_at"]) if raw.get("resumed_at") is not None else None)

    @staticmethod
    def owed(raw: Mapping[str, Any] | None, attempt: int) -> str:
        """The budget ``attempt``'s restart owes for a held verdict whose job was never HELD
        (the write that holds it failed until every node was back): the verdict left the
        charge to the hold, so the restart that goes on without one pays it ("": nothing owed)."""
        if not raw or int(raw.get("attempt") or 0) != attempt or raw.get("until") is not None:
            return ""
        return str(raw.get("spend") or "")

    def to_item(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "since": self.since, "until": self.until,
                "nodes": list(self.nodes), "spend": self.spend, "why": self.why}

    @property
    def seconds(self) -> int:
        return round(self.until - self.since)

    def expired(self, now: float) -> bool:
        return now >= self.until

    def named(self) -> str:
        more = f" and {len(self.nodes) - 10} more" if len(self.nodes) > 10 else ""
        return ", ".join(self.nodes[:10]) + more

    def waiting_reason(self) -> str:
        return (f"held: waiting up to {self.seconds} s for the blast-radius breaker's reset to reboot "
                f"{self.named()} ({self.why}); budget not charged while held")

    def timeout_reason(self) -> str:
        return (f"held {self.seconds} s (held_job_deadline_seconds) waiting for the reboot of "
                f"{self.named()}, held back by the blast-radius breaker; nobody reset the breaker in time")

    def dropped_reason(self, node: str, by: str) -> str:
        who = f" by {by}" if by else ""
        return (f"the blast-radius breaker's backlog was dropped{who} (reset --drop-backlog): nothing will "
                f"reboot {node}, which stays SUSPECT and cordoned; the job cannot restart on its nodes")

    def lost_reason(self, node: str, state: str) -> str:
        return (f"{node}, whose reboot the blast-radius breaker held back, is {state} now: the job cannot "
                "restart on its nodes")


class NodeStanding(str, Enum):
    """Where a node a held job waits for stands."""

    BACK = "back"  # AVAILABLE and not cordoned: healthy again
    HELD = "held"  # SUSPECT, its reboot in the breaker's backlog (or released, not carried out yet)
    IN_PROGRESS = "in_progress"  # released: rebooting, or in a health check
    DROPPED = "dropped"  # SUSPECT with a held reboot the backlog no longer has
    LOST = "lost"  # anything else: quarantined, held for a replacement, gone


@dataclass(frozen=True)
class NodeView:
    """What the sweep read about one node (its instance item)."""

    state: InstanceState | None  # None: no item
    cordoned: bool = False
    held_action: str = ""  # breaker_blocked.action ("" when not held back)


def standing(view: NodeView, *, in_backlog: bool) -> NodeStanding:
    """``in_backlog``: the node is in the breaker's backlog or in what a reset released."""
    if view.state is InstanceState.AVAILABLE:
        return NodeStanding.IN_PROGRESS if view.cordoned else NodeStanding.BACK
    if view.state is InstanceState.REBOOTING or view.state in HEALTH_CHECK_STATES:
        return NodeStanding.IN_PROGRESS
    if view.state is InstanceState.SUSPECT and view.held_action in HOLDABLE_ACTIONS:
        return NodeStanding.HELD if in_backlog else NodeStanding.DROPPED
    return NodeStanding.LOST


def holdable(views: Mapping[str, NodeView], *, backlog: frozenset[str]) -> bool:
    """May a job that cannot move wait for these nodes (each back, held for a reboot, or
    being rebooted after a reset)? A node lost or held for anything else fails it as before."""
    return all(standing(v, in_backlog=n in backlog) in (NodeStanding.BACK, NodeStanding.HELD,
                                                         NodeStanding.IN_PROGRESS)
               for n, v in views.items())


class HoldAction(str, Enum):
    WAIT = "wait"
    RESUME = "resume"  # every node back: the job goes on with its restart
    FAIL = "fail"


@dataclass(frozen=True)
class HoldJudgement:
    action: HoldAction
    reason: str = ""


def judge_hold(hold: BreakerHold, views: Mapping[str, NodeView], *, backlog: frozenset[str], now: float,
               reset_by: str = "") -> HoldJudgement:
    """The sweep's decision for a held job: fail when a node is lost or its reboot was
    dropped (at once: waiting longer cannot help) or at the deadline; go on once every node
    is back; wait otherwise."""
    for node in hold.nodes:
        view = views.get(node, NodeView(None))
        where = standing(view, in_backlog=node in backlog)
        if where is NodeStanding.DROPPED:
            return HoldJudgement(HoldAction.FAIL, hold.dropped_reason(node, reset_by))
        if where is NodeStanding.LOST:
            state = view.state.value if view.state is not None else "unknown to the loop"
            return HoldJudgement(HoldAction.FAIL, hold.lost_reason(node, state))
    if all(standing(views.get(n, NodeView(None)), in_backlog=n in backlog) is NodeStanding.BACK
           for n in hold.nodes):
        return HoldJudgement(HoldAction.RESUME, f"every node the job was held for is back ({hold.named()})")
    if hold.expired(now):
        return HoldJudgement(HoldAction.FAIL, hold.timeout_reason())
    return HoldJudgement(HoldAction.WAIT, hold.waiting_reason())


def backlog_nodes(breaker_item: Mapping[str, Any] | None) -> frozenset[str]:
    """Nodes whose held-back action the breaker still keeps: its backlog, and what a reset
    released and the sweep has not carried out yet."""
    item = breaker_item or {}
    nodes = {str(e.get("node", "")) for e in item.get("backlog") or ()}
    nodes |= {str(n) for n in dict(item.get("released") or {})}
    nodes.discard("")
    return frozenset(nodes)
