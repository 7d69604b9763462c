"""Reading jobs: one job with its ranks and attempts, a page of jobs (newest first, from
an index, never a Scan; opaque page tokens) and a job's state transitions."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    JOB_BY_STATE_INDEX,
    JOB_BY_USER_INDEX,
    JOB_LIST_INDEX,
    JOB_PK,
    LIST_BUCKET,
    LIST_PK,
    STATE_PK,
    SUBMITTED_SK,
    USER_PK,
    JobState,
)
from gpu_recovery.domain.goodput import ledger_of
from gpu_recovery.domain.models import Job, container_instance_id
from gpu_recovery.domain.states import QUEUED_JOB_STATES
from gpu_recovery.queue.access import Principal, quota_subject
from gpu_recovery.queue.attempts import attempt_records
from gpu_recovery.queue.jobs_api.context import JobsApiContext
from gpu_recovery.queue.jobs_api.errors import InvalidRequest
from gpu_recovery.queue.models import priority_name
from gpu_recovery.repository import from_ddb
from gpu_recovery.repository.jobs_api import InvalidPageToken

QUEUED_STATES = QUEUED_JOB_STATES
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# A job's ranks, a page at a time: a read of a large job reads a page of its rank items, not all.
DEFAULT_RANKS = 100
MAX_RANKS = 1000


def get_job(context: JobsApiContext, job_id: str, user: str | None = None, *, ranks_from: int = 0,
            ranks_limit: int = DEFAULT_RANKS) -> dict[str, Any]:
    """The job with a page of its ranks (``ranks_from`` up to ``ranks_limit`` of them): when more
    follow, ``ranks_next`` says where, and ``ranks_live`` counts the attempt's ranks started and
    not ended (from its latch shards, never every rank item)."""
    if ranks_from < 0:
        raise InvalidRequest("ranks_from: must be 0 or more", "ranks_from")
    if not 1 <= ranks_limit <= MAX_RANKS:
        raise InvalidRequest(f"ranks_limit: must be between 1 and {MAX_RANKS}", "ranks_limit")
    item = context.readable(job_id, user)
    job = context.repo.job_from_item(item)
    last = min(job.world_size, ranks_from + ranks_limit)
    ranks = context.repo.get_rank_range(job_id, ranks_from, last) if last > ranks_from else []
    whole = ranks_from == 0 and last >= job.world_size
    out = job_summary(item)
    out.update(
        {
            "spec": json.loads(item.get("spec_json") or "{}"),
            "source": item.get("source", ""),
            "recoveries_used": int(item.get("recoveries_used", 0)),
            "max_recovery_attempts": int(item.get("max_recovery_attempts", 0)),
            "app_restarts_used": int(item.get("app_restarts_used", 0)),
            "max_app_restarts": int(item.get("max_app_restarts", 0)),
            "relocations": list(item.get("relocations") or []),
            "moves": list(item.get("moves") or []),
            "breaker_hold": dict(item.get("breaker_hold") or {}) if job.state is JobState.HELD else None,
            "not_before": item.get("not_before", 0) or 0,
            "last_error": item.get("last_error", ""),
            "wait_reason": _wait_reason(item, job),
            "quota_user": str(item.get("quota_subject") or quota_subject(str(item.get("user") or ""))),
            "priority_requested": str(item.get("priority_requested") or ""),
            "demoted_from": item.get("demoted_from"),
            "suspend_grace_seconds": int(item.get("suspend_grace_seconds") or context.suspend_grace_seconds),
            "suspend": _suspend_view(item.get("suspend")),
            "preflight": _preflight_view(context, item),
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
            "ranks_next": None if last >= job.world_size else last,
            "ranks_live": None if whole else context.repo.live_rank_count(job),
            "attempts": [_attempt(a) for a in attempt_records(item.get("attempts") or [],
                                                              item.get("history") or [],
                                                              int(item.get("attempt") or 0))],
        }
    )
    return out


def goodput_view(item: Mapping[str, Any]) -> dict[str, Any]:
    """The job's goodput ledger up to now (``domain.goodput``) and its last checkpoint."""
    plain = from_ddb(dict(item))
    checkpoint = plain.get("checkpoint")
    return {**ledger_of(plain, clock.now()).to_view(),
            "checkpoint": dict(checkpoint) if isinstance(checkpoint, Mapping) else None}


def _wait_reason(item: Mapping[str, Any], job: Job) -> str:
    """Why the job does not run yet: the queue's reason while queued; while its restart
    waits, for its nodes to be free (a placement race) or for a healthy node to relocate to."""
    if job.state in QUEUED_STATES:
        return str(item.get("wait_reason", ""))
    if job.restart_wait is not None and job.state in (JobState.PENDING_RESTART, JobState.STARTING):
        return job.restart_wait.waiting_reason()
    if job.relocation_wait is not None and job.state is JobState.PENDING_RESTART:
        return job.relocation_wait.waiting_reason()
    return ""


def job_summary(item: Mapping[str, Any]) -> dict[str, Any]:
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
        # Computed from the item the listing index already returned (its projection is ALL).
        "goodput": goodput_view(item),
    }


def list_jobs(
    context: JobsApiContext,
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
    if caller is not None and context.access is not None:
        principal = Principal.parse(caller)
        context.authorize(lambda a: a.check_list(principal, user))
        if user is None and not context.access.is_admin(principal):
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
        start_key = _start_key(token["k"], pk_attr, pk_value)
    items: list[dict[str, Any]] = []
    last_key: dict[str, Any] | None = None
    while True:
        page_limit = limit - len(items) if not filter_state else max(limit, 25)
        try:
            page, last_key = context.repo.list_page(index, pk_attr, pk_value, state=filter_state,
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
        "jobs": [job_summary(i) for i in items],
        "next_token": encode_token({"q": scope, "k": last_key}) if last_key else None,
    }


def job_events(context: JobsApiContext, job_id: str, user: str | None = None) -> dict[str, Any]:
    item = context.readable(job_id, user)
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


def _suspend_view(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping) or not raw:
        return None
    keys = ("kind", "reason", "requested_at", "deadline_at", "grace_seconds", "hold", "by_job", "by_user",
            "stop_requested_at", "stop_reason", "avoid")
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


def _start_key(key: Mapping[str, Any], index_pk: str, pk_value: str) -> dict[str, Any]:
    """A token's key, as ``_index_key`` wrote it: a crafted one (a NaN, 1e200, a list) is a 400
    here, not an error of the DynamoDB serializer's (a 500)."""
    when = key.get(SUBMITTED_SK)
    if set(key) != {JOB_PK, index_pk, SUBMITTED_SK} or key[index_pk] != pk_value \
            or not isinstance(key[JOB_PK], str) or not 0 < len(key[JOB_PK]) <= 1024 \
            or isinstance(when, bool) or not isinstance(when, (int, float)) \
            or not math.isfinite(when) or not 0 <= when < 1e12:
        raise InvalidRequest("next_token: is not a token this API returned", "next_token")
    return dict(key)


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


def _preflight_view(context: JobsApiContext, item: dict[str, Any]) -> dict[str, Any]:
    """The job's preflight choice, and the current attempt's preflight if it ran one."""
    view: dict[str, Any] = {"mode": str(item.get("preflight") or "auto")}
    attempt = int(item.get("attempt") or 0)
    found = context.repo.preflight(str(item["job_id"]), attempt) if attempt else None
    if found:
        pinned = [{k: p.get(k) for k in ("rank", "node", "reason", "peer_node") if p.get(k) is not None}
                  for p in found.get("pinned") or ()]
        view.update(attempt=attempt, status=str(found.get("status") or ""),
                    round=int(found.get("round") or 0), verdict=str(found.get("verdict") or ""),
                    summary=list(found.get("summary") or [])[-12:], pinned=pinned)
    return view

