"""A restart's nodes looked at before it is claimed, and the wait when they cannot take it now
(``domain.restart_wait``): a restart never fails for a placement race.

:meth:`RestartWaits.blocked` reads the ranks the restart will start on nodes they keep (the
fault's attempt's rank items, a Query per 100s of ranks) and describes those nodes
(DescribeContainerInstances, by 100): a node whose agent is disconnected, that is not ACTIVE
or gone, or whose free GPUs are fewer than its ranks need is *blocked*, and for a busy node
what holds it is named (ListTasks of the node and DescribeTasks: asked only of the few blocked
nodes a wait names, ``domain.restart_wait``'s five). While a wait lasts,
:meth:`RestartWaits.named_still_blocked` describes the nodes it names alone (with the GPUs their
ranks need, kept on the wait): one still blocked keeps the restart waiting without a read of
every rank and node each minute; once they are free, every node is looked at again.

:meth:`RestartWaits.wait` keeps the job waiting (PENDING_RESTART before its claim, STARTING
after it: a race between the look and StartTask) with its reason on the job item until
``relocation_wait_seconds`` pass, then fails it with an e-mail naming the first blocked nodes
and what holds each, and how many more there are. The job keeps its nodes reserved meanwhile
(``recovery.placement``: a recovering job's nodes carry ``reserved``), and tries again on the
sweep (every minute) and as soon as a task stops on a node reserved for it
(``PlacementHolds.on_task_stopped``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.relocation import gpu_count
from gpu_recovery.domain.restart_wait import NAMED_BLOCKED_NODES, RestartWait, blocked_by
from gpu_recovery.recovery.ports import MetricsPort, Outcome
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.restarts import RestartRepository

logger = logging.getLogger(__name__)

_ACTION = ("Free the node(s) named (or let the job move: tag its tasks gpu-recovery:relocatable=true), "
           "then resubmit the job.")


class WaitData(Protocol):
    """The job, its ranks (where they restart), its deadline pushed."""

    deadlines: DeadlineIndex

    def get_job(self, job_id: str) -> Job | None: ...
    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]: ...


class NodesAndTheirTasks(Protocol):
    """DescribeContainerInstances (free GPUs) and ListTasks + DescribeTasks on one node."""

    def describe_container_instances(self, refs: Sequence[str]) -> dict[str, dict[str, Any]]: ...
    def tasks_on(self, container_instance: str) -> list[dict[str, Any]]: ...


@dataclass(eq=False, repr=False)
class RestartWaits:
    """``wait_seconds``: how long a restart waits for its nodes to free up (``relocation_wait_seconds``)."""

    data: WaitData
    records: RestartRepository  # the wait for placement
    ecs: NodesAndTheirTasks
    fail: Callable[[Job, str, str], object]  # (job, reason, operator action): FAILED with its e-mail, once
    _: KW_ONLY
    wait_seconds: int
    metrics: MetricsPort  # the service's relay: the invocation's metrics

    # -------------------------------------------------------------------- look
    def blocked(self, job: Job, *, leaving: Iterable[str] = (), attempt: int | None = None) -> dict[str, str]:
        """node -> why, for the nodes the restart of ``job`` starts ranks on (the ranks of
        ``attempt``, by default the job's, on nodes not in ``leaving``) that cannot take them
        now ({}: every one can)."""
        return self.look(job, leaving=leaving, attempt=attempt)[0]

    def look(self, job: Job, *, leaving: Iterable[str] = (), attempt: int | None = None
             ) -> tuple[dict[str, str], dict[str, int]]:
        """:meth:`blocked`, and the GPUs the ranks of each node need (what a wait keeps of its
        named nodes, to look at those alone while it lasts)."""
        repo = self.data
        attempt = job.attempt if attempt is None else attempt
        skip = set(leaving)
        needs: dict[str, tuple[str, int]] = {}
        for rank in repo.get_rank_range(job.job_id, 0, job.world_size):
            node = rank.container_inst_id
            if rank.attempt != attempt or not node or node in skip:
                continue
            ref, gpus = needs.get(node, (rank.container_instance_arn or node, 0))
            needs[node] = (ref, gpus + max(1, int(rank.gpus or 0)))
        blocked = self._judge(job, needs)
        return blocked, {node: gpus for node, (_, gpus) in needs.items()}

    def named_still_blocked(self, job: Job, now: float) -> dict[str, str]:
        """While the restart's wait lasts: the nodes it names (at most five) that still cannot
        take their ranks, described alone (no rank read; {}: none is, the wait is over or
        knows no GPUs: look at every node)."""
        wait = job.restart_wait
        needs = wait.named_needs() if wait is not None and not wait.expired(now) else {}
        return self._judge(job, {node: (node, gpus) for node, gpus in needs.items()}) if needs else {}

    def _judge(self, job: Job, needs: Mapping[str, tuple[str, int]]) -> dict[str, str]:
        """node -> why for the nodes of ``needs`` (node -> its reference, the GPUs its ranks
        need) that cannot take their ranks now."""
        if not needs:
            return {}
        described = self.ecs.describe_container_instances([ref for ref, _ in needs.values()])
        blocked: dict[str, str] = {}
        for node, (ref, gpus) in sorted(needs.items()):
            ci = described.get(node)
            why = blocked_by(status=str(ci.get("status")) if ci else None,
                             agent_connected=bool((ci or {}).get("agentConnected")),
                             free_gpus=gpu_count((ci or {}).get("remainingResources")), needed_gpus=gpus)
            # Only the nodes the wait names (the first, by node) are asked what holds them.
            if why.startswith("RESOURCE:GPU") and len(blocked) < NAMED_BLOCKED_NODES:
                why = f"{why}, held by {self.holder(ref)}"
            if why:
                blocked[node] = why
        if blocked:
            logger.info("restart's nodes not free", extra={"job_id": job.job_id, "blocked": blocked})
        return blocked

    def holder(self, container_instance: str) -> str:
        """What holds a node: its live tasks, named by ECS's own words (at most three)."""
        try:
            tasks = self.ecs.tasks_on(container_instance)
        except Exception as error:  # naming the holder must never stop the wait
            logger.warning("tasks on a node not listed",
                           extra={"node": container_instance, "error": str(error)})
            return "a task ECS could not list now"
        if not tasks:
            return "GPUs ECS has not released yet (no live task listed)"
        names = [f"task {str(t.get('taskArn', '?')).rsplit('/', 1)[-1][:12]} (group {t.get('group') or '-'}, "
                 f"started by {t.get('startedBy') or '-'})" for t in tasks[:3]]
        more = f" and {len(tasks) - 3} more" if len(tasks) > 3 else ""
        return ", ".join(names) + more

    # -------------------------------------------------------------------- wait
    def wait(self, job: Job, blocked: dict[str, str], gpus: Mapping[str, int] | None = None) -> Outcome:
        """The job waits for ``blocked`` (written once per attempt, with the ``gpus`` the ranks
        of the nodes it names need), or fails once its wait is over
        (``relocation_wait_seconds``; 0: at once) with the e-mail naming them."""
        repo, now = self.data, clock.now()
        wait = job.restart_wait
        if wait is None:
            seconds = self.wait_seconds
            wait = RestartWait.start(job.attempt, now, seconds, blocked, gpus)
            if seconds <= 0:
                self.fail(job, wait.timeout_reason(), _ACTION)
                return Outcome("restart_failed", job.job_id, {"why": "nodes not free", "blocked": blocked})
            if self.records.wait_for_placement(job, wait, now + RETRY_INTERVAL_SECONDS):
                self.metrics.add_metric("RestartWaits", "Count", 1)
                return Outcome("waiting", job.job_id, {"why": "nodes not free", "until": wait.until,
                                                       "blocked": blocked})
            fresh = repo.get_job(job.job_id)
            if fresh is None or fresh.state is not job.state or fresh.attempt != job.attempt \
                    or fresh.restart_wait is None:
                return Outcome("duplicate", job.job_id)
            wait = fresh.restart_wait  # another delivery started the wait: its deadline holds
        if wait.expired(now):
            # What holds the nodes now, in the e-mail (not what held them when the wait began).
            ended = wait.now_blocked(blocked)
            self.fail(job, ended.timeout_reason(), _ACTION)
            return Outcome("restart_failed", job.job_id,
                           {"why": "nodes not free in time", "blocked": blocked})
        repo.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
        return Outcome("waiting", job.job_id,
                       {"why": "nodes not free", "until": wait.until, "blocked": blocked})
