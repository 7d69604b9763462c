"""``JobQueueService``: the jobs API's façade (the handler calls it). It builds the shared
``JobsApiContext`` and delegates each use case to its module: ``submit``, ``reads`` (get, list,
events), ``logs``, ``cancel``, ``suspension`` (suspend, resume), ``quotas``.

Jobs share the recovery loop's job model (table key ``job_id_rank``): a job item
``<job_id>#JOB`` and rank items ``<job_id>#<rank>``. Every state change is a conditional
write through :class:`~gpu_recovery.repository.jobs_api.JobQueueRepository` on the exact
state read, so it races safely with the scheduler and the recovery handlers. Reads use
keys and indexes only, never a Scan.

With an :class:`~gpu_recovery.queue.access.AccessPolicy` (the API always passes one)
every use case is authorized for the calling principal; without one the service is a
trusted in-process caller (the scheduler's tests, operators' tooling).

AWS is reached through adapters only (``gpu_recovery.adapters``; ``runtime.jobs_service``
builds them): ECS (StopTask, the container instances of the capacity check), task
definitions, training logs and the scheduler's Lambda. They turn the errors this service
shows to the caller into exceptions of their own (``TaskDefinitionNotFound``,
``LogStreamNotFound``, ``InvalidLogToken``; ``stop_task_if_known`` -> False); any other AWS
error propagates (a 5xx the client retries).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_recovery.constants import JobState
from gpu_recovery.domain.gang_batches import INLINE_MAX_RANKS, GangQueuePort
from gpu_recovery.domain.job_budgets import DEFAULT_MAX_APP_RESTARTS, DEFAULT_MAX_INFRA_RECOVERIES
from gpu_recovery.domain.time_sharing import DEFAULT_SUSPEND_GRACE_SECONDS
from gpu_recovery.queue.access import AccessPolicy
from gpu_recovery.queue.jobs_api import quotas as quota_cases
from gpu_recovery.queue.jobs_api.cancel import cancel_job
from gpu_recovery.queue.jobs_api.capacity import ClusterCapacity
from gpu_recovery.queue.jobs_api.context import JobsApiContext
from gpu_recovery.queue.jobs_api.logs import LOG_EVENTS_LIMIT, job_logs
from gpu_recovery.queue.jobs_api.ports import JobsEcs, LogReader, TaskDefinitionReader
from gpu_recovery.queue.jobs_api.reads import (
    DEFAULT_LIMIT,
    DEFAULT_RANKS,
    get_job,
    job_events,
    job_summary,
    list_jobs,
)
from gpu_recovery.queue.jobs_api.submit import Submission, submit_job
from gpu_recovery.queue.jobs_api.suspension import resume_job, suspend_job
from gpu_recovery.queue.jobs_api.triggers import NoSchedulerTrigger, SchedulerTrigger
from gpu_recovery.queue.models import JobSpec
from gpu_recovery.queue.quotas import QuotaService
from gpu_recovery.repository import Repository
from gpu_recovery.repository.jobs_api import JobQueueRepository
from gpu_recovery.repository.time_sharing import SuspensionRepository


class JobQueueService:
    """The queue's use cases; ``user`` is the caller identity the handler resolved."""

    def __init__(
        self,
        *,
        repo: JobQueueRepository | Repository,
        ecs: JobsEcs | None = None,
        task_definitions: TaskDefinitionReader | None = None,
        log_reader: LogReader | None = None,
        cluster: str = "",
        scheduler: SchedulerTrigger | None = None,
        capacity: ClusterCapacity | None = None,
        default_budgets: tuple[int, int] = (DEFAULT_MAX_INFRA_RECOVERIES, DEFAULT_MAX_APP_RESTARTS),
        access: AccessPolicy | None = None,
        quotas: QuotaService | None = None,
        suspend_grace_seconds: int = DEFAULT_SUSPEND_GRACE_SECONDS,
        ecs_client: Any | None = None,
        logs_client: Any | None = None,
        gang_queue: GangQueuePort | None = None,
        gang_inline_max_ranks: int = INLINE_MAX_RANKS,
    ) -> None:
        """``ecs``, ``task_definitions`` and ``log_reader`` are the adapters ``runtime.jobs_service``
        builds. ``ecs_client``/``logs_client`` (raw boto3 clients, wrapped in those adapters
        here) remain for callers not migrated yet: local mode's time-sharing campaign and
        the scheduler benchmark."""
        if ecs is None or task_definitions is None or log_reader is None:
            ecs, task_definitions, log_reader = _wrap_raw_clients(ecs, task_definitions, log_reader,
                                                                  ecs_client, logs_client, cluster)
        repo = repo if isinstance(repo, JobQueueRepository) else JobQueueRepository(repo)
        self.context = JobsApiContext(
            repo=repo,
            suspensions=SuspensionRepository(repo.base.jobs),
            ecs=ecs,
            task_definitions=task_definitions,
            log_reader=log_reader,
            cluster=cluster or ecs.cluster,
            scheduler=scheduler or NoSchedulerTrigger(),
            capacity=capacity or ClusterCapacity(ecs),
            default_budgets=default_budgets,
            access=access,
            quotas=quotas,
            suspend_grace_seconds=suspend_grace_seconds,
            gang_queue=gang_queue,
            gang_inline_max_ranks=gang_inline_max_ranks,
        )

    # The shared ports and settings (the handler swaps the trigger, tests the access policy).
    @property
    def repo(self) -> JobQueueRepository:
        return self.context.repo

    @property
    def ecs(self) -> JobsEcs:
        return self.context.ecs

    @property
    def cluster(self) -> str:
        return self.context.cluster

    @property
    def capacity(self) -> ClusterCapacity:
        return self.context.capacity

    @property
    def scheduler(self) -> SchedulerTrigger:
        return self.context.scheduler

    @scheduler.setter
    def scheduler(self, trigger: SchedulerTrigger) -> None:
        self.context.scheduler = trigger

    @property
    def access(self) -> AccessPolicy | None:
        return self.context.access

    @access.setter
    def access(self, access: AccessPolicy | None) -> None:
        self.context.access = access

    # The use cases.
    def submit(self, spec: JobSpec, user: str) -> dict[str, Any]:
        return submit_job(self.context, spec, user).job

    def submit_once(self, spec: JobSpec, user: str, idempotency_key: str) -> Submission:
        """Submit under the caller's Idempotency-Key: the job it made already, if any."""
        return submit_job(self.context, spec, user, idempotency_key)

    def get(self, job_id: str, user: str | None = None, *, ranks_from: int = 0,
            ranks_limit: int = DEFAULT_RANKS) -> dict[str, Any]:
        return get_job(self.context, job_id, user, ranks_from=ranks_from, ranks_limit=ranks_limit)

    @staticmethod
    def summary(item: Mapping[str, Any]) -> dict[str, Any]:
        return job_summary(item)

    def list(self, *, state: JobState | None = None, user: str | None = None, limit: int = DEFAULT_LIMIT,
             next_token: str | None = None, caller: str | None = None) -> dict[str, Any]:
        """Newest first, from an index (never a Scan); ``next_token`` is opaque."""
        return list_jobs(self.context, state=state, user=user, limit=limit, next_token=next_token,
                         caller=caller)

    def cancel(self, job_id: str, user: str) -> dict[str, Any]:
        return cancel_job(self.context, job_id, user)

    def suspend(self, job_id: str, user: str) -> dict[str, Any]:
        return suspend_job(self.context, job_id, user)

    def resume(self, job_id: str, user: str) -> dict[str, Any]:
        return resume_job(self.context, job_id, user)

    def events(self, job_id: str, user: str | None = None) -> dict[str, Any]:
        return job_events(self.context, job_id, user)

    def logs(self, job_id: str, *, rank: int = 0, attempt: int | None = None, next_token: str | None = None,
             limit: int = LOG_EVENTS_LIMIT, user: str | None = None) -> dict[str, Any]:
        return job_logs(self.context, job_id, rank=rank, attempt=attempt, next_token=next_token, limit=limit,
                        user=user)

    def quota_view(self, caller: str, user: str | None = None) -> dict[str, Any]:
        return quota_cases.quota_view(self.context, caller, user)

    def quota_list(self, caller: str, *, limit: int = 50, next_token: str | None = None) -> dict[str, Any]:
        return quota_cases.quota_list(self.context, caller, limit=limit, next_token=next_token)

    def quota_set(self, caller: str, user: str, priority: Any, max_nodes: Any) -> dict[str, Any]:
        return quota_cases.quota_set(self.context, caller, user, priority, max_nodes)

    def quota_remove(self, caller: str, user: str, priority: Any) -> dict[str, Any]:
        return quota_cases.quota_remove(self.context, caller, user, priority)


def _wrap_raw_clients(ecs: JobsEcs | None, task_definitions: TaskDefinitionReader | None,
                      logs: LogReader | None, ecs_client: Any | None, logs_client: Any | None,
                      cluster: str) -> tuple[JobsEcs, TaskDefinitionReader, LogReader]:
    """The adapters runtime.py would build, around raw clients a caller passed."""
    from gpu_recovery.adapters.ecs import EcsAdapter
    from gpu_recovery.adapters.logs import TrainingLogReader
    from gpu_recovery.adapters.task_definitions import TaskDefinitions

    if ecs is None:
        if ecs_client is None:
            raise TypeError("JobQueueService needs ecs= (an EcsAdapter) or ecs_client=")
        ecs = EcsAdapter(ecs_client, cluster)
    if task_definitions is None:
        if ecs_client is None:
            raise TypeError("JobQueueService needs task_definitions= or ecs_client=")
        task_definitions = TaskDefinitions(ecs_client, ttl_seconds=0)
    if logs is None:
        if logs_client is None:
            raise TypeError("JobQueueService needs log_reader= (a TrainingLogReader) or logs_client=")
        logs = TrainingLogReader(logs_client)
    return ecs, task_definitions, logs
