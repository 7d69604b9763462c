"""Time-sharing policy: priority levels, node quotas per user and level, the AUTO priority,
the victims of a preemption, ABOVE_NORMAL demotion and the suspend grace.

Pure: no I/O, no clock, no environment. The queue scheduler feeds it what it read; the
benchmark's simulated day runs the very same functions.

Rules (seed ``hai-time-sharing-scheduling.md``, Kueue's ``withinClusterQueue:
LowerPriority``):

* **Quota**: a user holds at most ``limit`` nodes at once at a priority level (a node per
  rank of each running job admitted at that level). A level without a limit (neither set
  by an administrator nor by the deployment's default) is unlimited.
* **AUTO**: the highest level the caller may use where it has a quota with room for the
  job; levels without a quota do not count; with none, NORMAL.
* **Victims** of a job that cannot be placed are running queue jobs of strictly lower
  priority (never a job of the same user at the same priority), whole gangs. Among the
  sets of victims that make room, the one freeing the fewest nodes wins, then the one of
  the lowest priorities, then the most recently started.
* **Demotion**: an ABOVE_NORMAL job that has run ``demote_after`` (30 minutes) drops to
  NORMAL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum

# ----------------------------------------------------------------------- priorities


class Priority(IntEnum):
    """Priority levels (HAI-style); higher runs first, equal priority is FIFO."""

    LOW = 0
    BELOW_NORMAL = 5
    NORMAL = 10
    ABOVE_NORMAL = 20
    HIGH = 30
    VERY_HIGH = 40
    EXTREME_HIGH = 50


PRIORITY_VALUES = frozenset(int(p) for p in Priority)
PRIORITY_NAMES = {p.name: int(p) for p in Priority}
AUTO_PRIORITY = "AUTO"  # resolved at submit: see resolve_auto_priority
LEVELS_HIGH_TO_LOW = tuple(sorted(PRIORITY_VALUES, reverse=True))


def priority_name(value: int) -> str:
    try:
        return Priority(value).name
    except ValueError:
        return str(value)


def parse_priority(value: int | str) -> int:
    """A level name (any case) or its value -> the value; ValueError names the choices."""
    if isinstance(value, bool):
        raise ValueError("must be a priority level name or value")
    if isinstance(value, str):
        text = value.strip().upper()
        if text in PRIORITY_NAMES:
            return PRIORITY_NAMES[text]
        if not text.isdigit():
            raise ValueError(f"must be one of {', '.join(PRIORITY_NAMES)}")
        value = int(text)
    if value not in PRIORITY_VALUES:
        raise ValueError("must be one of " + ", ".join(f"{n}={v}" for n, v in PRIORITY_NAMES.items()))
    return int(value)


# ------------------------------------------------------------------------ suspension


class SuspendKind(str, Enum):
    PREEMPTED = "preempted"  # the scheduler made room for a higher-priority job: queued again
    USER = "user"  # the owner asked (gpujobs suspend): held until resumed
    SELF = "self"  # the job called go_suspend() on its own: queued again
    # A driver warning on one of its nodes: checkpoint and stop, restart elsewhere at the
    # head of its priority (no checkpoint within the bound: the job keeps running).
    MOVED = "moved"


MIN_SUSPEND_GRACE_SECONDS = 5  # the seed's grace
MAX_SUSPEND_GRACE_SECONDS = 3600
DEFAULT_SUSPEND_GRACE_SECONDS = 60
DEFAULT_DEMOTE_AFTER_SECONDS = 30 * 60


def suspend_record(kind: SuspendKind, reason: str, *, grace_seconds: int, now: float, hold: bool = False,
                   by_job: str = "", by_user: str = "", by_priority: int | None = None) -> dict[str, object]:
    """The ``suspend`` attribute of a job being suspended (what rank 0 and the sweep read)."""
    record: dict[str, object] = {"kind": kind.value, "reason": reason[:500], "requested_at": now,
                                 "grace_seconds": grace_seconds, "deadline_at": now + grace_seconds,
                                 "hold": hold, "by_job": by_job, "by_user": by_user}
    if by_priority is not None:
        record["by_priority"] = by_priority
    return record


def demotion_due(priority: int, running_since: float | None, now: float, demote_after: int) -> bool:
    """An ABOVE_NORMAL job that has run ``demote_after`` seconds drops to NORMAL (0: never)."""
    return (priority == Priority.ABOVE_NORMAL and demote_after > 0 and running_since is not None
            and now - running_since >= demote_after)


# ---------------------------------------------------------------------------- quotas


def quota_key(subject: str, priority: int) -> str:
    return f"{subject}#{priority:03d}"


@dataclass
class QuotaEntry:
    limit: int | None  # set by an administrator (None: the deployment's default applies)
    used: int = 0


class QuotaBook:
    """Limits and usage of one tick (or of a simulated day).

    ``loader(subject, priority)`` returns the stored entry (None: nothing stored yet); it
    is called once per (subject, level). ``defaults`` are the deployment's limits per level.
    """

    def __init__(self, defaults: Mapping[int, int] | None = None,
                 loader: Callable[[str, int], QuotaEntry | None] | None = None) -> None:
        self.defaults = dict(defaults or {})
        self._loader = loader or (lambda subject, priority: None)
        self._entries: dict[tuple[str, int], QuotaEntry] = {}

    def entry(self, subject: str, priority: int) -> QuotaEntry:
        key = (subject, priority)
        if key not in self._entries:
            self._entries[key] = self._loader(subject, priority) or QuotaEntry(None, 0)
        return self._entries[key]

    def limit(self, subject: str, priority: int) -> int | None:
        explicit = self.entry(subject, priority).limit
        return explicit if explicit is not None else self.defaults.get(priority)

    def used(self, subject: str, priority: int) -> int:
        return max(0, self.entry(subject, priority).used)

    def room(self, subject: str, priority: int) -> int | None:
        """Nodes the user may still take at that level (None: no limit)."""
        limit = self.limit(subject, priority)
        return None if limit is None else max(0, limit - self.used(subject, priority))

    def refusal(self, subject: str, priority: int, nodes: int) -> str:
        """Why a job of ``nodes`` nodes may not start now ("" when it may)."""
        limit = self.limit(subject, priority)
        if limit is None:
            return ""
        used = self.used(subject, priority)
        if used + nodes <= limit:
            return ""
        return (f"quota: {subject} holds {used} of {limit} node(s) at {priority_name(priority)}; "
                f"this job needs {nodes}")

    def never_fits(self, subject: str, priority: int, nodes: int) -> str:
        """Why a job can never start at that level, even with nothing of the user's running."""
        limit = self.limit(subject, priority)
        if limit is not None and nodes > limit:
            return (f"{subject} may hold at most {limit} node(s) at {priority_name(priority)}; "
                    f"the job needs {nodes}")
        return ""

    def charge(self, subject: str, priority: int, nodes: int) -> None:
        self.entry(subject, priority).used += nodes

    def release(self, subject: str, priority: int, nodes: int) -> None:
        entry = self.entry(subject, priority)
        entry.used = max(0, entry.used - nodes)


def resolve_auto_priority(book: QuotaBook, subject: str, nodes: int,
                          allowed: Iterable[int]) -> tuple[int, str]:
    """AUTO -> the highest allowed level with a quota that has room for ``nodes``."""
    for level in sorted(allowed, reverse=True):
        room = book.room(subject, level)
        if room is not None and room >= nodes:
            limit = book.limit(subject, level)
            return level, (f"AUTO: {priority_name(level)}, the highest level with quota room "
                           f"({book.used(subject, level)} of {limit} node(s) in use)")
    return int(Priority.NORMAL), "AUTO: NORMAL (no priority level has a quota with room for the job)"


# --------------------------------------------------------------------------- victims


@dataclass(frozen=True)
class RunningGang:
    """A running queue job as preemption sees it."""

    job_id: str
    user: str  # quota subject of its owner
    priority: int
    started_at: float
    footprint: Mapping[str, int]  # node -> GPUs its rank holds there
    preempted_for: str = ""  # being suspended to make room for this job ("": not)

    @property
    def nodes(self) -> int:
        return len(self.footprint)


@dataclass(frozen=True)
class Preemptor:
    job_id: str
    user: str
    priority: int
    nnodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class VictimChoice:
    victims: tuple[str, ...]  # jobs to suspend now (empty: jobs already suspending suffice)
    nodes_freed: int
    reason: str
    waiting_for: tuple[str, ...] = ()  # jobs already being suspended for this one


def may_preempt(preemptor: Preemptor, gang: RunningGang) -> bool:
    """Strictly lower priority; never the same user at the same priority (seed rule)."""
    if gang.user == preemptor.user and gang.priority == preemptor.priority:
        return False
    return gang.priority < preemptor.priority


def _fits(available: Mapping[str, int], need: Preemptor) -> bool:
    return sum(1 for gpus in available.values() if gpus >= need.gpus_per_node) >= need.nnodes


def _with(available: Mapping[str, int], gangs: Iterable[RunningGang]) -> dict[str, int]:
    out = dict(available)
    for gang in gangs:
        for node, gpus in gang.footprint.items():
            if node in out:
                out[node] += gpus
    return out


def _preference(gang: RunningGang) -> tuple[int, float, str]:
    """Lowest priority first, then the most recently started."""
    return (gang.priority, -gang.started_at, gang.job_id)


def _cost(chosen: Sequence[RunningGang]) -> tuple[int, tuple[int, ...], tuple[float, ...]]:
    return (sum(g.nodes for g in chosen), tuple(sorted((g.priority for g in chosen), reverse=True)),
            tuple(sorted(-g.started_at for g in chosen)))


def choose_victims(preemptor: Preemptor, available: Mapping[str, int], capacity: Mapping[str, int],
                   running: Sequence[RunningGang]) -> VictimChoice | None:
    """Which running gangs to suspend so ``preemptor`` fits, or None if no set would.

    ``available``: free GPUs now on every node the preemptor may use (eligible, not held
    for a job ahead of it); ``capacity``: their registered GPUs. Gangs already being
    suspended for this job count as freed first; if they suffice nothing more is chosen.
    """
    usable = {n for n, total in capacity.items() if n in available and total >= preemptor.gpus_per_node}
    base = {n: gpus for n, gpus in available.items() if n in usable}
    pending = [g for g in running if g.preempted_for == preemptor.job_id]
    base = _with(base, pending)
    waiting = tuple(sorted(g.job_id for g in pending))
    if _fits(base, preemptor):
        return VictimChoice((), 0, "jobs already being suspended make room", waiting)
    candidates = [g for g in running if not g.preempted_for and may_preempt(preemptor, g)
                  and any(n in usable for n in g.footprint)]
    if not _fits(_with(base, candidates), preemptor):
        return None
    best: list[RunningGang] | None = None
    orders: tuple[Callable[[RunningGang], tuple[object, ...]], ...] = (
        lambda g: (g.nodes, *_preference(g)), _preference)
    for order in orders:
        chosen: list[RunningGang] = []
        avail = dict(base)
        for gang in sorted(candidates, key=order):
            if _fits(avail, preemptor):
                break
            # Only a gang that frees GPUs on a node still too full for a rank helps.
            if any(n in avail and avail[n] < preemptor.gpus_per_node for n in gang.footprint):
                chosen.append(gang)
                avail = _with(avail, [gang])
        if not _fits(avail, preemptor):
            continue
        # Drop every victim the others make unnecessary: the largest, then the least
        # preferred (highest priority, oldest) first.
        for gang in sorted(chosen, key=lambda g: (-g.nodes, -g.priority, g.started_at, g.job_id)):
            rest = [g for g in chosen if g is not gang]
            if _fits(_with(base, rest), preemptor):
                chosen = rest
        if best is None or _cost(chosen) < _cost(best):
            best = chosen
    if best is None:
        return None
    best = sorted(best, key=_preference)
    names = ", ".join(f"{g.job_id} ({priority_name(g.priority)}, {g.nodes} node(s))" for g in best)
    return VictimChoice(tuple(g.job_id for g in best), sum(g.nodes for g in best),
                        f"suspending {names} to make room for {preemptor.job_id} "
                        f"({priority_name(preemptor.priority)}, {preemptor.nnodes}x"
                        f"{preemptor.gpus_per_node} GPUs)", waiting)


@dataclass
class PreemptionLedger:
    """Victims decided during one tick: a gang is a victim once, its nodes freed once."""

    claimed: set[str] = field(default_factory=set)  # nodes a preemptor waits for this tick
    suspended: set[str] = field(default_factory=set)  # jobs asked to suspend this tick
