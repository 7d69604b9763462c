"""Relocation: which healthy free node takes each rank that must leave its node. Pure.

A rank keeps its node unless the node is unusable (quarantined, replaced, a node action
held back) or rebooting with ``relocate_instead_of_wait``. The ranks that move take
distinct spare nodes (one rank per node, never a node the job keeps), each with at
least the GPUs the rank held, best fit first (fewest free GPUs that fit, then node id):
the same input gives the same placement, and large free nodes stay free for large jobs.

No spare free: a relocatable tag-registered job *waits* (``RelocationWait`` on its job
item, still PENDING_RESTART) and the sweep tries again every minute until a node frees or
``relocation_wait_seconds`` pass; then it fails with that reason. While it waits, the
healthy free nodes it would take are reserved for it (``reserve_for_waits``, oldest wait
first): the queue scheduler and later relocations skip them, so a node that frees goes
to the waiting job before any other placement.

Hot spares (``spare_nodes``, :class:`SparePool`): the queue scheduler keeps that many
healthy, wholly free GPU nodes out of new queue work (``keep_spares``), offering them only
to queue jobs relocated off a bad node; a tag-registered job's relocation takes free nodes
as above, so the spares are what it finds. The pool is a count, not a list of
nodes: a bad node remediated in the background is a spare again once healthy and free.

Spare first (:func:`spare_first`): with a pool configured, a relocatable tag-registered
job whose suspect nodes still wait for their DCGM verdict leaves them for healthy free
nodes as soon as every old rank ended, instead of waiting for the verdicts; the nodes
are still diagnosed and remediated, the verdict going to the node only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# How long a relocatable job waits for a healthy node to free up (0: it fails at once).
DEFAULT_RELOCATION_WAIT_SECONDS = 1800
MAX_RELOCATION_WAIT_SECONDS = 7 * 24 * 3600


MAX_SPARE_PERCENT = 50.0
_SPARE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class SparePool:
    """``spare_nodes``: ``count`` nodes, or ``percent`` % of the cluster's GPU nodes
    (rounded up); both 0: no spare (every free node takes queue work)."""

    count: int = 0
    percent: float = 0.0

    @classmethod
    def parse(cls, raw: object) -> SparePool:
        """``2`` or ``"2"`` (nodes) or ``"5%"`` (of the GPU nodes, at most 50 %);
        raises ValueError."""
        if isinstance(raw, bool):
            raise ValueError(f"spare_nodes must be a node count or a percentage like 5%, got {raw!r}")
        if isinstance(raw, int):
            raw = str(raw)
        match = _SPARE_RE.match(str(raw)) if isinstance(raw, str) else None
        if match is None:
            raise ValueError(f"spare_nodes must be a node count or a percentage like 5%, got {raw!r}")
        number, percent = match.groups()
        if percent:
            value = float(number)
            if value > MAX_SPARE_PERCENT:
                raise ValueError(f"spare_nodes must be at most {MAX_SPARE_PERCENT:g}%, got {raw!r}")
            return cls(0, value)
        if "." in number:
            raise ValueError(f"spare_nodes must be a whole number of nodes, got {raw!r}")
        return cls(int(number), 0.0)

    def size(self, gpu_nodes: int) -> int:
        """Spares kept in a cluster of ``gpu_nodes`` GPU nodes."""
        if self.percent:
            return math.ceil(gpu_nodes * self.percent / 100 - 1e-9)
        return self.count

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent else str(self.count)

    @property
    def configured(self) -> bool:
        return self.count > 0 or self.percent > 0


# A fault with more suspect nodes than this waits for their verdicts: a cascade over many
# nodes is more likely the fabric or the job than as many dead GPUs, and a pool of a few
# spares could not take it anyway.
MAX_NODES_LEFT_BEFORE_VERDICT = 8


@dataclass(frozen=True)
class SpareFirst:
    """Whether a job in PENDING_HEALTHCHECK leaves its suspect nodes before their verdicts
    (``go``), or why it waits for them as before."""

    go: bool
    why: str


def spare_first(*, pool: SparePool, relocatable: bool, queue_job: bool, ranks_ended: bool,
                pending_verdicts: int, infra_recoveries_left: int, restarts_enforced: bool) -> SpareFirst:
    """Leave the suspect nodes now (the caller still needs a healthy free node for each
    node the job leaves; none: it waits for the verdicts as before). The move is charged
    to the infrastructure budget, as any relocation off a bad node: a job without one
    left waits for the verdicts, which decide its fate as before."""
    if not pool.configured:
        return SpareFirst(False, "no spare pool (spare_nodes=0)")
    if queue_job or not relocatable:
        return SpareFirst(False, "only relocatable tag-registered jobs move before the verdict")
    if not restarts_enforced:
        return SpareFirst(False, "restart_job is observed")
    if not ranks_ended:
        return SpareFirst(False, "old ranks still running")
    if pending_verdicts <= 0:
        return SpareFirst(False, "no verdict pending")
    if pending_verdicts > MAX_NODES_LEFT_BEFORE_VERDICT:
        return SpareFirst(False, f"{pending_verdicts} suspect nodes (more than "
                                 f"{MAX_NODES_LEFT_BEFORE_VERDICT}): waiting for their verdicts")
    if infra_recoveries_left <= 0:
        return SpareFirst(False, "no infrastructure recovery left: the verdicts decide")
    return SpareFirst(True, f"{pending_verdicts} suspect node(s) left before the verdict")


def keep_spares(size: int, free_nodes: Iterable[SpareNode]) -> set[str]:
    """The ``size`` nodes kept free as spares among the healthy, placeable nodes given:
    wholly free ones only (a node partly in use is no spare), the largest first (a spare
    fits any rank), then node id (the same input keeps the same nodes). Fewer wholly free
    nodes than ``size``: all of them (the pool refills as jobs end and nodes heal)."""
    if size <= 0:
        return set()
    whole = sorted((n for n in free_nodes if n.total_gpus > 0 and n.free_gpus >= n.total_gpus),
                   key=lambda n: (-n.total_gpus, n.node_id))
    return {n.node_id for n in whole[:size]}


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


@dataclass(frozen=True)
class RelocationWait:
    """A relocatable job of ``attempt`` waiting for healthy free nodes for the ranks of
    ``from_nodes`` (``gpus`` each), from ``since`` until ``until`` (job item
    ``relocation_wait``). Written once per fault: a duplicate never extends it."""

    job_id: str
    attempt: int
    since: float
    until: float
    from_nodes: tuple[str, ...]
    gpus: tuple[int, ...]
    why: str = ""

    @classmethod
    def start(cls, job_id: str, attempt: int, now: float, wait_seconds: float, from_nodes: Sequence[str],
              gpus: Sequence[int], why: str) -> RelocationWait:
        return cls(job_id, attempt, now, now + wait_seconds, tuple(from_nodes),
                   tuple(int(g) or 1 for g in gpus), why[:500])

    @classmethod
    def from_item(cls, job_id: str, raw: Mapping[str, Any] | None, attempt: int) -> RelocationWait | None:
        """The wait of ``attempt`` (None: none, or an older fault's)."""
        if not raw or int(raw.get("attempt") or 0) != attempt:
            return None
        nodes = tuple(str(n) for n in raw.get("from_nodes") or ())
        gpus = tuple(int(g) for g in raw.get("gpus") or ())
        if len(gpus) != len(nodes):
            gpus = (1,) * len(nodes)
        return cls(job_id, attempt, float(raw.get("since") or 0), float(raw.get("until") or 0), nodes, gpus,
                   str(raw.get("why") or ""))

    def to_item(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "since": self.since, "until": self.until,
                "from_nodes": list(self.from_nodes), "gpus": list(self.gpus), "why": self.why}

    @property
    def seconds(self) -> int:
        return round(self.until - self.since)

    @property
    def needs(self) -> dict[int, int]:
        """rank slot -> GPUs, in ``choose_targets``' shape."""
        return dict(enumerate(self.gpus))

    def expired(self, now: float) -> bool:
        return now >= self.until

    def waiting_reason(self) -> str:
        return (f"waiting up to {self.seconds} s for a healthy node to free up to relocate the ranks on "
                f"{', '.join(self.from_nodes[:10])} ({self.why})")

    def timeout_reason(self) -> str:
        return (f"no healthy node freed within {self.seconds} s to relocate the ranks on "
                f"{', '.join(self.from_nodes[:10])} ({self.why})")


def reserve_for_waits(waits: Sequence[RelocationWait], spares: Sequence[SpareNode]) -> dict[str, str]:
    """node -> job id: the healthy free nodes each waiting job would take, oldest wait
    first, best fit, even when not all of its ranks fit yet (a node that frees is kept for
    the job until the others free too or its wait ends)."""
    free = sorted(spares, key=lambda n: (n.free_gpus, n.node_id))
    reserved: dict[str, str] = {}
    for wait in sorted(waits, key=lambda w: (w.since, w.job_id)):
        needs = wait.needs
        for slot in sorted(needs, key=lambda r: (-needs[r], r)):
            node = next((n for n in free if n.node_id not in reserved and n.free_gpus >= needs[slot]), None)
            if node is not None:
                reserved[node.node_id] = wait.job_id
    return reserved


def relocation_reason(fatal: list[str], rebooting: list[str], *, labels: Mapping[str, str], left: list[str],
                      blocked: Mapping[str, str] | None = None) -> str:
    """Why a job moves: its ``fatal`` nodes (``labels``: each suspect node's verdict, lower case;
    ``left``: those left before their verdict), those ``rebooting`` it does not wait for, and
    those ``blocked`` (not free for the restart: node -> why)."""
    if blocked:
        busy = "; ".join(f"{n}: {w}" for n, w in sorted(blocked.items())[:5])
        rest = relocation_reason(fatal, rebooting, labels=labels, left=left) if fatal or rebooting else ""
        return f"{rest + '; ' if rest else ''}node(s) not free for the restart: {busy}"[:500]
    if left and set(fatal) <= set(left):
        return (f"node(s) suspect: {', '.join(left[:10])} left before the DCGM verdict (checked and "
                f"remediated in the background)")
    if fatal:
        shown = ", ".join(f"{i} {labels.get(i, 'unusable')}" for i in fatal[:10])
        more = f" and {len(fatal) - 10} more" if len(fatal) > 10 else ""
        return f"node(s) unusable: {shown}{more}"
    return f"node(s) rebooting ({', '.join(rebooting[:10])}): relocate_instead_of_wait"
