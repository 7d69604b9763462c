"""Persistence of the jobs API (submit, read, list, cancel), in intents.

:class:`~gpu_recovery.queue.jobs_api.service.JobQueueService` never touches DynamoDB itself;
every read and conditional write it needs is a method here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.constants import (
    JOB_PK,
    JOB_TABLE_TTL_ATTRIBUTE,
    QUEUE_PK,
    QUEUE_SK,
    STATE_PK,
    SUBMITTED_SK,
    JobState,
    RankState,
    job_item_key,
)
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.repository import Repository, from_ddb, is_condition_failure, records, to_ddb
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, Update

SUBMIT_KEY_ITEM_TYPE = "SUBMIT_KEY"


def _submit_key_item_key(key: str) -> str:
    """A caller's Idempotency-Key (``key``: the digest of both): upper case, never a job's id."""
    return f"SUBMIT#{key}"


class InvalidPageToken(ValueError):
    """DynamoDB refused the ExclusiveStartKey rebuilt from a page token."""


@dataclass(frozen=True)
class SubmitKey:
    """A caller's Idempotency-Key as kept beside the job it made (written with it, in one
    transaction): ``key`` the digest of the caller and the key, ``request`` the digest of the
    request's body, ``nonce`` the submission's own random value (which submission wrote it),
    ``job_id`` its job; it names the job until ``expires_at``."""

    key: str
    request: str
    nonce: str
    job_id: str = ""
    expires_at: float = 0.0


class JobQueueRepository:
    """Job and rank items of queue jobs on the job table."""

    def __init__(self, base: Repository) -> None:
        self.base = base
        self.tables = base.tables  # the gateway and the update builders
        self._jobs = base.tables._ddb.Table(base.tables.job_table_name)
        # A large gang's stop fan-out, sent once as the recovery sends it (``recovery.fanout_send``).
        self.fanouts = base.fanouts

    # ------------------------------------------------------------------ reads
    def job_item(self, job_id: str) -> dict[str, Any] | None:
        """The job item (not a rank item), strongly consistent."""
        raw = self._jobs.get_item(Key={JOB_PK: job_item_key(job_id)}, ConsistentRead=True).get("Item")
        if not raw or raw.get("item_type", "JOB") != "JOB":
            return None
        return from_ddb(dict(raw))

    def get_rank(self, job_id: str, rank: int) -> Rank | None:
        return self.base.jobs.get_rank(job_id, rank)

    def preflight(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        """The attempt's gang preflight (None: it ran none)."""
        return self.base.preflight.get(job_id, attempt)

    def get_ranks(self, job: Job) -> list[Rank]:
        return self.base.jobs.get_ranks(job)

    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]:
        """Ranks ``first`` to ``last - 1`` (one BatchGetItem per 100)."""
        return self.base.jobs.get_rank_range(job_id, first, last)

    def live_rank_count(self, job: Job) -> int:
        """The job's attempt's ranks registered and not ended (its latch shards: ``ceil(n / 64)``
        items, not its rank items)."""
        return len(self.base.latches.registered_not_ended(job.job_id, job.attempt, job.world_size))

    @staticmethod
    def job_from_item(item: dict[str, Any]) -> Job:
        return records.job_from_item(item)

    def list_page(self, index: str, partition_attr: str, partition_value: str, *,
                  state: str | None, limit: int,
                  start_key: dict[str, Any] | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """One page of job items from a listing index, newest first (never a Scan).

        ``state`` filters on the job state (when the index is not the state index)."""
        kwargs: dict[str, Any] = {
            "IndexName": index,
            "KeyConditionExpression": "#pk = :pk AND #sk > :zero",
            "ExpressionAttributeNames": {"#pk": partition_attr, "#sk": SUBMITTED_SK},
            "ExpressionAttributeValues": {":pk": partition_value, ":zero": 0},
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if state is not None:
            kwargs["FilterExpression"] = "#st = :st"
            kwargs["ExpressionAttributeNames"]["#st"] = STATE_PK
            kwargs["ExpressionAttributeValues"][":st"] = state
        if start_key is not None:
            kwargs["ExclusiveStartKey"] = to_ddb(start_key)
        try:
            response = self._jobs.query(**kwargs)
        except ClientError as error:
            if start_key is not None and error.response.get("Error", {}).get("Code") == "ValidationException":
                raise InvalidPageToken(str(error)) from error
            raise
        return response.get("Items", []), response.get("LastEvaluatedKey")

    def submit_key(self, key: str, now: float) -> SubmitKey | None:
        """The job a caller's Idempotency-Key made (``key``: their digest), strongly
        consistent; None for a key never used, or used longer ago than its window."""
        raw = self.tables.db.get(self.tables.job_table_name, {JOB_PK: _submit_key_item_key(key)})
        if not raw:
            return None
        held = SubmitKey(key=key, request=str(raw.get("request_digest") or ""),
                         nonce=str(raw.get("nonce") or ""), job_id=str(raw.get("job_id") or ""),
                         expires_at=float(raw.get("expires_at") or 0))
        return held if held.expires_at > now else None

    # ----------------------------------------------------------------- writes
    def create_job(self, item: dict[str, Any]) -> bool:
        """Put a new job item; False when its id is another job's. A PutItem that DynamoDB
        carried out but whose answer was lost is sent again by botocore and then refused by
        its own condition: the item found is this one (its ``control_secret``, random and
        made for this item, is the same), so that is True too, not a second job."""
        try:
            self._jobs.put_item(Item=to_ddb(item), ConditionExpression="attribute_not_exists(#k)",
                                ExpressionAttributeNames={"#k": JOB_PK})
            return True
        except ClientError as error:
            if not is_condition_failure(error):
                raise
        return self._written(item)

    def create_keyed_job(self, item: dict[str, Any], key: SubmitKey, now: float) -> SubmitKey | None:
        """The new job item and its Idempotency-Key (``key``, naming the item's job), in one
        transaction: the key is free, or its window has passed. Returns the key as it now
        holds: ``key`` when this submission wrote both (also when the transaction's answer
        was lost and botocore sent it again: the key read back has this ``nonce``), an
        earlier submission's when the caller's key names a job already; None when only the
        job id is another job's (the caller draws another)."""
        table = self.tables.job_table_name
        job = Update(table=table, key={JOB_PK: item[JOB_PK]},
                     set_fields={k: v for k, v in item.items() if k != JOB_PK},
                     condition="attribute_not_exists(#k)", condition_names={"#k": JOB_PK})
        claim = Update(
            table=table, key={JOB_PK: _submit_key_item_key(key.key)},
            set_fields={"item_type": SUBMIT_KEY_ITEM_TYPE, "job_id": key.job_id,
                        "request_digest": key.request, "nonce": key.nonce, "expires_at": key.expires_at,
                        JOB_TABLE_TTL_ATTRIBUTE: int(key.expires_at) + 1},
            condition="attribute_not_exists(#k) OR #exp < :now",
            condition_names={"#k": JOB_PK, "#exp": "expires_at"}, condition_values={":now": now})
        if self.tables.db.transact([job, claim]):
            return key
        return self.submit_key(key.key, now)

    def _written(self, item: dict[str, Any]) -> bool:
        """The job item at ``item``'s key is ``item`` as this caller wrote it (strongly consistent)."""
        found = self._jobs.get_item(Key={JOB_PK: item[JOB_PK]}, ConsistentRead=True,
                                    ProjectionExpression="#s",
                                    ExpressionAttributeNames={"#s": "control_secret"}).get("Item")
        return bool(found) and found.get("control_secret") == item["control_secret"]

    def move_job(self, job_id: str, current: JobState, to: JobState, *, reason: str, actor: str,
                 leave_queue: bool, clear_deadline: bool = False, stop_ranks_of: int | None = None) -> bool:
        """``current`` -> ``to`` exactly as read (any attempt); optionally out of the queue
        index and without a deadline. With ``stop_ranks_of`` (an attempt) the intent to stop
        its live ranks is committed too (the recovery sweep sends it if nobody else does)."""
        remove = [QUEUE_PK, QUEUE_SK] if leave_queue else []
        fields: dict[str, Any] = {}
        if stop_ranks_of is not None:
            now = clock.now()
            fields.update(self.base.jobs.stop_fanout_fields(stop_ranks_of, reason, now))
            fields["stop_fanout"]["remediation"] = False
            fields.update(self.base.jobs.job_deadline_fields(now + 60))
        elif clear_deadline:
            remove += DEADLINE_ATTRIBUTES
        return self.tables.db.apply(self.base.jobs.job_transition(
            job_id, to, from_states=[current], attempt=None, reason=reason, actor=actor,
            set_fields=fields, remove_fields=remove))

    def request_rank_stop(self, rank: Rank, from_states: Iterable[RankState], reason: str) -> bool:
        return self.tables.db.apply(self.base.jobs.rank_update(
            rank, RankState.STOP_REQUESTED, from_states=from_states,
            set_fields={"stop_reason": reason[:300]}))
