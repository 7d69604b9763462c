"""The scheduler tick: admit queued jobs onto free GPU nodes and launch them.

One tick (every minute, and right after submit / cancel / job end):

1. **Lease.** Conditional UpdateItem of ``SCHEDULER#LEASE`` in the job table (owner,
   ``expires_at = now + lease_seconds``); a tick that cannot take it returns at once.
   Reserved concurrency 1 on the function is the second fence. The Lambda timeout
   (90 s) is shorter than the lease (120 s), so a tick never outlives its lease. The
   lease is deleted (condition: still ours) at the end.
2. **Time sharing** (:mod:`gpu_recovery.queue.time_sharing`): the sparse holding index
   (queue jobs holding nodes) is read once: quota charges of jobs that stopped holding
   nodes are released, ABOVE_NORMAL jobs that ran long enough drop to NORMAL.
3. A launch a dead tick left half-done is the recovery sweep's: its claim committed the intent
   to start its ranks (``start_fanout``), which the sweep sends again. Its planned nodes stay
   held (no other job is admitted onto them) until it is complete, and a job whose aborted
   launch's ranks are still being stopped (its own attempt's ``stop_fanout``, rounds left:
   ``repository.scheduling.aborted_launch_stopping``) is not admitted again before.
4. **Read the head of the queue** (``by-queue-order`` ascending, pages of
   ``page_size``) and offer each job to :class:`~gpu_recovery.queue.planner.TickPlanner`
   (quota, gang admission, preemption: a blocked job's victims are asked to suspend).
   The node snapshot (ListContainerInstances ACTIVE + DescribeContainerInstances by
   100 + instance-table BatchGet + nodes held for gang restarts and launches in progress) is
   taken only when a job that may start is read; a job in its first back-off after a failed
   launch (or whose aborted launch's ranks are being stopped) reserves the nodes it would
   take (``queue.admission.holds_in_backoff``).
   Hot spares (``spare_nodes``: that many healthy, wholly free nodes) are offered only
   to jobs relocated off a bad node (``queue_order`` with the relocated mark), and, with
   ``lend_spares``, lent to LOW-priority jobs that fit nowhere else (one job per spare;
   the lend is written on the spare's hold before the launch: ``domain.placement``).
   The scan stops as soon as (a) no unreserved node (spares included) has a free GPU, (b)
   ``max_unplaced`` jobs were read that could not be placed (blocked, too large,
   backing off), (c) ``max_admissions`` jobs were admitted, or (d) the time budget is
   spent. Items read <= admitted + max_unplaced + page_size, and admitted <= free
   GPUs: the read cost follows what can be placed now, never the queue's length.
5. **Launch** each admitted job (see :mod:`gpu_recovery.queue.launcher`): its claim (with the
   job's quota charge, one transaction), then the recovery's start fan-out of its ranks.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain import ecs_instance_status as ecs_status
from gpu_recovery.domain.models import Instance, Rank, container_instance_id
from gpu_recovery.domain.placement import SPARE, lend, lent_of, may_borrow_spare, reserved_of, spares_of
from gpu_recovery.domain.relocation import RelocationWait, SpareNode, keep_spares, reserve_for_waits
from gpu_recovery.domain.states import JobState
from gpu_recovery.domain.time_sharing import QuotaBook
from gpu_recovery.queue.admission import Node, holds_in_backoff, node_ineligibility, queued_relocated
from gpu_recovery.queue.launcher import (
    HostAddressPort,
    Launcher,
    LaunchOutcome,
    PlacedNode,
    StartsRanks,
    TaskDefinitionPort,
)
from gpu_recovery.queue.ledger_drain import EndsLaunches, LedgerDrain, StopsOrphans
from gpu_recovery.queue.planner import QueuedJob, Step, StepKind, TickPlanner
from gpu_recovery.queue.time_sharing import SuspendPort, TimeSharing, subject_of
from gpu_recovery.recovery.free_nodes import unhandled_stops
from gpu_recovery.recovery.ports import MetricsPort
from gpu_recovery.recovery.restart_nodes import recovering_nodes
from gpu_recovery.repository import Repository
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.records import job_from_item
from gpu_recovery.repository.scheduling import LEASE_KEY, SchedulingRepository, aborted_launch_stopping
from gpu_recovery.repository.time_sharing import HoldingRepository, QuotaRepository
from gpu_recovery.settings import SchedulerConfig

logger = logging.getLogger(__name__)

__all__ = ["LEASE_KEY", "QueueScheduler", "SchedulerConfig", "build_scheduler"]

PREMARKED = "marked to become a spare when it frees"
# An older release's ledger drain leaves admission this much of the tick's budget: a queue page,
# the cluster's snapshot and one launch's calls (a launch is not cut short).
ADMISSION_MARGIN_SECONDS = 15.0


@dataclass
class TickResult:
    action: str = "ticked"  # ticked | busy
    admitted: list[str] = field(default_factory=list)
    launches: list[dict[str, Any]] = field(default_factory=list)
    # Launches this tick could not complete itself: aborted within the tick (a launch of at
    # most ``gang_inline_max_ranks`` ranks not placed: requeued; a user error: failed) or
    # interrupted (its send failed: the sweep sends it again). A larger launch's abort (the gang
    # worker's) and the sweep's give-up come later: the recovery's ``LaunchesAborted`` counts
    # every abort, wherever it happens.
    launch_failures: int = 0
    queue_items_read: int = 0
    blocked: list[str] = field(default_factory=list)
    quota_waiting: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)  # victims asked to suspend this tick
    quota_released: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)
    nodes_seen: int = 0
    stop_reason: str = ""
    drained: list[dict[str, str]] = field(default_factory=list)  # an older release's launches ended

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ------------------------------------------------------------------------ lease
class Lease:
    """One scheduler at a time: a conditional item with an expiry in the job table (a launch's
    claim holds only while it is its tick's)."""

    def __init__(self, store: SchedulingRepository, owner: str | None = None, seconds: int = 120) -> None:
        self._store = store
        self.owner = owner or uuid.uuid4().hex
        self.seconds = seconds
        self.ledger: dict[str, dict[str, Any]] = {}

    def acquire(self) -> bool:
        """Take (or renew) the lease: False when another tick holds it. ``ledger``: an older
        release's launch ledger found on it (``queue.ledger_drain``)."""
        ledger = self._store.acquire_lease(self.owner, clock.now(), self.seconds)
        self.ledger = ledger or {}
        return ledger is not None

    def release(self) -> None:
        self._store.release_lease(self.owner)


# --------------------------------------------------------------------- snapshot
@dataclass(frozen=True)
class NodeInfo:
    node: Node
    placed: PlacedNode


def gpu_count(resources: list[Mapping[str, Any]] | None) -> int | None:
    for r in resources or []:
        if r.get("name") == "GPU":
            if r.get("type") == "STRINGSET":
                return len(r.get("stringSetValue") or [])
            return int(r.get("integerValue") or 0)
    return None


class ContainerInstancesPort(Protocol):
    """``adapters.ecs.EcsAdapter.container_instances``."""

    def container_instances(self, statuses: Sequence[str | None] = ...) -> list[dict[str, Any]]: ...


class ClusterReader:
    """The snapshot's nodes: ListContainerInstances(ACTIVE) + DescribeContainerInstances in
    batches of 100, through the ECS adapter."""

    def __init__(self, ecs: ContainerInstancesPort) -> None:
        self._ecs = ecs

    def container_instances(self) -> list[dict[str, Any]]:
        return self._ecs.container_instances((ecs_status.ACTIVE,))


# -------------------------------------------------------------------- scheduler
class SchedulerData(Protocol):
    """What a tick reads of the recovery loop's records besides the queue's: the nodes'
    states and holds (cordons, spares, reservations), the ranks a node's GPUs are recorded
    for, an attempt's nodes and its relocations."""

    cordons: CordonRepository
    faults: FaultRepository
    latches: LatchRepository

    @property
    def jobs(self) -> SchedulerJobs: ...
    @property
    def instances(self) -> SchedulerNodes: ...


class SchedulerJobs(Protocol):
    """The ranks a node's GPUs are recorded for."""

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]: ...


class SchedulerNodes(Protocol):
    """The nodes' items, read in batches."""

    def get_instances(self, ids: Iterable[str]) -> dict[str, Instance]: ...


class QueueScheduler:
    def __init__(self, repo: SchedulerData, store: SchedulingRepository, launcher: Launcher,
                 cluster: ClusterReader, lease: Lease, config: SchedulerConfig | None = None,
                 sharing: TimeSharing | None = None, quotas: QuotaRepository | None = None,
                 drain: LedgerDrain | None = None) -> None:
        self.repo = repo
        self.store = store  # the queue's head, a launch's planned nodes
        self.launcher = launcher
        self.cluster = cluster
        self.lease = lease
        self.config = config or SchedulerConfig()
        self.sharing = sharing  # None: no quota table (quotas, preemption and demotion off)
        self.quotas = quotas
        self.drain = drain  # an older release's launches in flight (None: not drained)

    # ------------------------------------------------------------------ tick
    def tick(self, time_budget_seconds: float | None = None) -> TickResult:
        if not self.lease.acquire():
            return TickResult(action="busy")
        started = time.monotonic()
        budget = min(self.config.time_budget_seconds, time_budget_seconds or self.config.time_budget_seconds)

        def time_left() -> float:  # of the tick's budget: a launch stops short of it
            return budget - (time.monotonic() - started)

        try:
            result = TickResult()
            if self.drain is not None and self.lease.ledger:  # only until an upgrade's ledger is drained
                # Admission's share of the budget is kept from the drain (a queue page, the
                # cluster's snapshot, a launch): an entry whose calls hang tick after tick delays
                # the drain, never the queue behind it.
                result.drained = self.drain.run(self.lease.ledger,
                                                lambda: time_left() - ADMISSION_MARGIN_SECONDS)
            if self.sharing is not None:
                done = self.sharing.housekeeping(clock.now())
                result.quota_released, result.demoted = done["released"], done["demoted"]
            self._admit(result, time_left)
            return result
        finally:
            self.lease.release()

    # ----------------------------------------------------------------- admit
    def _admit(self, result: TickResult, time_left: Callable[[], float]) -> None:
        now = clock.now()
        planner: TickPlanner | None = None
        infos: dict[str, NodeInfo] = {}
        unplaced = 0
        holding: list[QueuedJob] = []  # waiting, ahead in the queue: reserved once nodes are read
        for item in self._queue_head():
            result.queue_items_read += 1
            if self.sharing is not None and item.get("quota_charge"):
                self.sharing.release_if_waiting(item)  # its last run's charge, before it is charged again
            queued = _queued(item, self.config.lend_spares)
            # Backing off, or its aborted launch's ranks still being stopped: not admitted yet; in
            # its first back-off it keeps the nodes it would take. An older release's launch of
            # it not drained yet (``queue.ledger_drain``): not admitted, holding nothing.
            own_launch_ends = float(item.get("not_before") or 0) > now or aborted_launch_stopping(item)
            if queued is None or own_launch_ends or item.get("job_id") in self.lease.ledger:
                unplaced += 1
                if queued is not None and own_launch_ends and holds_in_backoff(item):
                    if planner is None:
                        holding.append(queued)
                    else:
                        planner.hold(queued)
            else:
                if planner is None:
                    infos = self.snapshot()
                    result.nodes_seen = len(infos)
                    planner = self._planner(infos)
                    for held in holding:
                        planner.hold(held)
                step = planner.offer(queued)
                if step.kind is StepKind.ADMIT and not self._lend(step, queued, infos):
                    unplaced += 1
                    result.blocked.append(step.job_id)
                elif step.kind is StepKind.ADMIT and self._disagree(step, infos, result):
                    unplaced += 1  # a node whose last stop is not handled yet: next tick
                elif step.kind is StepKind.ADMIT:
                    charge = self.sharing.charge_for(planner.quotas, item) if self.sharing else None
                    outcome = self.launcher.launch(item, [infos[i].placed for i in step.nodes],
                                                   charge=charge)
                    self._record(result, outcome)
                else:
                    unplaced += 1
                    self._not_placed(result, step, item)
            stop = self._should_stop(result, planner, unplaced, time_left)
            if stop:
                result.stop_reason = stop
                return
        result.stop_reason = "queue read to the end"

    def _disagree(self, step: Step, infos: Mapping[str, NodeInfo], result: TickResult) -> bool:
        """An admitted job's nodes: does ECS show one free while a rank the stack records there
        still holds it (its stop not handled yet: the node may just have faulted)? Then the
        job is not launched this tick (``recovery.free_nodes``; one Query per node placed)."""
        nodes = [SpareNode(n, infos[n].placed.container_instance_arn, "", infos[n].node.free_gpus, total)
                 for n in step.nodes if (total := infos[n].node.total_gpus) is not None]
        disagree = unhandled_stops(self.repo.jobs, nodes)
        if disagree:
            result.blocked.append(step.job_id)
        return bool(disagree)

    def _lend(self, step: Step, job: QueuedJob, infos: Mapping[str, NodeInfo]) -> bool:
        """A job admitted onto spares it borrows: the lend is written on each spare's hold
        first (conditional on the holds' revision), so a relocation that needs the node
        knows whose suspension to ask for, and the pool keeps counting it. False: the spare
        stopped being one meanwhile (the job is not launched this tick)."""
        if job.relocated:
            return True
        borrowed = [n for n in step.nodes if infos[n].node.spare]
        if not borrowed:
            return True
        for _ in range(3):
            read = self.repo.cordons.worklist()
            holds = read.holds
            if any((holds.get(n) or {}).get("why") != SPARE for n in borrowed):
                return False
            changes = {n: lend(holds[n], job.job_id) for n in borrowed}
            if self.repo.cordons.set_holds(read, changes, clock.now()):
                logger.info("spares lent", extra={"job_id": job.job_id, "nodes": borrowed})
                return True
        return False

    def _planner(self, infos: Mapping[str, NodeInfo]) -> TickPlanner:
        nodes = {i: n.node for i, n in infos.items()}
        if self.sharing is None:
            return TickPlanner(nodes, QuotaBook())
        quotas = self.quotas
        book = self.sharing.quota_book(quotas.entry if quotas is not None else None)
        return TickPlanner(nodes, book, self.sharing.running_gangs,
                           preemption=self.config.sharing.preemption)

    def _not_placed(self, result: TickResult, step: Step, item: Mapping[str, Any]) -> None:
        if step.kind is StepKind.QUOTA:
            result.quota_waiting.append(step.job_id)
            why = step.reason
        else:
            result.blocked.append(step.job_id)
            why = f"waiting for GPUs: {step.reason}" if step.reason else "waiting for GPUs"
        if step.kind is StepKind.PREEMPT and self.sharing is not None:
            result.preempted.extend(self.sharing.suspend_victims(step, item))
            why = f"waiting for GPUs: {step.reason}"
        elif step.waiting_for:
            why = f"waiting for {', '.join(step.waiting_for)} to suspend"
        last_move = (item.get("moves") or [{}])[-1]
        if why and str(last_move.get("rule") or "").startswith("aws-notice"):
            # Moved off capacity AWS takes (recovery.aws_notices): say which (gpujobs show).
            why = f"{why}; moved off a node AWS takes away: {str(last_move.get('reason') or '')[:200]}"
        if self.sharing is not None and why and item.get("wait_reason") != why:
            self.sharing.holding.record_wait_reason(step.job_id, why)

    def _should_stop(self, result: TickResult, admitter: TickPlanner | None, unplaced: int,
                     time_left: Callable[[], float]) -> str:
        if admitter is not None and admitter.exhausted:
            return "no free GPUs left on unreserved nodes"
        if unplaced >= self.config.max_unplaced:
            return f"{unplaced} jobs could not be placed"
        if len(result.admitted) >= self.config.max_admissions:
            return "admission limit for one tick"
        if time_left() < 0:
            return "time budget spent"
        return ""

    @staticmethod
    def _record(result: TickResult, outcome: LaunchOutcome) -> None:
        result.launches.append(outcome.as_dict())
        if outcome.action == "launched":
            result.admitted.append(outcome.job_id)
        elif outcome.action in ("requeued", "failed", "interrupted"):
            result.launch_failures += 1

    def _queue_head(self) -> Iterator[dict[str, Any]]:
        return self.store.queue_head(self.config.page_size)

    # -------------------------------------------------------------- snapshot
    def snapshot(self) -> dict[str, NodeInfo]:
        described = self.cluster.container_instances()
        ids = [container_instance_id(ci["containerInstanceArn"]) for ci in described]
        states = self.repo.instances.get_instances(ids) if ids else {}
        held, waits = self._held_for_restart()
        whys: dict[str, str] = {}
        for ci, node_id in zip(described, ids, strict=True):
            instance = states.get(node_id)
            whys[node_id] = node_ineligibility(
                ecs_status=str(ci.get("status", "")),
                agent_connected=bool(ci.get("agentConnected", False)),
                instance_state=instance.state if instance else None,
                held_for_recovery=node_id in held,
                cordoned=instance.cordoned if instance else False,
                suspect=instance.fenced if instance else False,
            )
        holds = self.repo.cordons.worklist().holds  # spare and reserved nodes (domain.placement)
        for node_id, job_id in reserved_of(holds).items():
            if node_id in whys and not whys[node_id]:
                whys[node_id] = f"reserved for the recovery of {job_id}"
        for ci, node_id in zip(described, ids, strict=True):
            # A node marked to become a spare while still busy takes no new work (its
            # attribute keeps every other scheduler off too); wholly free, it is a spare.
            if node_id in spares_of(holds) and node_id in whys and not whys[node_id] and node_id not in \
                    lent_of(holds) and (gpu_count(ci.get("remainingResources")) or 0) < \
                    (gpu_count(ci.get("registeredResources")) or 0):
                whys[node_id] = PREMARKED
        if waits:
            # Relocatable jobs waiting for a healthy node to free up take it before any queued job.
            spares = [SpareNode(node_id, ci["containerInstanceArn"], "", free, free)
                      for ci, node_id in zip(described, ids, strict=True)
                      if not whys[node_id] and (free := gpu_count(ci.get("remainingResources")) or 0)]
            for node_id, job_id in reserve_for_waits(waits, spares).items():
                whys[node_id] = f"reserved for the relocation of {job_id}"
        lent = set(lent_of(holds))
        marked = spares_of(holds)
        hot_spares = self._keep_spares(described, ids, whys, spares_of(holds), lent)
        infos: dict[str, NodeInfo] = {}
        for ci, node_id in zip(described, ids, strict=True):
            why = whys[node_id]
            free = gpu_count(ci.get("remainingResources")) or 0
            total = gpu_count(ci.get("registeredResources"))
            attributes = {a["name"]: str(a.get("value", "")) for a in ci.get("attributes") or []
                          if "name" in a}
            infos[node_id] = NodeInfo(
                Node(node_id, free, total, eligible=not why, why_ineligible=why, spare=node_id in hot_spares,
                     lendable=node_id in hot_spares and node_id in marked),
                PlacedNode(ci["containerInstanceArn"], str(ci.get("ec2InstanceId", "")), attributes),
            )
        return infos

    def _keep_spares(self, described: Sequence[Mapping[str, Any]], ids: Sequence[str],
                     whys: Mapping[str, str], marked: frozenset[str] | set[str] = frozenset(),
                     lent: frozenset[str] | set[str] = frozenset()) -> set[str]:
        """Hot spares (``spare_nodes``): that many healthy, wholly free GPU nodes take no
        new queue work, only jobs relocated off a bad node (back in the queue); a
        tag-registered job's relocation (``gang_restart``) takes free nodes, spares
        included. Counted on the cluster's GPU nodes; a healed node rejoins the pool as
        soon as it is healthy and free. The nodes marked spare for every scheduler
        (``marked``: ``gpu-recovery.unavailable=spare``) are the pool first, so the queue
        keeps off the same nodes as the others; a marked spare lent to a LOW queue job
        (``lent``) stays in the pool while in use, so lending never refills it."""
        size = self.config.spares.size(
            sum(1 for ci in described if (gpu_count(ci.get("registeredResources")) or 0) > 0))
        if size <= 0:
            return set()
        candidates = [SpareNode(node_id, ci["containerInstanceArn"], "",
                                gpu_count(ci.get("remainingResources")) or 0,
                                gpu_count(ci.get("registeredResources")) or 0)
                      for ci, node_id in zip(described, ids, strict=True) if not whys[node_id]]
        whole = {c.node_id for c in candidates if c.total_gpus > 0 and c.free_gpus >= c.total_gpus}
        usable = {c.node_id for c in candidates}
        premarked = {n for n in marked if whys.get(n) == PREMARKED}  # busy, spares once free
        kept = sorted(marked & (whole | (set(lent) & usable) | premarked))[:size]
        return (set(kept) - premarked) | keep_spares(size - len(kept),
                                                     [c for c in candidates if c.node_id not in kept])

    def _held_for_restart(self) -> tuple[set[str], list[RelocationWait]]:
        """Nodes of jobs in recovery (PENDING_HEALTHCHECK, PENDING_RESTART, HELD) and of gang
        restarts not placed yet (STARTING: a relocation's targets among them): the restart
        needs them, so no queued job may take their freed GPUs; the nodes of launches in
        progress; and the waits of relocatable jobs with no healthy free node (the nodes that
        free up are theirs).

        Those jobs carry a deadline, so the sparse deadline index lists them; the
        number read is the number of jobs in recovery, not the table size.
        """
        held: set[str] = set()
        waits: list[RelocationWait] = []
        deadline_items = self.store.deadline_job_items()
        launches = self.store.launches_in_progress(deadline_items)
        for item in launches:
            # A launch in progress (its ranks being started, or its intent left unsent by a dead
            # tick): its planned nodes are its own, no other job may take their GPUs meanwhile.
            plan = item.get("launch") or {}
            nodes, _ = self.store.plan_nodes(str(item["job_id"]), int(item.get("attempt") or 0),
                                             int(plan.get("world_size") or item.get("world_size") or 1))
            held |= {container_instance_id(str(arn)) for arn in nodes if arn}
        launching = {str(item["job_id"]) for item in launches}
        for item in self.store.jobs_holding_nodes(deadline_items):
            if str(item["job_id"]) in launching:
                continue
            job = job_from_item(item)
            if job.relocation_wait is not None and job.state is JobState.PENDING_RESTART:
                waits.append(job.relocation_wait)
            # Its nodes (latch shards: one item per 64 ranks) and a relocation's targets, until
            # its restart has placed every rank: a relocation's claim whose reservation of its
            # targets failed after it keeps them all the same (soak seed 7251 at 10 %).
            held |= recovering_nodes(self.repo.latches, self.repo.faults, job)
        held.discard("")
        return held, waits


def _queued(item: Mapping[str, Any], lend_spares: bool = False) -> QueuedJob | None:
    try:
        priority = int(item.get("priority") or 0)
        relocated = queued_relocated(item)
        return QueuedJob(
            job_id=str(item["job_id"]),
            user=subject_of(item),
            priority=priority,
            nnodes=int(item.get("world_size") or 1),
            gpus_per_node=int(item.get("gpus_per_node") or 0),
            relocated=relocated,
            borrows_spares=may_borrow_spare(lending=lend_spares, queue_job=True, priority=priority,
                                            relocated=relocated),
        )
    except (KeyError, TypeError, ValueError):
        logger.warning("malformed queue item skipped", extra={"job_id": item.get("job_id")})
        return None


# ------------------------------------------------------------------- wiring
class SchedulerEcs(ContainerInstancesPort, StopsOrphans, Protocol):
    """The ECS adapter a tick reads the cluster's nodes through (and stops an older release's
    launch's orphans with, ``queue.ledger_drain``)."""


class RecoveryLoop(StartsRanks, SuspendPort, Protocol):
    """What the queue asks of the recovery loop: a launch's ranks started, a job suspended, an
    older release's launch ended (``launches``)."""

    @property
    def launches(self) -> EndsLaunches: ...
    @property
    def metrics_relay(self) -> MetricsPort: ...


def build_scheduler(*, repo: Repository, ecs_adapter: SchedulerEcs, recovery: RecoveryLoop,
                    task_definitions: TaskDefinitionPort | None = None, hosts: HostAddressPort | None = None,
                    config: SchedulerConfig | None = None, owner: str | None = None,
                    quotas: QuotaRepository | None = None, dynamodb: Any | None = None,
                    ecs_client: Any | None = None, ec2_client: Any | None = None,
                    ssm_client: Any | None = None, cluster: str = "") -> QueueScheduler:
    """The tick over the adapters ``runtime.queue_scheduler`` builds: ``ecs_adapter`` (an
    ``EcsAdapter``: the node snapshot; the ranks start through ``recovery``), ``task_definitions``
    and ``hosts``. ``quotas`` (the quota table's repository) enables time sharing.

    Raw boto3 arguments remain for callers not migrated yet (the scheduler benchmark):
    ``ecs_client``/``ec2_client``/``ssm_client`` are wrapped in the adapters runtime.py
    would build, ``dynamodb`` (the resource) in a ``QuotaRepository`` on
    ``config.sharing.quota_table``; ``cluster`` is ignored (the ECS adapter's is used)."""
    config = config or SchedulerConfig()
    if task_definitions is None or hosts is None:
        task_definitions, hosts = _wrap_raw_clients(task_definitions, hosts, ecs_client, ec2_client,
                                                    ssm_client)
    if quotas is None and dynamodb is not None:
        quotas = QuotaRepository(dynamodb, config.sharing.quota_table)
    holding = HoldingRepository(repo.jobs, quotas) if quotas is not None else None
    store = SchedulingRepository(repo.jobs, holding)
    lease = Lease(store, owner, config.lease_seconds)
    launcher = Launcher(recovery, task_definitions, hosts, store, lease.owner, sharing=config.sharing)
    sharing = TimeSharing(repo.latches, holding, recovery, config.sharing) if holding is not None else None
    # The relay, not the metrics it points at now: each invocation points it at its own.
    drain = LedgerDrain(store, repo.jobs, ecs_adapter, recovery.launches, recovery.metrics_relay)
    return QueueScheduler(repo, store, launcher, ClusterReader(ecs_adapter), lease, config, sharing, quotas,
                          drain)


def _wrap_raw_clients(task_definitions: TaskDefinitionPort | None, hosts: HostAddressPort | None,
                      ecs_client: Any | None, ec2_client: Any | None,
                      ssm_client: Any | None) -> tuple[TaskDefinitionPort, HostAddressPort]:
    from gpu_recovery.adapters.hosts import HostAddresses
    from gpu_recovery.adapters.task_definitions import TaskDefinitions

    if task_definitions is None:
        if ecs_client is None:
            raise TypeError("build_scheduler needs task_definitions= (or ecs_client=)")
        task_definitions = TaskDefinitions(ecs_client)
    if hosts is None:
        if ec2_client is None:
            raise TypeError("build_scheduler needs hosts= (or ec2_client=)")
        hosts = HostAddresses(ec2_client, ssm_client)
    return task_definitions, hosts
