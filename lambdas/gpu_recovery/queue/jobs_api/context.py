"""What every use case of the jobs API shares: its ports and settings, and the steps
they all take (authorize the caller, read the job item, wake the scheduler up)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_recovery.domain.gang_batches import INLINE_MAX_RANKS, GangQueuePort
from gpu_recovery.queue.access import AccessPolicy, Denied, Principal
from gpu_recovery.queue.jobs_api.capacity import ClusterCapacity
from gpu_recovery.queue.jobs_api.errors import Forbidden, JobNotFound
from gpu_recovery.queue.jobs_api.ports import JobsEcs, LogReader, TaskDefinitionReader
from gpu_recovery.queue.jobs_api.triggers import SchedulerTrigger
from gpu_recovery.queue.quotas import QuotaService
from gpu_recovery.repository.jobs_api import JobQueueRepository
from gpu_recovery.repository.time_sharing import SuspensionRepository

logger = logging.getLogger(__name__)

SOURCE_QUEUE = "queue"
#: tries of a use case whose conditional write lost a race with another writer
RACE_RETRIES = 5


@dataclass
class JobsApiContext:
    repo: JobQueueRepository
    suspensions: SuspensionRepository
    ecs: JobsEcs
    task_definitions: TaskDefinitionReader
    log_reader: LogReader
    cluster: str
    scheduler: SchedulerTrigger
    capacity: ClusterCapacity
    default_budgets: tuple[int, int]  # (infrastructure recoveries, application restarts)
    access: AccessPolicy | None  # None: a trusted in-process caller
    quotas: QuotaService | None  # None: no quota table (every level unlimited, AUTO is NORMAL)
    suspend_grace_seconds: int
    gang_queue: GangQueuePort | None  # a large job's cancel stops its ranks in batches
    gang_inline_max_ranks: int = INLINE_MAX_RANKS  # ... a smaller one's cancel stops them itself

    def authorize(self, check: Callable[[AccessPolicy], None]) -> None:
        if self.access is not None:
            try:
                check(self.access)
            except Denied as denied:
                raise Forbidden(denied) from denied

    def item(self, job_id: str) -> dict[str, Any]:
        item = self.repo.job_item(job_id)
        if item is None:
            raise JobNotFound(f"job {job_id} not found")
        return item

    def readable(self, job_id: str, user: str | None, action: str = "read") -> dict[str, Any]:
        """The job item, once the caller may ``action`` it (403 names the rule)."""
        item = self.item(job_id)
        if user is not None:
            caller = Principal.parse(user)
            self.authorize(lambda a: a.check_read(caller, item, action))
        return item

    def trigger(self, reason: str, job_id: str) -> None:
        try:
            self.scheduler.trigger(reason, job_id)
        except Exception:  # the scheduler's own schedule catches up; never fail the request
            logger.warning("could not trigger the scheduler", exc_info=True,
                           extra={"reason": reason, "job_id": job_id})
