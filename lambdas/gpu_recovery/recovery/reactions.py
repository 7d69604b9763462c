"""Reactions: what one stage lets the others react to, declared in one table.

A stage emits an event when something happened that another stage reacts to; which stage
reacts is declared once, in the composition root's table (``RecoveryService._reactions`` in
``recovery/service.py``). That is how stages built from one another (a cycle of
construction: the gang restart starts ranks through the gang fan-out, which reports back to
it) reach each other with no hook assigned after construction, as in cosmicpython's message
bus (``EVENT_HANDLERS`` and its ``bootstrap``).

Each event says what happened, not who listens. A stage built without the table (a unit
test's) reacts to nothing: :meth:`Reactions.emit` answers None.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.rank_template import RankTemplate
from gpu_recovery.domain.states import RECOVERING_JOB_STATES
from gpu_recovery.domain.validation import Repair
from gpu_recovery.events.ecs import EcsContainerInstanceDetail
from gpu_recovery.repository.cordons import Worklist

logger = logging.getLogger(__name__)

#: a job in recovery's stop, not sent for want of its nodes' reservation, waits this long at most
RESERVE_FIRST_SECONDS = 180
#: ``FaultSeen``'s answer when another invocation's reservation of the job's nodes is still
#: being put (``recovery.placement``): that one sends the job's stop once they are
HOLDS_SYNCING = "holds_syncing"


@dataclass(frozen=True)
class FaultSeen:
    """A job entered recovery (a rank's stop, the heartbeat, the gang preflight, an AWS
    notice): its nodes are reserved for it at once, before its other ranks stop and free
    them (``node``: the failing rank's own, when its stop saw the fault: its end is recorded
    after the reservation, and its registration may have missed the latch). Also when a
    relocation's launch was not sent: its targets, free when chosen, are reserved too.
    ``joining``: another event of a fault whose stop is committed and unsent (a rank exiting on
    its own, a redelivery): the reservation may be being put already."""

    job: Job
    node: str = ""
    joining: bool = False


@dataclass(frozen=True)
class TaskStopped:
    """A task stopped (any task): the node it may have freed."""

    container_instance_arn: str
    job_id: str = ""


@dataclass(frozen=True)
class StoppedEventLost:
    """A rank's task found STOPPED (DescribeTasks) while its stop was asked again: its STOPPED
    event was lost (its retries spent), and is handled as that event. ``rank``: the rank as the
    round read it (the task's, whatever an earlier handling of the round did since: a restart
    it completed registers the rank's next task)."""

    task: dict[str, Any]
    rank: Rank | None = None


@dataclass(frozen=True)
class JobLeftNode:
    """A job moved off a node (its suspension to move ended): the node may be repaired now."""

    node: str


@dataclass(frozen=True)
class HoldsDue:
    """The cordon sweep starts, on its read of the worklist: the spare and reserved holds are
    brought up to date first. Answers what was done (``recovery.cordons.UNCHANGED_HOLDS``).
    ``job_deadlines``: the job table's deadline index as the sweep read it (None: read it)."""

    worklist: Worklist
    job_deadlines: Sequence[Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class ReservationsReleased:
    """A restart placed every rank, or the job ended: the nodes reserved for it go."""

    job_id: str


@dataclass(frozen=True)
class RanksStarted:
    """Every rank of a restarted attempt was started: the restart is confirmed. Answers
    whether it was."""

    job: Job


@dataclass(frozen=True)
class RankNotPlaced:
    """A rank of a start intent could not be placed (ECS refused the StartTask): the rank as it
    was to start (its node: where it was to go)."""

    job: Job
    rank: RankTemplate
    why: str
    error_code: str = ""  # StartTask refused with this API error (a queue launch's only)


@dataclass(frozen=True)
class NodeBack:
    """A repaired node is back (its reboot, its GPU reset, a replacement): it proves itself
    before it is AVAILABLE. Answers the node's outcome."""

    instance: Instance
    repair: Repair
    why: str
    reset_result: dict[str, Any] | None = None


@dataclass(frozen=True)
class AgentChanged:
    """A container-instance state change of a node the stack is not rebooting (``instance``:
    its item, None if unknown): a lost node's ECS agent may be back. Answers its ``Outcome``,
    or None when the event is not a lost node's."""

    instance: Instance | None
    detail: EcsContainerInstanceDetail


@dataclass(frozen=True)
class RestartDue:
    """A job may restart now: its fault is settled by a verdict, or a node it waits for is
    back, or it leaves a node that cannot take it. The gang restart decides (restart,
    relocate, wait, fail); answers its ``Outcome``."""

    job_id: str


@dataclass(frozen=True)
class CoupledToCheck:
    """A fault's checks found nothing: the nodes whose exits were coupled to it are checked
    too (``domain.suspects``): ``nodes``, as the settlement read them from the latch."""

    job: Job
    nodes: frozenset[str]


_E = TypeVar("_E")
Handler = Callable[[Any], Any]


def on(kind: type[_E], handler: Callable[[_E], Any]) -> tuple[type, Handler]:
    """One line of the table: ``handler`` reacts to events of ``kind`` (typed against it)."""
    return kind, handler


@dataclass
class Reactions:
    """The table: each kind of event and the one handler that reacts to it."""

    _table: dict[type, Handler] = field(default_factory=dict)

    def declare(self, lines: Iterable[tuple[type, Handler]]) -> None:
        """The composition root's table, declared once, whole."""
        if self._table:
            raise RuntimeError("the reactions are declared once, by the composition root")
        table = dict(lines)
        self._table = table

    def handles(self, kind: type) -> bool:
        return kind in self._table

    def emit(self, event: object) -> Any:
        """The handler's answer, or None when nothing reacts to the event."""
        handler = self._table.get(type(event))
        return None if handler is None else handler(event)


def stop_may_go(reactions: Reactions, job: Job, now: float) -> bool:
    """The sweep's send of a job's stop intent that no send confirmed: a job in recovery has
    its nodes reserved first (its event's reservation failed, or that event died), for
    RESERVE_FIRST_SECONDS after the intent at most (its ranks do not wait for good)."""
    at = float((job.stop_fanout or {}).get("at") or now)
    return job.state not in RECOVERING_JOB_STATES or now >= at + RESERVE_FIRST_SECONDS \
        or reserved_first(reactions, job)


def reserved_first(reactions: Reactions, job: Job, node: str = "", *, joining: bool = False,
                   sending: bool = False) -> bool:
    """A job in recovery: its nodes (and ``node``, its failing rank's) reserved for it
    (``FaultSeen``, tried twice) before its stop frees them. False when that failed: the
    caller leaves the stop to the sweep, which reserves them first (``GangOps.stop_due``), as a
    node freed unmarked can be taken by another scheduler within seconds (soak seeds 7062 and
    7067 at 6 % of calls failing: the sweep's own refresh failed too). ``sending``: the caller
    is sending the stop already (a rank found by its tags joins it), whoever puts the holds."""
    try:
        # Another invocation's reservation still being put: that one sends the stop.
        return reactions.emit(FaultSeen(job, node, joining)) != HOLDS_SYNCING or sending
    except RateLimited:
        # The ECS budget paced the attributes' puts (a large job's nodes, 10 a call): the
        # holds are committed and the sweep goes on with the puts; the stop is not held for that.
        return True
    except Exception:
        logger.warning("the job's nodes not reserved: its stop waits for the sweep", exc_info=True,
                       extra={"job_id": job.job_id})
        return False
