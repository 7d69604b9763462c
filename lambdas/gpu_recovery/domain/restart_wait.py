"""A restart that cannot be placed waits for its nodes; it never fails for a placement race.
Pure.

A shared cluster's normal life: a node the restart needs is busy (another scheduler took it,
its GPUs are still being released), its ECS agent is briefly disconnected, its container
instance is gone. StartTask says so with HTTP 200 and ``failures[].reason`` ``RESOURCE:*``,
``AGENT`` or ``MISSING`` (the ECS developer guide's "API failure reasons"). None of these is
the job's fault, so none fails it at once:

* the restart looks at its nodes before it claims the attempt (:func:`blocked_by`, on
  DescribeContainerInstances); a node it cannot use now is *blocked*, with the reason and,
  for a busy node, what holds it;
* a relocatable job leaves a blocked node for a healthy free one, as it leaves a bad one;
* otherwise the job *waits* (:class:`RestartWait` on its job item: since, until, the first
  blocked nodes and why, how many there are; shown by ``gpujobs show`` / ``watch``), still
  PENDING_RESTART (or STARTING, when the race came after its claim: the ranks not placed are
  tried again), keeps its nodes reserved for it (the ``reserved`` placement value), and tries
  again on the sweep and when a task stops on a blocked node;
* only after ``relocation_wait_seconds`` (the bound a relocation waits for a free node: one
  bound for both) does it fail, its e-mail naming the first five blocked nodes and what holds
  each, and how many more there are.

The wait is written once per attempt: a duplicate or late delivery neither extends nor
restarts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery.domain import ecs_instance_status as ecs_status

# StartTask's failure reasons that are a placement race, never the job's fault.
RACE_REASONS = ("RESOURCE", "AGENT", "MISSING")


def is_placement_race(reason: str) -> bool:
    """``RESOURCE:GPU``, ``RESOURCE:MEMORY``, ``AGENT``, ``MISSING`` (and an empty answer)."""
    return not reason or any(reason.upper().startswith(r) for r in RACE_REASONS)


def blocked_by(*, status: str | None, agent_connected: bool, free_gpus: int, needed_gpus: int) -> str:
    """Why the restart cannot start ranks needing ``needed_gpus`` GPUs on a node ECS describes
    so ("" when it can), in StartTask's words (``status`` None: ECS does not know the node)."""
    if status is None:
        return "MISSING: the container instance is gone"
    if not agent_connected:
        return "AGENT: its ECS agent is disconnected"
    if status != ecs_status.ACTIVE:
        return f"RESOURCE: the container instance is {status}"
    if free_gpus < needed_gpus:
        return f"RESOURCE:GPU: {free_gpus} of the {needed_gpus} GPUs it needs are free"
    return ""


NAMED_BLOCKED_NODES = 5  # the blocked nodes a wait names (its reason, its e-mail, its job item)


@dataclass(frozen=True)
class RestartWait:
    """The restart of ``attempt`` waiting for its blocked nodes, from ``since`` until ``until``
    (job item ``restart_wait``): ``blocked`` names the first few (node -> why, by node) and
    ``count`` says how many there are, so the job item stays small whatever the job's size."""

    attempt: int
    since: float
    until: float
    blocked: tuple[tuple[str, str], ...]
    count: int = 0  # every blocked node (at least the ones named)
    gpus: tuple[tuple[str, int], ...] = ()  # the GPUs the ranks of each named node need (): unknown

    @classmethod
    def start(cls, attempt: int, now: float, wait_seconds: float, blocked: Mapping[str, str],
              gpus: Mapping[str, int] | None = None) -> RestartWait:
        pairs, known = _pairs(blocked), gpus or {}
        named = pairs[:NAMED_BLOCKED_NODES]
        needs = tuple((node, int(known[node])) for node, _ in named if node in known)
        return cls(attempt, now, now + max(0.0, wait_seconds), named, len(pairs), needs)

    @classmethod
    def from_item(cls, raw: Mapping[str, Any] | None, attempt: int) -> RestartWait | None:
        """The wait of ``attempt`` (None: none, or an older attempt's)."""
        if not raw or int(raw.get("attempt") or 0) != attempt:
            return None
        named = _pairs(dict(raw.get("blocked") or {}))
        gpus = tuple(sorted((str(n), int(g)) for n, g in dict(raw.get("gpus") or {}).items()))
        return cls(attempt, float(raw.get("since") or 0), float(raw.get("until") or 0), named,
                   max(int(raw.get("count") or 0), len(named)), gpus)

    def now_blocked(self, blocked: Mapping[str, str]) -> RestartWait:
        """The same wait, naming what blocks its nodes now."""
        pairs = _pairs(blocked)
        return replace(self, blocked=pairs[:NAMED_BLOCKED_NODES], count=len(pairs))

    def to_item(self) -> dict[str, Any]:
        item = {"attempt": self.attempt, "since": self.since, "until": self.until,
                "blocked": {n: why[:300] for n, why in self.blocked}, "count": self.total}
        if self.gpus:
            item["gpus"] = dict(self.gpus)
        return item

    def named_needs(self) -> dict[str, int]:
        """The named nodes with the GPUs their ranks need ({}: not known, an older wait's or a
        StartTask race's): what a look at those nodes alone needs."""
        gpus = dict(self.gpus)
        if not self.blocked or any(node not in gpus for node, _ in self.blocked):
            return {}
        return {node: gpus[node] for node, _ in self.blocked}

    @property
    def total(self) -> int:
        return max(self.count, len(self.blocked))

    def expired(self, now: float) -> bool:
        return now >= self.until

    @property
    def seconds(self) -> int:
        return round(self.until - self.since)

    def _nodes(self) -> str:
        shown = self.blocked[:NAMED_BLOCKED_NODES]
        more = self.total - len(shown)
        named = "; ".join(f"{node}: {why}" for node, why in shown)
        return named + (f"; and {more} more node(s)" if more else "")

    def waiting_reason(self) -> str:
        return f"restart waiting up to {self.seconds} s for its node(s) to be free: {self._nodes()}"

    def timeout_reason(self) -> str:
        return (f"restart could not be placed within {self.seconds} s (relocation_wait_seconds): "
                f"{self._nodes()}")


def _pairs(blocked: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(n), str(w)) for n, w in blocked.items()))
