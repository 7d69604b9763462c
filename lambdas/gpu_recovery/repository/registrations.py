"""A rank's registration (``recovery.ranks``): its job and rank items written once, its task
looked up (or remembered as no protected rank's), a job too large to protect refused once.

A task's first event registers it: the job item is created if absent, the rank item written
unless the table already holds this task or a newer attempt (a redelivered or out-of-order
event changes nothing), and a job with a rank that is not relocatable is marked so. The task
index answers which rank a task is, or that DescribeTasks found it unprotected (a negative
record the job table's TTL deletes).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_recovery.constants import (
    JOB_BY_TASK_INDEX,
    JOB_BY_TASK_PK,
    JOB_PK,
    JOB_TABLE_TTL_ATTRIBUTE,
    UNPROTECTED_TASK_TTL_SECONDS,
    job_item_key,
    refused_item_key,
    unprotected_task_key,
)
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import RankState
from gpu_recovery.repository.base import Update, to_ddb
from gpu_recovery.repository.jobs_and_ranks import JobsAndRanks, TaskLookup


class RegistrationRepository:
    """Intents of a rank's registration (``repo.registrations``)."""

    def __init__(self, jobs: JobsAndRanks) -> None:
        self.jobs = jobs
        self.db, self.job_table_name = jobs.db, jobs.job_table_name

    def look_up_task(self, task_arn: str) -> TaskLookup:
        """The task's rank, or its negative record (one index query: both carry the task key)."""
        response = self.db.query_page(
            self.job_table_name,
            IndexName=JOB_BY_TASK_INDEX,
            KeyConditionExpression="#t = :t",
            ExpressionAttributeNames={"#t": JOB_BY_TASK_PK},
            ExpressionAttributeValues={":t": task_arn},
            Limit=3,
        )
        negative = unprotected_task_key(task_arn)
        keys = [str(i[JOB_PK]) for i in response.get("Items", [])]
        for key in keys:
            if key == negative:
                continue
            # The index holds keys only (and is eventually consistent): read the item by key.
            item = self.db.get(self.job_table_name, {JOB_PK: key})
            if item and "rank" in item:
                return TaskLookup(rank=self.jobs.rank_from_item(item))
        return TaskLookup(unprotected=negative in keys)

    def remember_unprotected_task(self, task_arn: str, now: float) -> None:
        """DescribeTasks showed the task is no protected rank: its later events (and
        duplicates) find this record and cost no DescribeTasks. Idempotent; DynamoDB's TTL
        deletes it after ``UNPROTECTED_TASK_TTL_SECONDS``."""
        self.db.put_if_absent(self.job_table_name, to_ddb({
            JOB_PK: unprotected_task_key(task_arn), JOB_BY_TASK_PK: task_arn, "item_type": "UNPROTECTED_TASK",
            "recorded_at": now, JOB_TABLE_TTL_ATTRIBUTE: int(now + UNPROTECTED_TASK_TTL_SECONDS)}), JOB_PK)

    def create_job_if_absent(self, job: Job) -> bool:
        return self.db.put_if_absent(self.job_table_name, self.jobs.job_to_item(job), JOB_PK)

    def put_rank_registration(self, rank: Rank) -> bool:
        """Write a rank unless the table already has this task or a newer attempt."""
        return self.db.put_conditional(
            self.job_table_name,
            self.jobs.rank_to_item(rank),
            # A rank never started may hold only its launch lease (``gang_fanouts``): no attempt.
            "attribute_not_exists(#a) OR (#a < :a) OR (#a = :a AND #t <> :t AND #s IN (:starting))",
            {"#a": "attempt", "#t": JOB_BY_TASK_PK, "#s": "rank_state"},
            {":a": rank.attempt, ":t": rank.task_arn, ":starting": RankState.STARTING.value},
        )

    def mark_refused(self, job_id: str, world_size: int, now: float, also: Sequence[Update] = ()) -> bool:
        """A tagged job too large to protect: True the first time only (operators are told once,
        ``also``: the e-mail owed)."""
        return self.db.transact([Update(
            table=self.job_table_name, key={JOB_PK: refused_item_key(job_id)},
            set_fields={"item_type": "REFUSED", "world_size": world_size, "refused_at": now},
            condition="attribute_not_exists(#k)", condition_names={"#k": JOB_PK}), *also])

    def mark_not_relocatable(self, job_id: str) -> bool:
        """A rank of the job lacks gpu-recovery:relocatable=true: the job is not relocatable."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job_id)},
            set_fields={"relocatable": False}, condition="#r = :t",
            condition_values={":t": True}, condition_names={"#r": "relocatable"}))
