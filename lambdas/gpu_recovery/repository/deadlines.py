"""The deadline index (``constants.DEADLINE_INDEX``, sharded): the items whose deadline passed,
read by the sweep a page at a time, and every job item carrying a deadline (the jobs holding
nodes are among them: the queue scheduler's read, and the sweep's first); and a deadline pushed
(a stage or the sweep looks again later) or cleared (nothing is left to do), on the state the
item was read in.

An intent that leaves work for later sets a deadline with its own write
(``RecoveryTables.job_deadline_fields``, ``instance_update(deadline_at=...)``); the sweep
finds it here and finishes the work.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from gpu_recovery.constants import (
    DEADLINE_INDEX,
    DEADLINE_PK,
    DEADLINE_SK,
    JOB_PK,
    job_item_key,
)
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.states import InstanceState, JobState
from gpu_recovery.repository import records
from gpu_recovery.repository.base import (
    DEADLINE_ATTRIBUTES,
    DynamoGateway,
    Update,
    from_ddb,
    to_ddb,
)


class DeadlineTables(Protocol):
    """What the index is built over (``RecoveryTables``, which builds it): the gateway, the two
    tables and their builders of a deadline (the instance's update, the job's fields)."""

    db: DynamoGateway
    job_table_name: str
    instance_table_name: str

    def job_deadline_fields(self, deadline_at: float) -> dict[str, Any]: ...
    def instance_update(self, container_inst_id: str, *, from_states: Iterable[InstanceState] | None = ...,
                        deadline_at: float | None = ..., clear_deadline: bool = ...) -> Update: ...


class DeadlineIndex:
    """The deadline index on both tables: what is due, a deadline pushed or cleared
    (``repo.deadlines``)."""

    def __init__(self, tables: DeadlineTables) -> None:
        self.tables = tables
        self.db, self.job_table = tables.db, tables.job_table_name
        self.instance_table = tables.instance_table_name

    # ==================================================================== writes
    def rearm_job(self, job: Job, deadline_at: float) -> bool:
        """Push a job's deadline (no history entry: nothing happened to the job)."""
        return self.db.apply(Update(
            table=self.job_table, key={JOB_PK: job_item_key(job.job_id)},
            set_fields=self.tables.job_deadline_fields(deadline_at),
            condition="#st = :st AND #att = :att",
            condition_values={":st": job.state.value, ":att": job.attempt},
            condition_names={"#st": "job_state", "#att": "attempt"},
        ))

    def clear_job(self, job_id: str, state: JobState, deadline_at: Any) -> bool:
        """Only the deadline the sweep read: a newer one (a new state) stays."""
        return self.db.apply(Update(
            table=self.job_table, key={JOB_PK: job_item_key(job_id)},
            remove_fields=list(DEADLINE_ATTRIBUTES),
            condition="#st = :st AND #dl = :dl",
            condition_values={":st": state.value, ":dl": deadline_at},
            condition_names={"#st": "job_state", "#dl": DEADLINE_SK},
        ))

    def rearm_instance(self, inst_id: str, state: InstanceState, deadline_at: float) -> bool:
        """Push a node's deadline while it is still in ``state``."""
        update = self.tables.instance_update(inst_id, from_states=[state], deadline_at=deadline_at)
        return self.db.apply(update)

    def clear_instance(self, inst_id: str, state: InstanceState) -> bool:
        """Nothing left for the sweep on the node while it is still in ``state``."""
        return self.db.apply(self.tables.instance_update(inst_id, from_states=[state], clear_deadline=True))

    # ===================================================================== reads
    def due_instances(self, now: float, limit: int | None = None) -> list[Instance]:
        return [records.instance_from_item(i) for i in self._due(self.instance_table, now, limit)]

    def due_job_items(self, now: float, limit: int | None = None) -> list[dict[str, Any]]:
        return [from_ddb(dict(i)) for i in self._due(self.job_table, now, limit)]

    def job_items(self) -> list[dict[str, Any]]:
        """Every item of the job table that carries a deadline, due or not, every shard of the
        index, as stored: the jobs holding nodes are among them, and the sweep knows from
        the same read whether any job item is due."""
        return [item for bucket in self.db.deadline_buckets() for item in self.db.query_all(
            self.job_table, IndexName=DEADLINE_INDEX, KeyConditionExpression="#p = :v",
            ExpressionAttributeNames={"#p": DEADLINE_PK}, ExpressionAttributeValues={":v": bucket})]

    def due_instance_pages(self, now: float, page: int) -> Iterator[list[Instance]]:
        """:meth:`due_instances` a page at a time, read as the caller asks for the next."""
        for items in self._due_pages(self.instance_table, now, page):
            yield [records.instance_from_item(i) for i in items]

    def due_job_item_pages(self, now: float, page: int) -> Iterator[list[dict[str, Any]]]:
        for items in self._due_pages(self.job_table, now, page):
            yield [from_ddb(dict(i)) for i in items]

    def _due_queries(self, now: float) -> list[dict[str, Any]]:
        """One Query per shard of the index (constants.DEADLINE_SHARDS_MAX), the shard the
        minute names first."""
        return [dict(
            IndexName=DEADLINE_INDEX,
            KeyConditionExpression="#b = :b AND #d <= :now",
            ExpressionAttributeNames={"#b": DEADLINE_PK, "#d": DEADLINE_SK},
            ExpressionAttributeValues={":b": bucket, ":now": to_ddb(float(now))},
        ) for bucket in self.db.deadline_buckets(rotate=int(now // 60))]

    def _due(self, table: str, now: float, limit: int | None) -> list[dict[str, Any]]:
        """Items whose deadline passed, oldest first (at most ``limit``: one page a shard)."""
        if limit is None:
            items = [i for q in self._due_queries(now) for i in self.db.query_all(table, **q)]
        else:
            items = [i for q in self._due_queries(now)
                     for i in self.db.query_page(table, Limit=limit, **q).get("Items", [])]
        if self.db.deadline_shards > 1:
            items.sort(key=lambda i: i[DEADLINE_SK])
        return items if limit is None else items[:limit]

    def _due_pages(self, table: str, now: float, page: int) -> Iterator[list[dict[str, Any]]]:
        """Pages from where the last one ended (an item handled meanwhile moved to a later
        deadline; one whose step failed keeps its place, before the next page: neither is
        read twice in one pass), shard after shard; an empty page is handed over only when
        nothing at all is due (the reader knows it read)."""
        handed = False
        for kwargs in self._due_queries(now):
            while True:
                response = self.db.query_page(table, Limit=page, **kwargs)
                if response.get("Items"):
                    handed = True
                    yield list(response["Items"])
                if "LastEvaluatedKey" not in response:
                    break
                kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        if not handed:
            yield []
