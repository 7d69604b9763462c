"""A job's goodput ledger: its wall time split into productive time and badput by cause.

Computed from what the job item already records: its history (every state change, with its
time, appended in the same conditional write as the change) and the few facts a fault's
transition adds to its history entry (``gp``: when the fault happened, the last checkpoint
the training client reported, the node and the catalog rule). The history keeps its newest
entries only; the entries it drops are first folded into a bounded map on the item
(:func:`advance`, the ``goodput`` attribute): a fixed set of counters plus the top
``TOP_N`` nodes and rules, never a list that grows with recoveries.

Pure: no I/O, no clock (the caller passes ``now``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.domain.states import JobState

# The stack's causes (badput it can shrink) and productive time, in the order shown.
PRODUCTIVE = "productive"
LOST_WORK = "lost_work"
DETECTION = "detection"
STOPPING = "stopping"
DIAGNOSIS = "diagnosis"
REPAIR = "repair"
VALIDATION = "validation"
WAITING_FOR_CAPACITY = "waiting_for_capacity"
RESTART = "restart"
PREFLIGHT = "preflight"
STACK_CAUSES = (LOST_WORK, DETECTION, STOPPING, DIAGNOSIS, REPAIR, VALIDATION, WAITING_FOR_CAPACITY,
                RESTART, PREFLIGHT)
# Time of the job's own making (or its user's): out of ETTR's denominator.
SUSPENDED = "suspended"
PREEMPTED = "preempted"
QUEUED = "queued"
APPLICATION_ERROR = "application_error"
OWN_CAUSES = (SUSPENDED, PREEMPTED, QUEUED, APPLICATION_ERROR)
CAUSES = (PRODUCTIVE, *STACK_CAUSES, *OWN_CAUSES)
# Not the stack's own share: the work a crash destroys (only checkpoints shrink it) and the
# repair itself (a reboot or a replacement takes what it takes).
OUTSIDE_STACK_SHARE = (LOST_WORK, REPAIR)
TOP_N = 8  # nodes and rules kept per job (the most costly)
GP = "gp"  # the history entry's key for a transition's ledger facts
LEDGER_KEY = "goodput"  # the job item's folded ledger

_WALL_END = frozenset({JobState.CANCELING.value, JobState.COMPLETE.value, JobState.FAILED.value,
                       JobState.USER_STOPPED.value, JobState.CANCELED.value})
_QUEUE_STATES = frozenset({JobState.QUEUED.value, JobState.PENDING_RESOURCES.value})
# The gang is being stopped at the start of these (a fault's first wait).
_STOPPING_STATES = frozenset({JobState.PENDING_HEALTHCHECK.value, JobState.PENDING_RESTART.value})
_SUSPEND_STATES = frozenset({JobState.SUSPENDING.value, JobState.SUSPENDED.value})
_STATE_CAUSE = {JobState.STARTING.value: RESTART, JobState.RUNNING.value: PRODUCTIVE,
                JobState.NODE_LOST.value: DETECTION, JobState.HUNG.value: DETECTION,
                JobState.PENDING_HEALTHCHECK.value: DIAGNOSIS, JobState.PENDING_RESTART.value: REPAIR,
                JobState.HELD.value: REPAIR}


def fault_marks(*, fault_at: float | None, checkpoint_at: float | None, node: str = "", rule: str = "",
                own: bool = False) -> dict[str, Any]:
    """The ``gp`` facts of a transition that ends training on a fault (a rank's exit)."""
    marks: dict[str, Any] = {"fault": True}
    if fault_at is not None:
        marks["fault_at"] = float(fault_at)
    if checkpoint_at is not None:
        marks["ckpt_at"] = float(checkpoint_at)
    if node:
        marks["node"] = node[:64]
    if rule:
        marks["rule"] = rule[:96]
    if own:
        marks["own"] = True
    return marks


def cause_marks(cause: str) -> dict[str, Any]:
    """The ``gp`` facts of a transition whose next interval has a known cause."""
    if cause not in CAUSES:
        raise ValueError(f"unknown goodput cause {cause!r}")
    return {"cause": cause}


def wait_cause(*, relocate: bool, repair: bool, application: bool) -> str:
    """What a job waits for once its fault's verdicts are in (its PENDING_RESTART)."""
    if relocate:
        return WAITING_FOR_CAPACITY
    if repair:
        return REPAIR
    return APPLICATION_ERROR if application else RESTART


def stop_marks(stopped: Mapping[str, Any] | None, attempt: int) -> dict[str, Any]:
    """When the gang of ``attempt`` had stopped (``Job.stopped``), for the transition that
    ends the wait it was part of ({} when not yet known)."""
    stopped = stopped or {}
    if stopped.get("at") is None or int(stopped.get("attempt") or 0) != attempt:
        return {}
    return {"stopped_at": float(stopped["at"])}


def running_marks(running_at: float) -> dict[str, Any]:
    """When the attempt was seen running, for its STARTING -> RUNNING confirmed later."""
    return {"running_at": float(running_at)}


def interval_marks(cause: str, until: float) -> dict[str, Any]:
    """The ``gp`` facts of a RUNNING -> RUNNING mark: the open RUNNING interval was ``cause``
    until ``until``, productive after (a gang restart's tasks running only at rank 0's RUNNING
    event: ``restart``; the gang preflight, until its conclusion: ``preflight``)."""
    if cause not in CAUSES:
        raise ValueError(f"unknown goodput cause {cause!r}")
    return {"was": cause, "until": float(until)}


def interval_mark_attribute(cause: str) -> str:
    """The job item's attribute naming the attempt whose ``cause`` interval mark is written."""
    return f"gp_{cause}_attempt"


def ran_from_marks(ran_from: float | None) -> dict[str, Any]:
    """When the task whose stop ends a gang restart's RUNNING started (its ``startedAt``), for
    that transition when rank 0's RUNNING event never marked it: restart until then, as the
    mark would have said (else the tasks' pull and start would count as training)."""
    return {} if ran_from is None else {"ran_from": float(ran_from)}


def validation_marks(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``gp`` facts of a gang restart's RUNNING when the nodes it waited for validated
    after their repair (``domain.validation.result_record``: each ``since`` to ``at``): that
    span of the wait just closed was ``validation``, not ``repair`` ({} when none did)."""
    spans = [(float(r["since"]), float(r["at"])) for r in records
             if r.get("since") is not None and r.get("at") is not None and r.get("result") != "off"]
    if not spans:
        return {}
    return {"validated": round(max(a for _, a in spans) - min(s for s, _ in spans), 3)}


def end_marks(ended_at: float | None) -> dict[str, Any]:
    """When the job's training really ended (its last task's own stop time), for its terminal
    transition recorded later (a retried event): its wall time and productive time end there."""
    return {} if ended_at is None else {"ended_at": float(ended_at)}


def suspend_cause(kind: str) -> str:
    """A suspension's cause by its kind (``domain.time_sharing.SuspendKind``): a move off a
    node with a driver warning is the stack's repair; the others are the job's own."""
    return {"preempted": PREEMPTED, "moved": REPAIR}.get(kind, SUSPENDED)


def checkpoint_before(checkpoint: Mapping[str, Any] | None, fault_at: float) -> float | None:
    """The time of the last checkpoint reported at or before the fault (None: none known)."""
    at = (checkpoint or {}).get("at")
    if at is None:
        return None
    return min(float(at), float(fault_at))


@dataclass
class Ledger:
    """Seconds per cause since the job first started; the carry lets folding continue."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    started_at: float | None = None
    ended: bool = False
    faults: int = 0
    lost_work_unknown: int = 0  # faults with no checkpoint reported: their lost work is unknown
    nodes: dict[str, float] = field(default_factory=dict)
    rules: dict[str, float] = field(default_factory=dict)
    # The recovery (or suspension) in progress: {"node", "rule", "own", "cause"}.
    episode: dict[str, Any] = field(default_factory=dict)
    last_state: str = ""
    last_at: float | None = None
    # Training counted before the open RUNNING interval's own entry: its confirmation committed
    # after its ranks ran (``running_at``), so an end that came before that commit takes it back.
    ran_before_confirmed: float = 0.0

    # ------------------------------------------------------------------ figures
    @property
    def wall(self) -> float:
        return sum(self.seconds.values())

    @property
    def own(self) -> float:
        return sum(self.seconds[c] for c in OWN_CAUSES)

    @property
    def ettr(self) -> float | None:
        """productive / (wall - time of the job's own making); None before any such time."""
        base = self.wall - self.own
        return self.seconds[PRODUCTIVE] / base if base > 0 else None

    @property
    def stack_share(self) -> float:
        """The stack's own badput: every stack cause but lost work and the repair floor."""
        return sum(self.seconds[c] for c in STACK_CAUSES if c not in OUTSIDE_STACK_SHARE)

    def to_view(self) -> dict[str, Any]:
        """What the APIs and the CLI show (``lost_work`` is "unknown" when no fault had a
        checkpoint to measure it from)."""
        seconds = {c: round(s, 1) for c, s in self.seconds.items()}
        view: dict[str, Any] = {
            "wall_seconds": round(self.wall, 1), "seconds": seconds,
            "ettr": None if self.ettr is None else round(self.ettr, 4),
            "stack_share_seconds": round(self.stack_share, 1),
            "own_seconds": round(self.own, 1), "faults": self.faults,
            "lost_work_unknown_faults": self.lost_work_unknown,
            "lost_work": ("unknown" if self.lost_work_unknown and not seconds[LOST_WORK]
                          else seconds[LOST_WORK]),
            "top_nodes": _top(self.nodes), "top_rules": _top(self.rules),
        }
        return view

    # ------------------------------------------------------------------ storage
    def to_item(self) -> dict[str, Any]:
        return {"s": {c: round(v, 3) for c, v in self.seconds.items() if v}, "started_at": self.started_at,
                "ended": self.ended, "faults": self.faults, "unknown": self.lost_work_unknown,
                "nodes": _top_map(self.nodes), "rules": _top_map(self.rules), "episode": dict(self.episode),
                "last_state": self.last_state, "last_at": self.last_at,
                **({"ahead": round(self.ran_before_confirmed, 3)} if self.ran_before_confirmed else {})}

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None) -> Ledger:
        item = item or {}
        ledger = cls()
        for cause, value in dict(item.get("s") or {}).items():
            if cause in ledger.seconds:
                ledger.seconds[cause] = float(value)
        ledger.started_at = _float(item.get("started_at"))
        ledger.ended = bool(item.get("ended", False))
        ledger.faults = int(item.get("faults") or 0)
        ledger.lost_work_unknown = int(item.get("unknown") or 0)
        ledger.nodes = {str(k): float(v) for k, v in dict(item.get("nodes") or {}).items()}
        ledger.rules = {str(k): float(v) for k, v in dict(item.get("rules") or {}).items()}
        ledger.episode = dict(item.get("episode") or {})
        ledger.last_state = str(item.get("last_state") or "")
        ledger.last_at = _float(item.get("last_at"))
        ledger.ran_before_confirmed = float(item.get("ahead") or 0.0)
        return ledger

    # ------------------------------------------------------------------ folding
    def add(self, cause: str, seconds: float) -> None:
        if seconds <= 0:
            return
        self.seconds[cause] += seconds
        if cause == PRODUCTIVE or cause in OWN_CAUSES:
            return
        for key, costs in (("node", self.nodes), ("rule", self.rules)):
            name = str(self.episode.get(key) or "")
            if name:
                costs[name] = costs.get(name, 0.0) + seconds

    def close(self, until: float, closing: Mapping[str, Any] | None, ahead: float = 0.0) -> None:
        """Account the open interval (``last_state`` since ``last_at``) up to ``until``;
        ``closing``: the ``gp`` facts of the transition that ends it; ``ahead``: of the time
        before ``last_at``, how much the ranks trained before their confirmation committed."""
        if self.last_at is None or self.started_at is None or self.ended:
            return
        start, end = self.last_at, max(self.last_at, until)
        state, marks = self.last_state, dict(closing or {})
        if state == JobState.RUNNING.value and marks.get("ran_from") is not None:
            ran_from = min(max(float(marks["ran_from"]), start), end)  # ``ran_from_marks``
            self.add(RESTART, ran_from - start)
            start = ran_from
        if state == JobState.RUNNING.value and marks.get("was") in CAUSES and marks.get("until") is not None \
                and not marks.get("fault"):
            # Leaving RUNNING after time of another cause (a preflight that pinned nodes).
            until = min(max(float(marks["until"]), start), end)
            self.add(str(marks["was"]), until - start)
            self.add(PRODUCTIVE, end - until)
            return
        if state == JobState.RUNNING.value and marks.get("fault"):
            self._close_running_on_fault(start, end, marks, ahead)
            return
        cause = self._cause_of(state)
        if marks.get("fault"):  # a fault while starting, suspending, lost or hung: no training to lose
            self._open_fault_episode(marks)
        if state == JobState.STARTING.value and marks.get("running_at") is not None:
            running = min(max(float(marks["running_at"]), start), end)
            self.add(cause, running - start)
            self.add(PRODUCTIVE, end - running)
            self.ran_before_confirmed = end - running
            return
        if state in _STOPPING_STATES and marks.get("stopped_at") is not None:
            stopped = min(max(float(marks["stopped_at"]), start), end)
            self.add(APPLICATION_ERROR if cause == APPLICATION_ERROR else STOPPING, stopped - start)
            start = stopped
        self.add(cause, end - start)

    def _open_fault_episode(self, marks: Mapping[str, Any]) -> None:
        self.episode = {"node": marks.get("node", ""), "rule": marks.get("rule", ""),
                        "own": bool(marks.get("own"))}
        self.faults += 1

    def _close_running_on_fault(self, start: float, end: float, marks: Mapping[str, Any],
                                ahead: float) -> None:
        self._open_fault_episode(marks)
        fault_at = min(max(float(marks.get("fault_at", end)), start), end)
        self.add(APPLICATION_ERROR if self.episode["own"] else DETECTION, end - fault_at)
        checkpoint = marks.get("ckpt_at")
        if checkpoint is None:
            self.lost_work_unknown += 1
            self.add(PRODUCTIVE, fault_at - start)  # unknown: never guessed, shown as such
            return
        # A checkpoint saved before a late confirmation: the work since, counted as training
        # already, is taken back (``redone_from`` before ``start``).
        redone_from = min(max(float(checkpoint), start - ahead), fault_at)
        self.seconds[PRODUCTIVE] += redone_from - start
        self.add(APPLICATION_ERROR if self.episode["own"] else LOST_WORK, fault_at - redone_from)

    def _cause_of(self, state: str) -> str:
        episode = self.episode
        if state in _SUSPEND_STATES:
            return str(episode.get("cause") or SUSPENDED)
        if state in _QUEUE_STATES:
            return str(episode.get("cause") or QUEUED)
        if episode.get("own") and state != JobState.RUNNING.value:
            return APPLICATION_ERROR
        if state == JobState.PENDING_RESTART.value and episode.get("cause"):
            return str(episode["cause"])
        return _STATE_CAUSE.get(state, QUEUED)

    def enter(self, entry: Mapping[str, Any]) -> None:
        """A history entry: close the open interval at its time, then open its state."""
        at = _float(entry.get("at"))
        to = str(entry.get("to") or "")
        if at is None or not to:
            return
        marks = entry.get(GP) if isinstance(entry.get(GP), Mapping) else None
        if marks and marks.get("was") in CAUSES and marks.get("until") is not None \
                and to == self.last_state == JobState.RUNNING.value and self.last_at is not None:
            # A mark within RUNNING (``interval_marks``): the time so far was ``was`` until
            # ``until``; training runs from then (not from when the mark was written).
            until = min(max(float(marks["until"]), self.last_at), at)
            if until > self.last_at:  # a mark at or before the interval's start changes nothing
                if not self.ended and self.started_at is not None:
                    self.add(str(marks["was"]), until - self.last_at)
                self.last_at, self.ran_before_confirmed = until, 0.0
            return
        if marks and marks.get("validated"):
            # The wait just closed held the repaired nodes' validation: repair -> validation.
            moved = min(float(marks["validated"]), self.seconds[REPAIR])
            self.seconds[REPAIR] -= moved
            self.seconds[VALIDATION] += moved
        if to in _WALL_END and marks and marks.get("ended_at") is not None:
            ended_at = float(marks["ended_at"])
            self._ran_ahead_until(ended_at)
            # The job's end as it happened, not as it was recorded (never before the open interval).
            at = max(min(ended_at, at), self.last_at if self.last_at is not None else at)
        elif marks and marks.get("fault") and marks.get("fault_at") is not None:
            self._ran_ahead_until(float(marks["fault_at"]))
        previous = self.last_state
        ahead, self.ran_before_confirmed = self.ran_before_confirmed, 0.0
        self.close(at, marks, ahead)
        if self.started_at is None and to in (JobState.STARTING.value, JobState.RUNNING.value):
            self.started_at = at
        if to in _WALL_END:
            self.ended = True
        self._update_episode(previous, to, marks or {})
        self.last_state, self.last_at = to, at

    def _ran_ahead_until(self, ran_to: float) -> None:
        """Ranks that trained before their confirmation committed ended (or failed) at ``ran_to``,
        before it: the training counted from ``running_at`` stops there, not at the confirmation."""
        if self.last_state == JobState.RUNNING.value and self.last_at is not None and not self.ended \
                and ran_to < self.last_at and self.ran_before_confirmed > 0:
            back = min(self.last_at - ran_to, self.ran_before_confirmed)
            self.seconds[PRODUCTIVE] -= back
            self.last_at -= back
            self.ran_before_confirmed -= back

    def _update_episode(self, previous: str, to: str, marks: Mapping[str, Any]) -> None:
        cause = marks.get("cause")
        if to == JobState.RUNNING.value:
            self.episode = {}
        elif to in _SUSPEND_STATES and previous == JobState.RUNNING.value:
            self.episode = {"cause": cause or SUSPENDED}
        elif to in _QUEUE_STATES and previous == JobState.PENDING_RESTART.value:
            self.episode = {**self.episode, "cause": WAITING_FOR_CAPACITY}  # requeued to move
        elif cause and to == JobState.PENDING_RESTART.value:
            self.episode = {**self.episode, "cause": cause,
                            "own": bool(self.episode.get("own")) or cause == APPLICATION_ERROR}
        elif previous == JobState.RUNNING.value and not marks.get("fault"):
            self.episode = {}


def advance(folded: Mapping[str, Any] | None, entries: Iterable[Mapping[str, Any]]) -> Ledger:
    """The ledger of ``folded`` (the item's ``goodput`` map) followed by ``entries``."""
    ledger = Ledger.from_item(folded)
    for entry in entries:
        if isinstance(entry, Mapping):
            ledger.enter(entry)
    return ledger


def entries_of(item: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The job's history as the ledger reads it. A job registered from its tasks' own events
    (not submitted to the queue) has no entry for its start: it began at ``created_at``, in
    the state its first change left (STARTING when that change was its confirmation)."""
    history = [e for e in item.get("history") or [] if isinstance(e, Mapping)]
    created_at = _float(item.get("created_at"))
    if isinstance(item.get(LEDGER_KEY), Mapping) or created_at is None:
        return history
    if history and str(history[0].get("to")) in _QUEUE_STATES:
        return history  # a queue job: its history starts at its submission
    if history:
        initial = JobState.STARTING.value if history[0].get("from") == JobState.STARTING.value \
            else JobState.RUNNING.value
    else:
        initial = str(item.get("job_state") or JobState.RUNNING.value)
    return [{"at": created_at, "to": initial}, *history]


def ledger_of(item: Mapping[str, Any], now: float) -> Ledger:
    """A job item's ledger up to ``now`` (its folded map, its history, the open interval)."""
    folded = item.get(LEDGER_KEY)
    ledger = advance(folded if isinstance(folded, Mapping) else None, entries_of(item))
    ledger.close(now, None)
    return ledger


def fold_oldest(item: Mapping[str, Any], count: int) -> dict[str, Any]:
    """The item's folded map once its ``count`` oldest history entries are dropped."""
    entries = entries_of(item)
    synthesized = len(entries) - len([e for e in item.get("history") or [] if isinstance(e, Mapping)])
    folded = item.get(LEDGER_KEY)
    return advance(folded if isinstance(folded, Mapping) else None, entries[:count + synthesized]).to_item()


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _top_map(costs: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sorted(costs.items(), key=lambda kv: -kv[1])[:TOP_N]}


def _top(costs: Mapping[str, float]) -> list[dict[str, Any]]:
    ranked = sorted(costs.items(), key=lambda kv: -kv[1])[:TOP_N]
    return [{"name": k, "seconds": round(v, 1)} for k, v in ranked]
