"""Persistence of the jobs API (submit, read, list, cancel), in intents.

:class:`~gpu_recovery.queue.jobs_api.service.JobQueueService` never touches DynamoDB itself;
every read and conditional write it needs is a method here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.constants import (
    JOB_PK,
    QUEUE_PK,
    QUEUE_SK,
    STATE_PK,
    SUBMITTED_SK,
    JobState,
    RankState,
    job_item_key,
)
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.repository import Repository, from_ddb, is_condition_failure, to_ddb
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES


class InvalidPageToken(ValueError):
    """DynamoDB refused the ExclusiveStartKey rebuilt from a page token."""


class JobQueueRepository:
    """Job and rank items of queue jobs on the job table."""

    def __init__(self, base: Repository) -> None:
        self.base = base
        self._jobs = base._ddb.Table(base.job_table_name)
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
        return self.base.get_rank(job_id, rank)

    def preflight(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        """The attempt's gang preflight (None: it ran none)."""
        return self.base.preflight.get(job_id, attempt)

    def get_ranks(self, job: Job) -> list[Rank]:
        return self.base.get_ranks(job)

    @staticmethod
    def job_from_item(item: dict[str, Any]) -> Job:
        return Repository.job_from_item(item)

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

    # ----------------------------------------------------------------- writes
    def create_job(self, item: dict[str, Any]) -> bool:
        """Put a new job item; False when its id is taken."""
        try:
            self._jobs.put_item(Item=to_ddb(item), ConditionExpression="attribute_not_exists(#k)",
                                ExpressionAttributeNames={"#k": JOB_PK})
            return True
        except ClientError as error:
            if is_condition_failure(error):
                return False
            raise

    def move_job(self, job_id: str, current: JobState, to: JobState, *, reason: str, actor: str,
                 leave_queue: bool, clear_deadline: bool = False, stop_ranks_of: int | None = None) -> bool:
        """``current`` -> ``to`` exactly as read (any attempt); optionally out of the queue
        index and without a deadline. With ``stop_ranks_of`` (an attempt) the intent to stop
        its live ranks is committed too (the recovery sweep sends it if nobody else does)."""
        remove = [QUEUE_PK, QUEUE_SK] if leave_queue else []
        fields: dict[str, Any] = {}
        if stop_ranks_of is not None:
            now = clock.now()
            fields.update(self.base.stop_fanout_fields(stop_ranks_of, reason, now))
            fields["stop_fanout"]["remediation"] = False
            fields.update(self.base.job_deadline_fields(now + 60))
        elif clear_deadline:
            remove += DEADLINE_ATTRIBUTES
        return self.base.db.apply(self.base.job_transition(
            job_id, to, from_states=[current], attempt=None, reason=reason, actor=actor,
            set_fields=fields, remove_fields=remove))

    def request_rank_stop(self, rank: Rank, from_states: Iterable[RankState], reason: str) -> bool:
        return self.base.db.apply(self.base.rank_update(
            rank, RankState.STOP_REQUESTED, from_states=from_states,
            set_fields={"stop_reason": reason[:300]}))
