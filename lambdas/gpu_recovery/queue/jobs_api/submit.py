"""Submit: authorize, resolve AUTO priority, check the quota and what AWS can run, then
create the QUEUED job item (a unique, readable job id) and wake the scheduler up.

With an Idempotency-Key the job item is written together with the caller's key (the
repository's ``create_keyed_job``), so a retry whose first try wrote the job but never
answered (the Lambda timed out, Powertools' record of it expired or was dropped) finds the
job the key made instead of making a second one."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpu_recovery import clock
from gpu_recovery.adapters.task_definitions import TaskDefinitionNotFound
from gpu_recovery.constants import (
    JOB_PK,
    LIST_BUCKET,
    LIST_PK,
    QUEUE_BUCKET,
    QUEUE_PK,
    QUEUE_SK,
    JobState,
    job_item_key,
    queue_order,
)
from gpu_recovery.domain.control_token import new_secret
from gpu_recovery.domain.time_sharing import AUTO_PRIORITY, PRIORITY_VALUES, QuotaBook, resolve_auto_priority
from gpu_recovery.queue.access import Principal, quota_subject
from gpu_recovery.queue.host_access import host_access_refusal
from gpu_recovery.queue.jobs_api.context import SOURCE_QUEUE, JobsApiContext
from gpu_recovery.queue.jobs_api.errors import Conflict, IdempotencyKeyReused, InvalidRequest
from gpu_recovery.queue.jobs_api.reads import job_summary
from gpu_recovery.queue.models import JobSpec, priority_name
from gpu_recovery.repository.jobs_api import SubmitKey

logger = logging.getLogger(__name__)

_SLUG_MAX = 40
# How long an Idempotency-Key names the job it made (the handler's Powertools records too).
IDEMPOTENCY_WINDOW_SECONDS = 24 * 3600


@dataclass(frozen=True)
class Submission:
    """The answer to a submit: the job's summary; ``replayed`` when an earlier request with
    the same Idempotency-Key made the job."""

    job: dict[str, Any]
    replayed: bool = False


def slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower())
    slug = re.sub(r"-{2,}", "-", slug).strip("-")[:_SLUG_MAX].rstrip("-")
    return slug or "job"


def new_job_id(name: str, now: float) -> str:
    """``llama-ft-20261120-143201-7f3a``: readable, sortable by time, unique enough."""
    stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y%m%d-%H%M%S")
    return f"{slugify(name)}-{stamp}-{secrets.token_hex(2)}"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def submit_job(context: JobsApiContext, spec: JobSpec, user: str,
               idempotency_key: str | None = None) -> Submission:
    """Queue ``spec`` for ``user``. With ``idempotency_key``: the job that key of this caller
    made in the last 24 h if there is one (409 when it came with another body)."""
    key = None
    if idempotency_key:
        key = SubmitKey(key=_digest([user, idempotency_key]), request=_digest(spec.model_dump(mode="json")),
                        nonce=secrets.token_hex(16))
        earlier = context.repo.submit_key(key.key, clock.now())
        if earlier is not None:
            return _replay(context, earlier, key)
    caller = Principal.parse(user)
    subject = quota_subject(user)
    context.authorize(lambda a: a.check_family(spec.task_definition))
    book = context.quotas.book() if context.quotas is not None else QuotaBook()
    auto_note = ""
    if spec.is_auto_priority:
        allowed = [lvl for lvl in PRIORITY_VALUES
                   if context.access is None or context.access.may_use_priority(caller, lvl)]
        level, auto_note = resolve_auto_priority(book, subject, spec.nnodes, allowed)
        spec = spec.model_copy(update={"priority": level})
    context.authorize(lambda a: a.check_priority(caller, spec.priority_value,
                                               priority_name(spec.priority_value)))
    network = spec.network
    if network is not None:  # nothing read from AWS nor written before it is allowed
        context.authorize(lambda a: a.check_network(caller, network.subnets, network.security_groups))
    never = book.never_fits(subject, spec.priority_value, spec.nnodes)
    if never:
        raise InvalidRequest(f"nnodes: the job could never start: {never} (ask an administrator "
                             "for a larger quota, or choose another priority)", "nnodes")
    spec = _validate_against_aws(context, spec)
    now = clock.now()
    item: dict[str, Any] = {}
    for _ in range(5):
        job_id = new_job_id(spec.name, now)
        item = _new_item(context, job_id, spec, user, now)
        item["quota_subject"] = subject
        if auto_note:
            item["priority_requested"] = AUTO_PRIORITY
            item["history"][0]["reason"] = f"submitted; {auto_note}"
        if caller.role:
            item["owner_role"] = caller.role
        if key is None:
            if context.repo.create_job(item):
                break
            continue
        held = context.repo.create_keyed_job(
            item, SubmitKey(key.key, key.request, key.nonce, job_id, now + IDEMPOTENCY_WINDOW_SECONDS), now)
        if held is not None and held.nonce != key.nonce:  # the same key's request, meanwhile
            return _replay(context, held, key)
        if held is not None:
            break
    else:  # pragma: no cover - 5 collisions of a 16-bit suffix in the same second
        raise Conflict("could not allocate a unique job id, retry")
    logger.info("job submitted", extra={"job_id": item["job_id"], "user": user})
    context.trigger("submitted", item["job_id"])
    return Submission(job_summary(item))


def _replay(context: JobsApiContext, earlier: SubmitKey, key: SubmitKey) -> Submission:
    """The job ``earlier`` (the caller's key, already used) made, as it is now; a different
    body under the same key is refused as Powertools refuses it (409)."""
    if earlier.request != key.request:
        raise IdempotencyKeyReused()
    item = context.repo.job_item(earlier.job_id)
    if item is None:  # pragma: no cover - written in one transaction with its key, never deleted
        raise Conflict(f"the job {earlier.job_id} of this Idempotency-Key is gone; retry with another key")
    logger.info("job submitted before under this key", extra={"job_id": earlier.job_id})
    if item.get("job_state") == JobState.QUEUED.value:  # the first try may have died before waking it
        context.trigger("submitted", earlier.job_id)
    return Submission(job_summary(item), replayed=True)


def _new_item(context: JobsApiContext, job_id: str, spec: JobSpec, user: str, now: float) -> dict[str, Any]:
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
        **({"network": spec.network.awsvpc()} if spec.network is not None else {}),
        "world_size": spec.nnodes,
        "gpus_per_node": spec.gpus_per_node,
        "attempt": 0,
        "recoveries_used": 0,
        "max_recovery_attempts": spec.budgets(*context.default_budgets)[0],
        "app_restarts_used": 0,
        "max_app_restarts": spec.budgets(*context.default_budgets)[1],
        "suspend_grace_seconds": spec.suspend_grace_seconds or context.suspend_grace_seconds,
        "preflight": spec.preflight or "auto",
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


def _validate_against_aws(context: JobsApiContext, spec: JobSpec) -> JobSpec:
    """Pin the task definition, resolve the container, refuse what could never run."""
    try:
        task_def = context.task_definitions.describe(spec.task_definition)
    except TaskDefinitionNotFound as error:
        raise InvalidRequest(
            f"task_definition: {spec.task_definition} does not exist", "task_definition"
        ) from error
    # The family as ECS resolved it (a revision ARN may name another family's alias).
    context.authorize(lambda a: a.check_family(task_def.get("taskDefinitionArn", spec.task_definition)))
    context.authorize(lambda a: a.check_task_roles(
        [r for r in (task_def.get("taskRoleArn"), task_def.get("executionRoleArn")) if r]))
    reach = host_access_refusal(task_def)
    if reach is not None:
        raise InvalidRequest(
            f"task_definition: {spec.task_definition}: {reach}; a queue job may not reach the host the "
            "stack judges its nodes from (docs/security.md)", "task_definition")
    mode = str(task_def.get("networkMode") or "bridge")
    if mode == "awsvpc" and spec.network is None:
        raise InvalidRequest(
            f"network: task definition {spec.task_definition} uses the awsvpc network mode: ECS needs the "
            "tasks' subnets (and security groups) to start them; give network.subnets and "
            "network.security_groups", "network")
    if mode != "awsvpc" and spec.network is not None:
        raise InvalidRequest(
            f"network: only for task definitions in the awsvpc network mode; {spec.task_definition} uses "
            f"{mode} (ECS refuses a network configuration for it): leave network out", "network")
    containers = task_def.get("containerDefinitions", [])
    names = [c.get("name") for c in containers]
    container_name = spec.container_name or (names[0] if names else None)
    if container_name not in names:
        raise InvalidRequest(
            f"container_name: {container_name} is not a container of {spec.task_definition} "
            f"({', '.join(n for n in names if n) or 'none'})",
            "container_name",
        )
    capacity = context.capacity.capacity()
    if capacity is not None and spec.gpus_per_node > capacity.largest:
        raise InvalidRequest(
            f"gpus_per_node: {spec.gpus_per_node} GPUs per node could never run: the largest "
            f"node of cluster {context.cluster} has {capacity.largest}",
            "gpus_per_node",
        )
    if capacity is not None and spec.nnodes > capacity.nodes_with(spec.gpus_per_node):
        raise InvalidRequest(
            f"nnodes: {spec.nnodes} nodes with {spec.gpus_per_node} GPUs each could never run: "
            f"cluster {context.cluster} has {capacity.nodes_with(spec.gpus_per_node)} such "
            f"node(s) of {len(capacity.gpus_per_node)} registered; add nodes first",
            "nnodes",
        )
    return spec.model_copy(
        update={"task_definition": task_def["taskDefinitionArn"], "container_name": container_name}
    )
