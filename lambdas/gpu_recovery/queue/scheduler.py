"""The scheduler tick: admit queued jobs onto free GPU nodes and launch them.

One tick (every minute, and right after submit / cancel / job end):

1. **Lease.** Conditional PutItem of ``SCHEDULER#LEASE`` in the job table (owner,
   ``expires_at = now + lease_seconds``); a tick that cannot take it returns at once.
   Reserved concurrency 1 on the function is the second fence. The Lambda timeout
   (90 s) is shorter than the lease (120 s), so a tick never outlives its lease. The
   lease is deleted (condition: still ours) at the end.
2. **Resume** launches a dead tick left half-done: the launch ledger on the lease
   item lists every claimed-but-unfinished launch (one GetItem); entries older than
   ``stale_launch_seconds`` are resumed, ranks looked up by ``startedBy`` before
   anything is started again. Queue jobs whose *gang restart* (recovery loop) was
   left half-done are found in the sparse ``by-state`` index (STARTING; only queue
   jobs carry its sort key) and resumed with the recovery loop's own launcher.
3. **Read the head of the queue** (``by-queue-order`` ascending, pages of
   ``page_size``) and feed each job to :class:`~gpu_recovery.queue.admission.Admitter`.
   The node snapshot (ListContainerInstances ACTIVE + DescribeContainerInstances by
   100 + instance-table BatchGet + nodes held for gang restarts) is taken only when
   the first page holds a job that is not backing off.
   The scan stops as soon as (a) no unreserved node has a free GPU, (b)
   ``max_unplaced`` jobs were read that could not be placed (blocked, too large,
   backing off), (c) ``max_admissions`` jobs were admitted, or (d) the time budget is
   spent. Items read <= admitted + max_unplaced + page_size, and admitted <= free
   GPUs: the read cost follows what can be placed now, never the queue's length.
4. **Launch** each admitted job (see :mod:`gpu_recovery.queue.launcher`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import clock
from gpu_recovery.domain.models import container_instance_id
from gpu_recovery.queue.admission import (
    Admitter,
    Candidate,
    Node,
    Verdict,
    node_ineligibility,
)
from gpu_recovery.queue.launcher import (
    HostAddresses,
    Launcher,
    LaunchOutcome,
    PlacedNode,
    TaskDefinitions,
)
from gpu_recovery.repository import Repository
from gpu_recovery.repository.scheduling import LEASE_KEY, SchedulingRepository
from gpu_recovery.settings import SchedulerConfig

logger = logging.getLogger(__name__)

__all__ = ["LEASE_KEY", "QueueScheduler", "SchedulerConfig", "build_scheduler"]
_DESCRIBE_BATCH = 100


@dataclass
class TickResult:
    action: str = "ticked"  # ticked | busy
    admitted: list[str] = field(default_factory=list)
    launches: list[dict[str, Any]] = field(default_factory=list)
    launch_failures: int = 0
    queue_items_read: int = 0
    blocked: list[str] = field(default_factory=list)
    resumed: list[dict[str, Any]] = field(default_factory=list)
    nodes_seen: int = 0
    stop_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ------------------------------------------------------------------------ lease
class Lease:
    """One scheduler at a time: a conditional item with an expiry in the job table.

    The same item carries the launch ledger (``inflight``); taking the lease never
    erases it.
    """

    def __init__(self, store: SchedulingRepository, owner: str | None = None, seconds: int = 120) -> None:
        self._store = store
        self.owner = owner or uuid.uuid4().hex
        self.seconds = seconds

    def acquire(self) -> bool:
        return self._store.acquire_lease(self.owner, clock.now(), self.seconds)

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


class ClusterReader:
    """ListContainerInstances(ACTIVE) + DescribeContainerInstances in batches of 100."""

    def __init__(self, ecs_client: Any, cluster: str) -> None:
        self._ecs = ecs_client
        self.cluster = cluster

    def container_instances(self) -> list[dict[str, Any]]:
        arns: list[str] = []
        paginator = self._ecs.get_paginator("list_container_instances")
        for page in paginator.paginate(cluster=self.cluster, status="ACTIVE",
                                       PaginationConfig={"PageSize": 100}):
            arns.extend(page.get("containerInstanceArns", []))
        described: list[dict[str, Any]] = []
        for start in range(0, len(arns), _DESCRIBE_BATCH):
            response = self._ecs.describe_container_instances(
                cluster=self.cluster, containerInstances=arns[start:start + _DESCRIBE_BATCH])
            described.extend(response.get("containerInstances", []))
        return described


# -------------------------------------------------------------------- scheduler
class QueueScheduler:
    def __init__(self, repo: Repository, launcher: Launcher, cluster: ClusterReader, lease: Lease,
                 config: SchedulerConfig | None = None) -> None:
        self.repo = repo
        self.launcher = launcher
        self.cluster = cluster
        self.lease = lease
        self.config = config or SchedulerConfig()

    # ------------------------------------------------------------------ tick
    def tick(self, time_budget_seconds: float | None = None) -> TickResult:
        if not self.lease.acquire():
            return TickResult(action="busy")
        started = time.monotonic()
        budget = min(self.config.time_budget_seconds, time_budget_seconds or self.config.time_budget_seconds)
        try:
            result = TickResult()
            self._resume_stuck(result)
            self._admit(result, lambda: time.monotonic() - started > budget)
            return result
        finally:
            self.lease.release()

    # ---------------------------------------------------------------- resume
    def _resume_stuck(self, result: TickResult) -> None:
        now = clock.now()
        stale = self.config.stale_launch_seconds
        for job_id, entry in sorted(self.launcher.store.ledger_entries().items()):
            if now - float(entry.get("claimed_at") or 0) < stale:
                continue
            outcome = self.launcher.resume(job_id, entry)
            result.resumed.append(outcome.as_dict())
            if outcome.action in ("requeued", "failed"):
                result.launch_failures += 1
        # Gang restarts of queue jobs by the recovery loop are resumed by its sweep.

    # ----------------------------------------------------------------- admit
    def _admit(self, result: TickResult, out_of_time: Any) -> None:
        now = clock.now()
        admitter: Admitter | None = None
        infos: dict[str, NodeInfo] = {}
        unplaced = 0
        for item in self._queue_head():
            result.queue_items_read += 1
            if float(item.get("not_before") or 0) > now:
                unplaced += 1
            else:
                if admitter is None:
                    infos = self.snapshot()
                    result.nodes_seen = len(infos)
                    admitter = Admitter({i: n.node for i, n in infos.items()})
                candidate = _candidate(item)
                if candidate is None:
                    unplaced += 1
                else:
                    decision = admitter.offer(candidate)
                    if decision.verdict is Verdict.ADMITTED:
                        outcome = self.launcher.launch(item, [infos[i].placed for i in decision.nodes])
                        self._record(result, outcome)
                    else:
                        unplaced += 1
                        result.blocked.append(candidate.job_id)
            stop = self._should_stop(result, admitter, unplaced, out_of_time)
            if stop:
                result.stop_reason = stop
                return
        result.stop_reason = "queue read to the end"

    def _should_stop(self, result: TickResult, admitter: Admitter | None, unplaced: int,
                     out_of_time: Any) -> str:
        if admitter is not None and admitter.exhausted:
            return "no free GPUs left on unreserved nodes"
        if unplaced >= self.config.max_unplaced:
            return f"{unplaced} jobs could not be placed"
        if len(result.admitted) >= self.config.max_admissions:
            return "admission limit for one tick"
        if out_of_time():
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
        return self.launcher.store.queue_head(self.config.page_size)

    # -------------------------------------------------------------- snapshot
    def snapshot(self) -> dict[str, NodeInfo]:
        described = self.cluster.container_instances()
        ids = [container_instance_id(ci["containerInstanceArn"]) for ci in described]
        states = self.repo.get_instances(ids) if ids else {}
        held = self._held_for_restart()
        infos: dict[str, NodeInfo] = {}
        for ci, node_id in zip(described, ids, strict=True):
            instance = states.get(node_id)
            why = node_ineligibility(
                ecs_status=str(ci.get("status", "")),
                agent_connected=bool(ci.get("agentConnected", False)),
                instance_state=instance.state if instance else None,
                held_for_recovery=node_id in held,
            )
            free = gpu_count(ci.get("remainingResources")) or 0
            total = gpu_count(ci.get("registeredResources"))
            attributes = {a["name"]: str(a.get("value", "")) for a in ci.get("attributes") or []
                          if "name" in a}
            infos[node_id] = NodeInfo(
                Node(node_id, free, total, eligible=not why, why_ineligible=why),
                PlacedNode(ci["containerInstanceArn"], str(ci.get("ec2InstanceId", "")), attributes),
            )
        return infos

    def _held_for_restart(self) -> set[str]:
        """Nodes of jobs in recovery (PENDING_HEALTHCHECK, PENDING_RESTART): their gang
        restart needs them back, so no queued job may take their freed GPUs.

        Those jobs carry a deadline, so the sparse deadline index lists them; the
        number read is the number of jobs in recovery, not the table size.
        """
        held: set[str] = set()
        for item in self.launcher.store.jobs_in_recovery():
            job = self.repo.job_from_item(item)
            for rank in self.repo.get_ranks(job):
                if rank.attempt == job.attempt and rank.container_inst_id:
                    held.add(rank.container_inst_id)
            # A relocation's target nodes (tag-registered jobs) are the restart's too.
            held.update(str(p.get("node")) for p in job.placement.values() if p.get("node"))
        return held


def _candidate(item: Mapping[str, Any]) -> Candidate | None:
    try:
        return Candidate(
            job_id=str(item["job_id"]),
            nnodes=int(item.get("world_size") or 1),
            gpus_per_node=int(item.get("gpus_per_node") or 0),
            priority=int(item.get("priority") or 0),
        )
    except (KeyError, TypeError, ValueError):
        logger.warning("malformed queue item skipped", extra={"job_id": item.get("job_id")})
        return None


# ------------------------------------------------------------------- wiring
def build_scheduler(*, repo: Repository, ecs_adapter: Any, recovery: Any, ecs_client: Any,
                    ec2_client: Any, ssm_client: Any | None, cluster: str,
                    config: SchedulerConfig | None = None,
                    task_definitions: TaskDefinitions | None = None,
                    hosts: HostAddresses | None = None, owner: str | None = None) -> QueueScheduler:
    config = config or SchedulerConfig()
    store = SchedulingRepository(repo)
    lease = Lease(store, owner, config.lease_seconds)
    launcher = Launcher(repo, ecs_adapter, recovery, task_definitions or TaskDefinitions(ecs_client),
                        hosts or HostAddresses(ec2_client, ssm_client), store, lease.owner)
    return QueueScheduler(repo, launcher, ClusterReader(ecs_client, cluster), lease, config)
