"""The job queue service behind the HTTP API: submit, get, list, cancel, suspend, resume,
events, logs, node quotas.

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

import base64
import binascii
import builtins
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.logs import InvalidLogToken, LogStreamNotFound
from gpu_recovery.adapters.task_definitions import TaskDefinitionNotFound
from gpu_recovery.constants import (
    JOB_BY_STATE_INDEX,
    JOB_BY_USER_INDEX,
    JOB_LIST_INDEX,
    JOB_PK,
    LIST_BUCKET,
    LIST_PK,
    QUEUE_BUCKET,
    QUEUE_PK,
    QUEUE_SK,
    STATE_PK,
    SUBMITTED_SK,
    SYSTEM_STOP_REASON_PREFIX,
    USER_PK,
    JobState,
    RankState,
    job_item_key,
    queue_order,
)
from gpu_recovery.domain.control_token import new_secret
from gpu_recovery.domain.gang_batches import INLINE_MAX_RANKS, STOP, GangQueuePort, batches
from gpu_recovery.domain.job_budgets import DEFAULT_MAX_APP_RESTARTS, DEFAULT_MAX_INFRA_RECOVERIES
from gpu_recovery.domain.models import container_instance_id, task_id
from gpu_recovery.domain.state_machine import can_transition, check_transition
from gpu_recovery.domain.states import (
    LIVE_RANK_STATES,
    QUEUED_JOB_STATES,
    RECOVERY_OWNED_JOB_STATES,
    WAITING_JOB_STATES,
)
from gpu_recovery.domain.time_sharing import (
    AUTO_PRIORITY,
    DEFAULT_SUSPEND_GRACE_SECONDS,
    PRIORITY_VALUES,
    QuotaBook,
    SuspendKind,
    resolve_auto_priority,
    suspend_record,
)
from gpu_recovery.queue.access import AccessPolicy, Denied, Principal, quota_subject
from gpu_recovery.queue.attempts import attempt_records
from gpu_recovery.queue.models import JobSpec, priority_name
from gpu_recovery.queue.quotas import QuotaInputError, QuotaService, subject_from
from gpu_recovery.repository import Repository, from_ddb
from gpu_recovery.repository.jobs_api import InvalidPageToken, JobQueueRepository
from gpu_recovery.repository.time_sharing import SuspensionRepository

logger = logging.getLogger(__name__)

SOURCE_QUEUE = "queue"
QUEUED_STATES = QUEUED_JOB_STATES
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
CAPACITY_CACHE_SECONDS = 60.0
LOG_EVENTS_LIMIT = 200
_CANCEL_RETRIES = 5
_SLUG_MAX = 40


# ------------------------------------------------------------------------------ errors
class QueueError(Exception):
    """An error the API shows to the caller: HTTP status, message, optional field."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field:
            body["field"] = self.field
        return body


class InvalidRequest(QueueError):
    status = 400
    code = "validation_error"


class JobNotFound(QueueError):
    status = 404
    code = "not_found"


class Forbidden(QueueError):
    """An authorization rule refused the request; ``code`` is ``forbidden:<rule>``."""

    status = 403

    def __init__(self, denied: Denied) -> None:
        super().__init__(f"{denied.rule}: {denied.message}", denied.field)
        self.code = f"forbidden:{denied.rule}"


class Conflict(QueueError):
    status = 409
    code = "conflict"


# ------------------------------------------------------------------------ scheduler port
class SchedulerTrigger(Protocol):
    """Wakes the scheduler up after the queue changed; never blocks the API on it."""

    def trigger(self, reason: str, job_id: str) -> None: ...


class NoSchedulerTrigger:
    """No scheduler configured: its periodic schedule picks the job up."""

    def trigger(self, reason: str, job_id: str) -> None:
        logger.debug("no scheduler to trigger", extra={"reason": reason, "job_id": job_id})


class AsyncInvoker(Protocol):
    """``adapters.scheduler_trigger.LambdaInvoker``: an asynchronous Lambda Invoke."""

    function_name: str

    def invoke_async(self, payload: Mapping[str, Any]) -> None: ...


class LambdaSchedulerTrigger:
    """Asynchronous ``Invoke`` (InvocationType=Event) of the scheduler function."""

    def __init__(self, invoker: AsyncInvoker) -> None:
        self._invoker = invoker
        self.function_name = invoker.function_name

    def trigger(self, reason: str, job_id: str) -> None:
        self._invoker.invoke_async(scheduler_payload(reason, job_id))


class CallbackSchedulerTrigger:
    """In-process trigger (local mode): calls ``callback(payload)`` directly."""

    def __init__(self, callback: Callable[[dict[str, Any]], Any]) -> None:
        self._callback = callback

    def trigger(self, reason: str, job_id: str) -> None:
        self._callback(scheduler_payload(reason, job_id))


def scheduler_payload(reason: str, job_id: str) -> dict[str, Any]:
    """The event the scheduler function receives from the API."""
    return {"source": "gpu-recovery.jobs-api", "reason": reason, "job_id": job_id, "at": clock.now()}


# ---------------------------------------------------------------------------- helpers
def slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower())
    slug = re.sub(r"-{2,}", "-", slug).strip("-")[:_SLUG_MAX].rstrip("-")
    return slug or "job"


def new_job_id(name: str, now: float) -> str:
    """``llama-ft-20261120-143201-7f3a``: readable, sortable by time, unique enough."""
    stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y%m%d-%H%M%S")
    return f"{slugify(name)}-{stamp}-{secrets.token_hex(2)}"


def encode_token(payload: Mapping[str, Any]) -> str:
    raw = json.dumps(from_ddb(dict(payload)), separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str) -> dict[str, Any]:
    try:
        padded = token + "=" * (-len(token) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()).decode())
    except (binascii.Error, ValueError, UnicodeDecodeError) as error:
        raise InvalidRequest("next_token: is not a token this API returned", "next_token") from error
    if not isinstance(value, dict):
        raise InvalidRequest("next_token: is not a token this API returned", "next_token")
    return value


# ------------------------------------------------------------------------ AWS ports
class JobsEcs(Protocol):
    """What the service asks ECS (``adapters.ecs.EcsAdapter``)."""

    cluster: str

    def stop_task_if_known(self, task_arn: str, reason: str) -> bool: ...

    def container_instances(self, statuses: Sequence[str | None] = ...) -> list[dict[str, Any]]: ...


class TaskDefinitionReader(Protocol):
    """``adapters.task_definitions.TaskDefinitions`` (raises TaskDefinitionNotFound)."""

    def describe(self, ref: str) -> dict[str, Any]: ...


class LogReader(Protocol):
    """``adapters.logs.TrainingLogReader`` (raises LogStreamNotFound, InvalidLogToken)."""

    def read_stream(self, group: str, stream: str, *, limit: int,
                    next_token: str | None = None) -> dict[str, Any]: ...


# ------------------------------------------------------------------------- capacity
@dataclass
class _CapacityCache:
    value: Capacity | None = None
    at: float = float("-inf")


@dataclass(frozen=True)
class Capacity:
    """GPU counts of the cluster's container instances (registered, any state)."""

    gpus_per_node: tuple[int, ...]

    @property
    def largest(self) -> int:
        return max(self.gpus_per_node, default=0)

    def nodes_with(self, gpus: int) -> int:
        return sum(1 for n in self.gpus_per_node if n >= gpus)


class ClusterCapacity:
    """GPU counts of the cluster's container instances, cached briefly."""

    def __init__(self, ecs: JobsEcs, ttl: float = CAPACITY_CACHE_SECONDS) -> None:
        self._ecs = ecs
        self.cluster = ecs.cluster
        self.ttl = ttl
        self._cache = _CapacityCache()
        self._lock = threading.Lock()

    def max_gpus_per_node(self) -> int | None:
        """None when the cluster has no container instances (it may scale out later)."""
        capacity = self.capacity()
        return capacity.largest if capacity is not None else None

    def capacity(self) -> Capacity | None:
        """None when the cluster has no container instances (it may scale out later)."""
        with self._lock:
            if time.monotonic() - self._cache.at < self.ttl:
                return self._cache.value
        value = self._read()
        with self._lock:
            self._cache = _CapacityCache(value, time.monotonic())
        return value

    def invalidate(self) -> None:
        with self._lock:
            self._cache = _CapacityCache()

    def _read(self) -> Capacity | None:
        # No status filter: every registered instance but INACTIVE ones (a DRAINING node
        # comes back; the check refuses only what could never run).
        described = self._ecs.container_instances((None,))
        if not described:
            return None
        return Capacity(tuple(gpu_count(i.get("registeredResources", [])) for i in described))


def gpu_count(resources: list[dict[str, Any]]) -> int:
    for resource in resources:
        if resource.get("name") == "GPU" and resource.get("type") == "STRINGSET":
            return len(resource.get("stringSetValue") or [])
    return 0


# --------------------------------------------------------------------------- service
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
    ) -> None:
        """``ecs``, ``task_definitions`` and ``log_reader`` are the adapters ``runtime.jobs_service``
        builds. ``ecs_client``/``logs_client`` (raw boto3 clients, wrapped in those adapters
        here) remain for callers not migrated yet: local mode's time-sharing campaign and
        the scheduler benchmark."""
        if ecs is None or task_definitions is None or log_reader is None:
            ecs, task_definitions, log_reader = _wrap_raw_clients(ecs, task_definitions, log_reader,
                                                                  ecs_client, logs_client, cluster)
        self.repo = repo if isinstance(repo, JobQueueRepository) else JobQueueRepository(repo)
        self.suspensions = SuspensionRepository(self.repo.base)
        self.quotas = quotas  # None: no quota table (every level unlimited, AUTO is NORMAL)
        self.suspend_grace_seconds = suspend_grace_seconds
        self.access = access
        self.ecs = ecs
        self.task_definitions = task_definitions
        self.log_reader = log_reader
        self.cluster = cluster or ecs.cluster
        self.scheduler: SchedulerTrigger = scheduler or NoSchedulerTrigger()
        self.capacity = capacity or ClusterCapacity(ecs)
        self.default_budgets = default_budgets  # (infrastructure recoveries, application restarts)
        self.gang_queue = gang_queue  # a large job's cancel stops its ranks in batches

    # ------------------------------------------------------------------ submit
    def _authorize(self, check: Callable[[AccessPolicy], None]) -> None:
        if self.access is not None:
            try:
                check(self.access)
            except Denied as denied:
                raise Forbidden(denied) from denied

    def submit(self, spec: JobSpec, user: str) -> dict[str, Any]:
        caller = Principal.parse(user)
        subject = quota_subject(user)
        self._authorize(lambda a: a.check_family(spec.task_definition))
        book = self.quotas.book() if self.quotas is not None else QuotaBook()
        auto_note = ""
        if spec.is_auto_priority:
            allowed = [lvl for lvl in PRIORITY_VALUES
                       if self.access is None or self.access.may_use_priority(caller, lvl)]
            level, auto_note = resolve_auto_priority(book, subject, spec.nnodes, allowed)
            spec = spec.model_copy(update={"priority": level})
        self._authorize(lambda a: a.check_priority(caller, spec.priority_value,
                                                   priority_name(spec.priority_value)))
        never = book.never_fits(subject, spec.priority_value, spec.nnodes)
        if never:
            raise InvalidRequest(f"nnodes: the job could never start: {never} (ask an administrator "
                                 "for a larger quota, or choose another priority)", "nnodes")
        spec = self._validate_against_aws(spec)
        now = clock.now()
        item: dict[str, Any] = {}
        for _ in range(5):
            job_id = new_job_id(spec.name, now)
            item = self._new_item(job_id, spec, user, now)
            item["quota_subject"] = subject
            if auto_note:
                item["priority_requested"] = AUTO_PRIORITY
                item["history"][0]["reason"] = f"submitted; {auto_note}"
            if caller.role:
                item["owner_role"] = caller.role
            if self.repo.create_job(item):
                break
        else:  # pragma: no cover - 5 collisions of a 16-bit suffix in the same second
            raise Conflict("could not allocate a unique job id, retry")
        logger.info("job submitted", extra={"job_id": item["job_id"], "user": user})
        self._trigger("submitted", item["job_id"])
        return self.summary(item)

    def _new_item(self, job_id: str, spec: JobSpec, user: str, now: float) -> dict[str, Any]:
        priority = spec.priority_value
        return {
            JOB_PK: job_item_key(job_id),
            "item_type": "JOB",
            "job_id": job_id,
            "job_state": JobState.QUEUED.value,
            "source": SOURCE_QUEUE,
            "name": spec.name,
            "user": user,
            "priority": priority,
            "submitted_at": now,
            "created_at": now,
            "updated_at": now,
            "spec_json": spec.to_json(),
            "task_definition_arn": spec.task_definition,
            "world_size": spec.nnodes,
            "gpus_per_node": spec.gpus_per_node,
            "attempt": 0,
            "recoveries_used": 0,
            "max_recovery_attempts": spec.budgets(*self.default_budgets)[0],
            "app_restarts_used": 0,
            "max_app_restarts": spec.budgets(*self.default_budgets)[1],
            "suspend_grace_seconds": spec.suspend_grace_seconds or self.suspend_grace_seconds,
            "control_secret": new_secret(),
            "suspend_count": 0,
            "resume_count": 0,
            "suspects": {},
            "verdicts": {},
            QUEUE_PK: QUEUE_BUCKET,
            QUEUE_SK: queue_order(priority, now, job_id),
            LIST_PK: LIST_BUCKET,
            "not_before": 0,
            "attempts": [],
            "last_error": "",
            "history": [
                {"at": now, "from": "", "to": JobState.QUEUED.value, "reason": "submitted", "actor": user}
            ],
        }

    def _validate_against_aws(self, spec: JobSpec) -> JobSpec:
        """Pin the task definition, resolve the container, refuse what could never run."""
        try:
            task_def = self.task_definitions.describe(spec.task_definition)
        except TaskDefinitionNotFound as error:
            raise InvalidRequest(
                f"task_definition: {spec.task_definition} does not exist", "task_definition"
            ) from error
        # The family as ECS resolved it (a revision ARN may name another family's alias).
        self._authorize(lambda a: a.check_family(task_def.get("taskDefinitionArn", spec.task_definition)))
        self._authorize(lambda a: a.check_task_roles(
            [r for r in (task_def.get("taskRoleArn"), task_def.get("executionRoleArn")) if r]))
        containers = task_def.get("containerDefinitions", [])
        names = [c.get("name") for c in containers]
        container_name = spec.container_name or (names[0] if names else None)
        if container_name not in names:
            raise InvalidRequest(
                f"container_name: {container_name} is not a container of {spec.task_definition} "
                f"({', '.join(n for n in names if n) or 'none'})",
                "container_name",
            )
        capacity = self.capacity.capacity()
        if capacity is not None and spec.gpus_per_node > capacity.largest:
            raise InvalidRequest(
                f"gpus_per_node: {spec.gpus_per_node} GPUs per node could never run: the largest "
                f"node of cluster {self.cluster} has {capacity.largest}",
                "gpus_per_node",
            )
        if capacity is not None and spec.nnodes > capacity.nodes_with(spec.gpus_per_node):
            raise InvalidRequest(
                f"nnodes: {spec.nnodes} nodes with {spec.gpus_per_node} GPUs each could never run: "
                f"cluster {self.cluster} has {capacity.nodes_with(spec.gpus_per_node)} such "
                f"node(s) of {len(capacity.gpus_per_node)} registered; add nodes first",
                "nnodes",
            )
        return spec.model_copy(
            update={"task_definition": task_def["taskDefinitionArn"], "container_name": container_name}
        )

    # --------------------------------------------------------------------- get
    def _item(self, job_id: str) -> dict[str, Any]:
        item = self.repo.job_item(job_id)
        if item is None:
            raise JobNotFound(f"job {job_id} not found")
        return item

    def _readable(self, job_id: str, user: str | None, action: str = "read") -> dict[str, Any]:
        """The job item, once the caller may ``action`` it (403 names the rule)."""
        item = self._item(job_id)
        if user is not None:
            caller = Principal.parse(user)
            self._authorize(lambda a: a.check_read(caller, item, action))
        return item

    def get(self, job_id: str, user: str | None = None) -> dict[str, Any]:
        item = self._readable(job_id, user)
        job = self.repo.job_from_item(item)
        ranks = [r for r in self.repo.get_ranks(job)] if job.world_size else []
        out = self.summary(item)
        out.update(
            {
                "spec": json.loads(item.get("spec_json") or "{}"),
                "source": item.get("source", ""),
                "recoveries_used": int(item.get("recoveries_used", 0)),
                "max_recovery_attempts": int(item.get("max_recovery_attempts", 0)),
                "app_restarts_used": int(item.get("app_restarts_used", 0)),
                "max_app_restarts": int(item.get("max_app_restarts", 0)),
                "relocations": list(item.get("relocations") or []),
                "breaker_hold": dict(item.get("breaker_hold") or {}) if job.state is JobState.HELD else None,
                "not_before": item.get("not_before", 0) or 0,
                "last_error": item.get("last_error", ""),
                "wait_reason": item.get("wait_reason", "") if JobState(item["job_state"]) in QUEUED_STATES
                else "",
                "quota_user": str(item.get("quota_subject") or quota_subject(str(item.get("user") or ""))),
                "priority_requested": str(item.get("priority_requested") or ""),
                "demoted_from": item.get("demoted_from"),
                "suspend_grace_seconds": int(item.get("suspend_grace_seconds") or self.suspend_grace_seconds),
                "suspend": _suspend_view(item.get("suspend")),
                "held": bool(item.get("held", False)),
                "suspend_count": int(item.get("suspend_count") or 0),
                "resume_count": int(item.get("resume_count") or 0),
                "ranks": [
                    {
                        "rank": r.rank,
                        "attempt": r.attempt,
                        "state": r.state.value,
                        "task_arn": r.task_arn,
                        "container_instance_id": r.container_inst_id
                        or container_instance_id(r.container_instance_arn),
                        "ec2_instance_id": r.ec2_instance_id,
                        "last_heartbeat_at": r.last_heartbeat_at,
                        "exit_code": r.exit_code,
                        "stop_reason": r.stop_reason,
                    }
                    for r in ranks
                ],
                "attempts": [_attempt(a) for a in attempt_records(item.get("attempts") or [],
                                                                  item.get("history") or [],
                                                                  int(item.get("attempt") or 0))],
            }
        )
        return out

    @staticmethod
    def summary(item: Mapping[str, Any]) -> dict[str, Any]:
        item = from_ddb(dict(item))
        priority = int(item.get("priority", 0))
        return {
            "job_id": item["job_id"],
            "name": item.get("name", item["job_id"]),
            "user": item.get("user", ""),
            "state": item["job_state"],
            "priority": priority,
            "priority_name": priority_name(priority),
            "nnodes": int(item.get("world_size", 0)),
            "gpus_per_node": int(item.get("gpus_per_node", 0)),
            "attempt": int(item.get("attempt", 0)),
            "submitted_at": item.get("submitted_at", item.get("created_at", 0)),
            "updated_at": item.get("updated_at", 0),
        }

    # -------------------------------------------------------------------- list
    def list(
        self,
        *,
        state: JobState | None = None,
        user: str | None = None,
        limit: int = DEFAULT_LIMIT,
        next_token: str | None = None,
        caller: str | None = None,
    ) -> dict[str, Any]:
        """Newest first, from an index (never a Scan); ``next_token`` is opaque.

        With an access policy, a caller who is not an admin lists its own jobs (``user``
        defaults to the caller) and may name another principal only as the rules allow.
        """
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(f"limit: must be between 1 and {MAX_LIMIT}", "limit")
        if caller is not None and self.access is not None:
            principal = Principal.parse(caller)
            self._authorize(lambda a: a.check_list(principal, user))
            if user is None and not self.access.is_admin(principal):
                user = caller
        filter_state: str | None = None
        if user:
            index, pk_attr, pk_value = JOB_BY_USER_INDEX, USER_PK, user
            filter_state = state.value if state else None
        elif state:
            index, pk_attr, pk_value = JOB_BY_STATE_INDEX, STATE_PK, state.value
        else:
            index, pk_attr, pk_value = JOB_LIST_INDEX, LIST_PK, LIST_BUCKET
        scope = f"{index}|{pk_value}|{state.value if state else ''}"
        start_key: dict[str, Any] | None = None
        if next_token:
            token = decode_token(next_token)
            if token.get("q") != scope or not isinstance(token.get("k"), dict):
                raise InvalidRequest(
                    "next_token: belongs to a different query (same filters are needed)", "next_token"
                )
            start_key = token["k"]
        items: list[dict[str, Any]] = []
        last_key: dict[str, Any] | None = None
        while True:
            page_limit = limit - len(items) if not filter_state else max(limit, 25)
            try:
                page, last_key = self.repo.list_page(index, pk_attr, pk_value, state=filter_state,
                                                     limit=page_limit, start_key=start_key)
            except InvalidPageToken as error:
                raise InvalidRequest("next_token: is not valid for this query", "next_token") from error
            room = limit - len(items)
            if len(page) > room:  # filtered query read past the page: resume after the last one kept
                items.extend(page[:room])
                last_key = _index_key(items[-1], pk_attr)
                break
            items.extend(page)
            if last_key is None or len(items) >= limit:
                break
            start_key = last_key
        return {
            "jobs": [self.summary(i) for i in items],
            "next_token": encode_token({"q": scope, "k": last_key}) if last_key else None,
        }

    # ------------------------------------------------------------------ cancel
    def cancel(self, job_id: str, user: str) -> dict[str, Any]:
        """Queued -> CANCELED now; running -> CANCELING + StopTask; terminal: unchanged."""
        for _ in range(_CANCEL_RETRIES):
            item = self._readable(job_id, user if self.access is not None else None, "cancel")
            current = JobState(item["job_state"])
            result: dict[str, Any] = {"job_id": job_id, "previous_state": current.value, "stopping_ranks": []}
            if current.is_terminal:
                return {**result, "state": current.value, "changed": False}
            reason = f"canceled by {user}"
            if current in QUEUED_STATES:
                if self.repo.move_job(job_id, current, JobState.CANCELED, reason=reason, actor=user,
                                      leave_queue=True):
                    self._trigger("canceled", job_id)
                    return {**result, "state": JobState.CANCELED.value, "changed": True}
                continue
            if current is JobState.CANCELING:
                stopping, state = self._stop_and_finish(job_id, user, was_starting=False)
                return {**result, "state": state.value, "changed": False, "stopping_ranks": stopping}
            target = JobState.CANCELING if can_transition(current, JobState.CANCELING) else JobState.CANCELED
            check_transition(current, target)
            attempt = int(item.get("attempt") or 0)
            stop_of = attempt if target is JobState.CANCELING and attempt else None
            if not self.repo.move_job(job_id, current, target, reason=reason, actor=user,
                                      leave_queue=True, clear_deadline=True, stop_ranks_of=stop_of):
                continue
            stopping, state = self._stop_and_finish(
                job_id, user, was_starting=current is JobState.STARTING
            )
            if state.is_terminal:
                self._trigger("canceled", job_id)
            return {**result, "state": state.value, "changed": True, "stopping_ranks": stopping}
        raise Conflict(f"job {job_id} changed state repeatedly while canceling, retry")

    def _stop_and_finish(
        self, job_id: str, user: str, *, was_starting: bool
    ) -> tuple[builtins.list[int], JobState]:
        """StopTask every live rank of the current attempt; CANCELED once none is left.

        The job is CANCELING *before* the ranks are read, so a rank that stops after
        this read is finished by the task handler (``_maybe_canceled``).
        """
        item = self._item(job_id)
        job = self.repo.job_from_item(item)
        if job.world_size > INLINE_MAX_RANKS:
            # A large gang: its ranks are stopped in batches (the committed intent); the task
            # handler finishes the cancel once every rank ended.
            if self.gang_queue is not None and job.stop_fanout and not job.stop_fanout.get("sent_at"):
                why = str(job.stop_fanout.get("why") or f"canceled by {user}")
                self.gang_queue.send([b.body() for b in batches(
                    STOP, job.job_id, job.attempt, job.world_size, why=why, remediation=False)])
                self.repo.record_stop_sent(job.job_id, job.attempt, clock.now())
            return [], job.state
        ranks = [r for r in self.repo.get_ranks(job) if r.attempt == job.attempt]
        why = f"{SYSTEM_STOP_REASON_PREFIX} canceled by {user}"
        stopping: list[int] = []
        for rank in ranks:
            if rank.state in LIVE_RANK_STATES:
                if not self.repo.request_rank_stop(rank, LIVE_RANK_STATES, f"canceled by {user}"):
                    fresh = self.repo.get_rank(job_id, rank.rank)
                    if fresh is None or fresh.state is not RankState.STOP_REQUESTED:
                        continue
            elif rank.state is not RankState.STOP_REQUESTED:
                continue
            self._stop_task(rank.task_arn, why)
            stopping.append(rank.rank)
        if job.state is not JobState.CANCELING:
            return stopping, job.state
        complete = not was_starting or len(ranks) >= job.world_size
        fresh_ranks = [r for r in self.repo.get_ranks(job) if r.attempt == job.attempt]
        if complete and all(r.state.is_terminal for r in fresh_ranks):
            self.repo.move_job(job_id, JobState.CANCELING, JobState.CANCELED,
                               reason="every rank stopped", actor=user, leave_queue=False)
            return stopping, JobState(self._item(job_id)["job_state"])
        return stopping, JobState.CANCELING

    def _stop_task(self, task_arn: str, reason: str) -> None:
        self.ecs.stop_task_if_known(task_arn, reason)  # False: ECS no longer knows the task

    # ----------------------------------------------------------- suspend/resume
    def suspend(self, job_id: str, user: str) -> dict[str, Any]:
        """The owner suspends a job: a running one gracefully (rank 0 is told, has the
        job's grace to checkpoint and call go_suspend(), then its ranks are stopped); a
        waiting one at once. Either way it is held until resumed."""
        for _ in range(_CANCEL_RETRIES):
            item = self._suspendable(job_id, user, "suspend")
            current = JobState(item["job_state"])
            result = {"job_id": job_id, "previous_state": current.value, "held": True}
            if current is JobState.RUNNING:
                grace = int(item.get("suspend_grace_seconds") or self.suspend_grace_seconds)
                now = clock.now()
                record = suspend_record(SuspendKind.USER, f"suspended by {user}", grace_seconds=grace,
                                        now=now, hold=True, by_user=quota_subject(user))
                if self.suspensions.request(job_id, int(item.get("attempt") or 0), suspend=record,
                                            deadline_at=now + grace, actor=user,
                                            reason=f"suspend requested by {user}; grace {grace} s"):
                    return {**result, "state": JobState.SUSPENDING.value, "changed": True,
                            "deadline_at": now + grace}
                continue
            if current in WAITING_JOB_STATES or (
                    current is JobState.SUSPENDED and not item.get("held")):
                record = suspend_record(SuspendKind.USER, f"suspended by {user}", grace_seconds=0,
                                        now=clock.now(), hold=True, by_user=quota_subject(user))
                if self.suspensions.hold_waiting(job_id, current, suspend=record, actor=user,
                                                 reason=f"suspended by {user} while waiting: held "
                                                        "until resumed"):
                    return {**result, "state": JobState.SUSPENDED.value, "changed": True}
                continue
            if current is JobState.SUSPENDING:
                held = bool((item.get("suspend") or {}).get("hold"))
                if held or self.suspensions.set_hold(job_id, True, actor=user,
                                                     reason=f"suspend by {user}: held once stopped"):
                    return {**result, "state": current.value, "changed": not held}
                continue
            if current is JobState.SUSPENDED:
                return {**result, "state": current.value, "changed": False}
            raise Conflict(_not_now(job_id, current, "suspended"))
        raise Conflict(f"job {job_id} changed state repeatedly while suspending, retry")

    def resume(self, job_id: str, user: str) -> dict[str, Any]:
        """A held job back into the queue at its original position (a suspending one once
        its ranks stopped)."""
        for _ in range(_CANCEL_RETRIES):
            item = self._suspendable(job_id, user, "resume")
            current = JobState(item["job_state"])
            result = {"job_id": job_id, "previous_state": current.value, "held": False}
            if current is JobState.SUSPENDED:
                if not item.get("held"):
                    return {**result, "state": current.value, "changed": False}
                order = queue_order(int(item.get("priority", 0)), float(item.get("submitted_at") or 0),
                                    job_id)
                if self.suspensions.resume_held(job_id, queue_order=order, actor=user,
                                                reason=f"resumed by {user}: queued again at its original "
                                                       "position"):
                    self._trigger("resumed", job_id)
                    return {**result, "state": current.value, "changed": True}
                continue
            if current is JobState.SUSPENDING:
                held = bool((item.get("suspend") or {}).get("hold"))
                if not held or self.suspensions.set_hold(job_id, False, actor=user,
                                                         reason=f"resumed by {user}: queued again once "
                                                                "stopped"):
                    return {**result, "state": current.value, "changed": held}
                continue
            raise Conflict(_not_now(job_id, current, "resumed"))
        raise Conflict(f"job {job_id} changed state repeatedly while resuming, retry")

    def _suspendable(self, job_id: str, user: str, action: str) -> dict[str, Any]:
        item = self._readable(job_id, user if self.access is not None else None, action)
        if item.get("source", SOURCE_QUEUE) != SOURCE_QUEUE:
            raise Conflict(f"job {job_id} was started on ECS directly (registered from its task tags): "
                           f"only queue jobs can be {action}ed, since only the queue can start them again")
        return item

    # ------------------------------------------------------------------ quotas
    def quota_view(self, caller: str, user: str | None = None) -> dict[str, Any]:
        """A user's quota at every level (your own; admins may name another user)."""
        subject = quota_subject(caller)
        if user is not None:
            try:
                wanted = subject_from(user)
            except QuotaInputError as error:
                raise InvalidRequest(str(error), error.field) from error
            if wanted != subject:
                self._authorize(lambda a: a.check_admin(Principal.parse(caller), f"read the quota of {user}"))
            subject = wanted
        return self._quota_service().view(subject)

    def quota_list(self, caller: str, *, limit: int = 50, next_token: str | None = None) -> dict[str, Any]:
        self._authorize(lambda a: a.check_admin(Principal.parse(caller), "list every user's quota"))
        return self._quota_call(lambda q: q.list_all(limit=limit, next_token=next_token))

    def quota_set(self, caller: str, user: str, priority: Any, max_nodes: Any) -> dict[str, Any]:
        self._authorize(lambda a: a.check_admin(Principal.parse(caller), "set node quotas"))
        result = self._quota_call(lambda q: q.set_limit(user, priority, max_nodes, by=caller))
        self._trigger("quota changed", "")
        return result

    def quota_remove(self, caller: str, user: str, priority: Any) -> dict[str, Any]:
        self._authorize(lambda a: a.check_admin(Principal.parse(caller), "remove node quotas"))
        result = self._quota_call(lambda q: q.remove_limit(user, priority, by=caller))
        self._trigger("quota changed", "")
        return result

    def _quota_service(self) -> QuotaService:
        if self.quotas is None:
            raise Conflict("node quotas are not configured in this deployment (no quota table)")
        return self.quotas

    def _quota_call(self, call: Callable[[QuotaService], dict[str, Any]]) -> dict[str, Any]:
        try:
            return call(self._quota_service())
        except QuotaInputError as error:
            raise InvalidRequest(str(error), error.field) from error

    # ------------------------------------------------------------------ events
    def events(self, job_id: str, user: str | None = None) -> dict[str, Any]:
        item = self._readable(job_id, user)
        history = [e for e in item.get("history") or [] if isinstance(e, Mapping)]
        return {
            "job_id": job_id,
            "state": item["job_state"],
            "events": [
                {
                    "at": e.get("at", 0),
                    "from": previous,
                    "to": e.get("to", ""),
                    "reason": e.get("reason", ""),
                    "actor": e.get("actor", ""),
                }
                for e, previous in zip(history, previous_states(history), strict=True)
            ],
        }

    # -------------------------------------------------------------------- logs
    def logs(
        self,
        job_id: str,
        *,
        rank: int = 0,
        attempt: int | None = None,
        next_token: str | None = None,
        limit: int = LOG_EVENTS_LIMIT,
        user: str | None = None,
    ) -> dict[str, Any]:
        """One rank's container log (awslogs driver), oldest first, page by page."""
        item = self._readable(job_id, user)
        world_size = int(item.get("world_size", 0))
        if not 0 <= rank < max(world_size, 1):
            raise InvalidRequest(f"rank: must be between 0 and {max(world_size - 1, 0)}", "rank")
        current_attempt = int(item.get("attempt", 0))
        attempt = current_attempt if attempt is None else attempt
        if attempt < 1 or attempt > current_attempt:
            if current_attempt == 0:
                raise JobNotFound(f"job {job_id} has not started yet: no logs")
            raise InvalidRequest(f"attempt: must be between 1 and {current_attempt}", "attempt")
        task_arn, task_def = self._task_of(item, rank, attempt)
        if not task_arn:
            raise JobNotFound(f"no task recorded for rank {rank} of attempt {attempt}")
        spec = json.loads(item.get("spec_json") or "{}")
        group, stream = self._log_location(task_def or spec.get("task_definition", ""),
                                           spec.get("container_name"), task_arn)
        try:
            page = self.log_reader.read_stream(group, stream, limit=limit, next_token=next_token)
        except LogStreamNotFound as error:
            raise JobNotFound(f"log stream {stream} not found in {group} (yet)") from error
        except InvalidLogToken as error:
            raise InvalidRequest("next_token: is not valid for this log stream", "next_token") from error
        events = page["events"]
        forward = page["next_token"]
        return {
            "job_id": job_id,
            "rank": rank,
            "attempt": attempt,
            "task_arn": task_arn,
            "log_group": group,
            "log_stream": stream,
            "events": events,
            "next_token": forward,
            "end_of_stream": not events or forward == next_token,
        }

    def _task_of(self, item: Mapping[str, Any], rank: int, attempt: int) -> tuple[str, str]:
        """The rank's task ARN in that attempt: the rank item, else the attempt record."""
        found = self.repo.get_rank(item["job_id"], rank)
        if found is not None and found.attempt == attempt and found.task_arn:
            return found.task_arn, found.task_definition_arn
        for record in item.get("attempts") or []:
            if int(record.get("attempt", -1)) == attempt:
                arns = record.get("task_arns") or []
                if isinstance(arns, Mapping):
                    arn = arns.get(str(rank), "")
                else:
                    arn = arns[rank] if rank < len(arns) else ""
                return arn, record.get("task_definition_arn", "")
        return "", ""

    def _log_location(self, task_definition: str, container_name: str | None,
                      task_arn: str) -> tuple[str, str]:
        try:
            task_def = self.task_definitions.describe(task_definition)
        except TaskDefinitionNotFound as error:
            raise JobNotFound(f"task definition {task_definition} no longer exists") from error
        containers = task_def.get("containerDefinitions", [])
        container = next((c for c in containers if c.get("name") == container_name),
                         containers[0] if containers else {})
        config = container.get("logConfiguration") or {}
        options = config.get("options") or {}
        if config.get("logDriver") != "awslogs" or not options.get("awslogs-group"):
            raise JobNotFound(
                f"container {container.get('name', '?')} of {task_definition} does not log to "
                "CloudWatch Logs (awslogs driver)"
            )
        prefix = options.get("awslogs-stream-prefix")
        if not prefix:
            raise JobNotFound("the awslogs configuration has no awslogs-stream-prefix: stream unknown")
        return options["awslogs-group"], f"{prefix}/{container['name']}/{task_id(task_arn)}"

    # ----------------------------------------------------------------- helpers
    def _trigger(self, reason: str, job_id: str) -> None:
        try:
            self.scheduler.trigger(reason, job_id)
        except Exception:  # the scheduler's own schedule catches up; never fail the request
            logger.warning("could not trigger the scheduler", exc_info=True,
                           extra={"reason": reason, "job_id": job_id})


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


def _not_now(job_id: str, state: JobState, action: str) -> str:
    if state.is_terminal:
        return f"job {job_id} is {state.value}: it can no longer be {action}"
    if state in RECOVERY_OWNED_JOB_STATES:
        return (f"job {job_id} is {state.value}: the recovery loop owns it; it can be {action} once it "
                "is RUNNING again")
    if action == "resumed":
        return f"job {job_id} is {state.value}: only a suspended job can be resumed"
    return f"job {job_id} is {state.value}: it can be {action} once RUNNING (or while it waits)"


def _suspend_view(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping) or not raw:
        return None
    keys = ("kind", "reason", "requested_at", "deadline_at", "grace_seconds", "hold", "by_job", "by_user",
            "stop_requested_at", "stop_reason")
    return {k: raw[k] for k in keys if k in raw}


def _attempt(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "attempt": record.get("attempt"),
        "started_at": record.get("started_at"),
        "ended_at": record.get("ended_at"),
        "outcome": record.get("outcome", ""),
        "failure_kind": record.get("failure_kind", ""),
        "reason": record.get("reason", ""),
    }


def _index_key(item: Mapping[str, Any], index_pk: str) -> dict[str, Any]:
    """ExclusiveStartKey of an index query that resumes right after ``item``."""
    return {JOB_PK: item[JOB_PK], index_pk: item[index_pk], SUBMITTED_SK: item[SUBMITTED_SK]}


def previous_states(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The state each history entry left. A transition is a conditional write that does not
    read the job first, so its entry stores the states it was allowed from ("HUNG|NODE_LOST|
    RUNNING"); every state change appends its entry in that same write, so the entry before
    names the state it really left. Kept as stored when there is no entry before (trimmed
    history) or it is not one of the allowed states."""
    out = []
    for i, entry in enumerate(history):
        stored = str(entry.get("from", "") or "")
        before = str(history[i - 1].get("to", "") or "") if i else ""
        out.append(before if before and before in stored.split("|") else stored)
    return out
