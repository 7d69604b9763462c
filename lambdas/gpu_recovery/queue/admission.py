"""Gang admission for the job queue: which waiting jobs start now, and on which nodes.

Pure: no boto3, no clock. The scheduler tick feeds it a node snapshot and the head
of the queue in queue order (priority high -> low, then first come first served).

Admission rules
===============

* **Per-node gang, all or nothing.** A job of ``nnodes`` x ``gpus_per_node`` is
  admitted only when ``nnodes`` *distinct* eligible nodes each have at least
  ``gpus_per_node`` free GPUs (ECS ``remainingResources`` GPU count minus the GPUs
  this tick already gave to earlier admissions). The cluster-wide total of free GPUs
  is never enough on its own: 16 free GPUs spread 4+4+4+4 do not admit a 2x8 job.
* **One rank per node.** Rank ``i`` gets its own node; two ranks of one job never
  share a node (extension point: pack ``k`` ranks per node when ``gpus_per_node`` is
  a fraction of the node). Different jobs may share a node when GPUs are left.
* **Eligible nodes only.** A node is skipped when its ECS status is not ``ACTIVE``
  (e.g. ``DRAINING``), its agent is disconnected, or the instance table says
  ``REBOOTING``, ``QUARANTINED``, ``SUSPECT``, ``HEALTH_CHECK_PENDING`` or
  ``HEALTH_CHECKING``, or the recovery loop holds it for a job waiting to be
  gang-restarted on it, or it is cordoned (known bad, whatever its state says).
* **Deterministic best fit.** Among the nodes that fit, a rank takes the node with
  the fewest free GPUs that still fit, ties broken by container instance id; rank 0
  gets the first node of that order. Same input -> same placement.

Head-of-line rule (conservative reservation)
=============================================

A job that does not fit is *blocked*; it keeps its place. Before the next job in
queue order is considered, the blocked job **reserves** nodes for itself: among the
eligible, not yet reserved nodes that could hold one of its ranks once empty
(registered GPUs >= ``gpus_per_node``), the ``nnodes`` with the most free GPUs
(ties by id). Reserved nodes are invisible to every later job in the same tick, so a
later job (by construction of the same or lower priority) starts only on nodes the
blocked jobs ahead of it are not waiting for. Every blocked job reserves in turn
(conservative backfill), so no queued job is overtaken on the nodes it needs.

Consequences, by design:

* a later, smaller job may start on nodes that are too small for the blocked job, or
  on nodes beyond the ``nnodes`` it reserved (backfill that cannot take its nodes);
* a blocked job whose size exceeds what the cluster can ever offer (fewer than
  ``nnodes`` eligible nodes with enough *registered* GPUs) reserves nothing: it waits
  without stalling the queue behind it;
* a job backing off after its first failed launch in a row, or whose aborted launch's
  ranks are still being stopped (:func:`holds_in_backoff`), reserves the nodes it would
  take (or wait for) the same way, neither starting nor preempting: the nodes it freed by
  preemption do not go back to its victim for the minute, to be preempted again. A job
  whose launches keep failing reserves nothing while it backs off (it does not stall the
  queue behind it);
* without run-time estimates no scheduler can promise "zero delay"; the reservation
  is recomputed every tick from the fresh snapshot, and because it prefers the
  nodes with the most free GPUs, a node that frees up is reserved at once.

The scan stops (``exhausted``) as soon as no unreserved eligible node has a free
GPU: nothing after that point can be placed, so the scheduler stops reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gpu_recovery.constants import QUEUE_SK, RELOCATED_QUEUE_MARK, InstanceState
from gpu_recovery.domain import ecs_instance_status

# Instance-table states in which the node must not receive new work.
INELIGIBLE_INSTANCE_STATES = frozenset(
    {
        InstanceState.REBOOTING,
        InstanceState.QUARANTINED,
        InstanceState.SUSPECT,
        InstanceState.HEALTH_CHECK_PENDING,
        InstanceState.HEALTH_CHECKING,
    }
)


def node_ineligibility(
    *,
    ecs_status: str,
    agent_connected: bool,
    instance_state: InstanceState | str | None,
    held_for_recovery: bool = False,
    cordoned: bool = False,
    suspect: bool = False,
) -> str:
    """Why a node cannot take new ranks ("" when it can). A cordoned node (known bad:
    a failed diag, a definitive fault, a timed-out reboot or health check) is skipped
    whatever its state says (observe mode, or the breaker, may have left it AVAILABLE)."""
    if cordoned:
        return "cordoned (known bad)"
    if suspect:
        return "suspect: a rank stopped there with fault evidence, not judged yet"
    if ecs_status != ecs_instance_status.ACTIVE:
        return f"ecs status {ecs_status or 'unknown'}"
    if not agent_connected:
        return "agent disconnected"
    if instance_state is not None:
        state = InstanceState(instance_state)
        if state in INELIGIBLE_INSTANCE_STATES:
            return f"instance {state.value}"
    if held_for_recovery:
        return "held for a gang restart"
    return ""


@dataclass(frozen=True)
class Node:
    """One container instance in the snapshot."""

    node_id: str  # container instance id
    free_gpus: int  # ECS remainingResources GPU count
    total_gpus: int | None = None  # ECS registeredResources GPU count (None: = free)
    eligible: bool = True
    why_ineligible: str = ""
    spare: bool = False  # a hot spare (``spare_nodes``): only relocated jobs may take it
    # A spare marked for every scheduler: a LOW job may borrow it while wholly free (a lend
    # of a job gone is replaced by the next).
    lendable: bool = False

    @property
    def capacity(self) -> int:
        return self.free_gpus if self.total_gpus is None else max(self.total_gpus, self.free_gpus)


@dataclass(frozen=True)
class Candidate:
    """A waiting job as admission sees it."""

    job_id: str
    nnodes: int
    gpus_per_node: int
    priority: int = 0
    relocated: bool = False  # a job relocated off a bad node: the spares are its too
    # A LOW queue job a spare may be lent to (``domain.placement.may_borrow_spare``): it
    # takes a spare only when no other node fits it, and the whole spare.
    borrows_spares: bool = False


class Verdict(str, Enum):
    ADMITTED = "ADMITTED"
    BLOCKED = "BLOCKED"  # does not fit now; reserved nodes for itself
    TOO_LARGE = "TOO_LARGE"  # cannot fit on the eligible cluster even when empty


@dataclass(frozen=True)
class Decision:
    job_id: str
    verdict: Verdict
    nodes: tuple[str, ...] = ()  # ADMITTED: node per rank; BLOCKED: nodes reserved
    reason: str = ""


@dataclass
class Admitter:
    """Incremental admission over one tick: offer jobs in queue order."""

    nodes: Mapping[str, Node]
    free: dict[str, int] = field(init=False)
    reserved: set[str] = field(init=False, default_factory=set)
    decisions: list[Decision] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.free = {n.node_id: max(0, n.free_gpus) for n in self.nodes.values() if n.eligible}
        self.spares = frozenset(n.node_id for n in self.nodes.values() if n.eligible and n.spare)

    def _pool(self, relocated: bool = True, borrows: bool = False) -> list[str]:
        return [i for i in self.free if i not in self.reserved and (relocated or i not in self.spares
                                                                    or (borrows and self._lendable(i)))]

    def _lendable(self, node_id: str) -> bool:
        """A spare is lent wholly free, to one job."""
        node = self.nodes[node_id]
        return node.lendable and node.total_gpus is not None and self.free[node_id] >= node.total_gpus > 0

    @property
    def exhausted(self) -> bool:
        """No unreserved eligible node (hot spares included: a relocated job further down
        the queue may take one) has a free GPU: nothing more can be placed."""
        return not any(self.free[i] > 0 for i in self._pool())

    def offer(self, job: Candidate) -> Decision:
        decision = self._decide(job)
        self.decisions.append(decision)
        return decision

    def hold(self, job: Candidate) -> tuple[str, ...]:
        """A job that may not start now keeps its place (:func:`holds_in_backoff`): the nodes it
        would take, or wait for, are reserved; none of their GPUs is taken."""
        free = dict(self.free)
        decision = self._decide(job)
        self.free = free
        self.reserved.update(decision.nodes)
        return decision.nodes

    def _decide(self, job: Candidate) -> Decision:
        need, count = max(0, job.gpus_per_node), max(1, job.nnodes)
        pool = self._pool(job.relocated, job.borrows_spares)
        # Best fit; a relocated job takes other free nodes before the spares.
        fitting = sorted((i for i in pool if self.free[i] >= need),
                         key=lambda i: (i in self.spares, self.free[i], i))
        if len(fitting) >= count:
            chosen = tuple(fitting[:count])
            for node_id in chosen:
                lent = not job.relocated and node_id in self.spares
                self.free[node_id] = 0 if lent else self.free[node_id] - need
            return Decision(job.job_id, Verdict.ADMITTED, chosen)
        # A borrower blocked reserves no spare (nothing to preempt there for it).
        pool = self._pool(job.relocated)
        capable = [i for i in pool if self.nodes[i].capacity >= need]
        if len(capable) < count:
            return Decision(
                job.job_id, Verdict.TOO_LARGE,
                reason=f"needs {count} node(s) with {need} GPUs; {len(capable)} eligible "
                       "unreserved node(s) are that large",
            )
        chosen = tuple(sorted(capable, key=lambda i: (-self.free[i], i))[:count])
        self.reserved.update(chosen)
        return Decision(
            job.job_id, Verdict.BLOCKED, chosen,
            reason=f"needs {count} node(s) with {need} free GPUs; {len(fitting)} fit now",
        )


def admit(candidates: Iterable[Candidate], nodes: Iterable[Node]) -> list[Decision]:
    """Decide a whole tick at once (the scheduler uses :class:`Admitter` incrementally)."""
    admitter = Admitter({n.node_id: n for n in nodes})
    for job in candidates:
        if admitter.exhausted:
            break
        admitter.offer(job)
    return admitter.decisions


# ------------------------------------------------------------------ failure kinds
class FailureKind(str, Enum):
    """Why an attempt ended (recorded per attempt; seed: failure_kind)."""

    INSUFFICIENT_RESOURCES = "INSUFFICIENT_RESOURCES"  # retried silently after a backoff
    USER_ERROR = "USER_ERROR"  # task definition / image / overrides: never retried
    GPU_FAULT = "GPU_FAULT"  # recovery loop: DCGM verdict / suspect exit code
    NODE_LOST = "NODE_LOST"  # recovery loop: heartbeats stopped / node gone
    RUNTIME_ERROR = "RUNTIME_ERROR"  # the application failed (non-zero exit)
    UNKNOWN = "UNKNOWN"


# ECS StartTask ``failures[].reason`` values meaning "the node could not take it now".
_RESOURCE_REASON_PREFIXES = ("RESOURCE:", "AGENT", "MISSING", "INACTIVE", "DRAINING", "CAPACITY")
_USER_ERROR_MARKERS = (
    "task definition", "taskdefinition", "task-definition", "is inactive", "cannotpullcontainer",
    "pull image", "pullimage", "image manifest", "repository does not exist", "container name",
    "containeroverride", "invalid override", "not authorized to perform: iam:passrole",
    "cannotstartcontainererror", "cannotcreatecontainererror", "resourceinitializationerror",
)
_TRANSIENT_CODES = frozenset(
    {"ThrottlingException", "Throttling", "ServerException", "ServiceUnavailableException",
     "InternalFailure", "InternalError", "RequestLimitExceeded", "ServiceUnavailable",
     "TooManyRequestsException"}
)


def queued_relocated(item: Mapping[str, Any]) -> bool:
    """The job item is queued ahead of its priority: relocated off faulty nodes
    (``constants.relocated_queue_order``)."""
    return f"#{RELOCATED_QUEUE_MARK}" in str(item.get(QUEUE_SK) or "")


def holds_in_backoff(item: Mapping[str, Any]) -> bool:
    """A queued job in a back-off keeps its nodes reserved through its first back-off in a row
    only (``resource_failures``: its consecutive failed launches; unreadable: holds nothing)."""
    try:
        return int(item.get("resource_failures") or 0) <= 1
    except (TypeError, ValueError):
        return False


def backoff_seconds(consecutive_resource_failures: int, base: int = 60, cap: int = 600) -> int:
    """60 s, 120 s, 240 s, 480 s, then 600 s (by consecutive INSUFFICIENT_RESOURCES)."""
    n = max(1, consecutive_resource_failures)
    return min(cap, base * 2 ** min(n - 1, 16))


def classify_failure(
    *,
    placement_reasons: Iterable[str] = (),
    error_code: str = "",
    error_message: str = "",
    exit_code: int | None = None,
    stop_code: str = "",
    stopped_reason: str = "",
    gpu_fault: bool = False,
    node_lost: bool = False,
) -> FailureKind:
    """Classify why a start (scheduler) or an attempt (recovery loop) failed.

    * ``placement_reasons``: StartTask ``failures[].reason``. ``RESOURCE:*`` (GPU, CPU,
      MEMORY, PORTS, ENI), ``AGENT``, ``MISSING``/``INACTIVE``/``DRAINING`` mean the
      node could not take the task *now*: INSUFFICIENT_RESOURCES (the GPUs were taken
      between snapshot and start, or the node went away). ``ATTRIBUTE`` means the
      task definition requires something the node does not offer: USER_ERROR.
    * ``error_code``/``error_message``: an API error (ClientException /
      InvalidParameterException about the task definition, container name or
      overrides: USER_ERROR; throttling / 5xx: UNKNOWN, the caller retries).
    * ``stop_code``/``stopped_reason``/``exit_code``: a stopped task (recovery loop).
      Image pull and container-creation errors: USER_ERROR; ``gpu_fault`` (suspect
      exit code or a DCGM verdict): GPU_FAULT; ``node_lost`` (heartbeats, instance
      gone): NODE_LOST; any other non-zero exit: RUNTIME_ERROR.

    Only INSUFFICIENT_RESOURCES is ever retried silently (seed rule).
    """
    reasons = [str(r or "") for r in placement_reasons]
    if reasons:
        if any(r.upper().startswith("ATTRIBUTE") for r in reasons):
            return FailureKind.USER_ERROR
        if all(r.upper().startswith(_RESOURCE_REASON_PREFIXES) for r in reasons):
            return FailureKind.INSUFFICIENT_RESOURCES
    if gpu_fault:
        return FailureKind.GPU_FAULT
    if node_lost:
        return FailureKind.NODE_LOST
    text = f"{error_message} {stopped_reason}".lower()
    if error_code:
        if error_code in _TRANSIENT_CODES:
            return FailureKind.UNKNOWN
        if "container instance" in text and ("not found" in text or "inactive" in text
                                             or "draining" in text):
            return FailureKind.INSUFFICIENT_RESOURCES  # the node went away after the snapshot
        if error_code in ("ClientException", "InvalidParameterException", "AccessDeniedException") and (
            any(m in text for m in _USER_ERROR_MARKERS) or error_code == "InvalidParameterException"
        ):
            return FailureKind.USER_ERROR
        if error_code == "ClientException":
            return FailureKind.USER_ERROR
        return FailureKind.UNKNOWN
    if stop_code == "TaskFailedToStart" or any(m in text for m in _USER_ERROR_MARKERS):
        return FailureKind.USER_ERROR
    if reasons:
        return FailureKind.UNKNOWN
    if exit_code is not None and exit_code != 0:
        return FailureKind.RUNTIME_ERROR
    return FailureKind.UNKNOWN
