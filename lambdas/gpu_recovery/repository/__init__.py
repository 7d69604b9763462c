"""DynamoDB repository for jobs, ranks and container instances.

Every state change is a conditional write (or a transaction of them): duplicated,
reordered and concurrent events race on the condition and exactly one wins. Reads
use keys or indexes only: never a Scan.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.constants import (
    DEADLINE_BUCKET,
    DEADLINE_INDEX,
    DEADLINE_PK,
    DEADLINE_SK,
    HB_PK,
    INSTANCE_PK,
    JOB_BY_INSTANCE_INDEX,
    JOB_BY_INSTANCE_PK,
    JOB_BY_TASK_INDEX,
    JOB_BY_TASK_PK,
    JOB_PK,
    InstanceState,
    JobState,
    RankState,
    job_item_key,
    rank_item_key,
)
from gpu_recovery.domain.models import Instance, Job, Rank

logger = logging.getLogger(__name__)

MAX_HISTORY = 200  # bounded so a flapping job can never outgrow the 400 KB item limit
_BATCH_GET_LIMIT = 100


# ----------------------------------------------------------------------------- values
def to_ddb(value: Any) -> Any:
    """Python -> DynamoDB resource types (floats become Decimal)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, Mapping):
        return {k: to_ddb(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_ddb(v) for v in value]
    return value


def from_ddb(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Mapping):
        return {k: from_ddb(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_ddb(v) for v in value]
    if isinstance(value, set):
        return {from_ddb(v) for v in value}
    return value


def _is_condition_failure(error: ClientError) -> bool:
    code = error.response.get("Error", {}).get("Code", "")
    if code == "ConditionalCheckFailedException":
        return True
    if code == "TransactionCanceledException":
        reasons = error.response.get("CancellationReasons") or []
        message = error.response.get("Error", {}).get("Message", "")
        return any(r.get("Code") == "ConditionalCheckFailed" for r in reasons) or (
            "ConditionalCheckFailed" in message
        )
    return False


# ------------------------------------------------------------------------- updates
@dataclass
class Update:
    """A conditional UpdateItem, usable alone or inside a transaction."""

    table: str
    key: dict[str, Any]
    set_fields: dict[str, Any] = field(default_factory=dict)
    add_to_sets: dict[str, set[str]] = field(default_factory=dict)
    delete_from_sets: dict[str, set[str]] = field(default_factory=dict)
    remove_fields: list[str] = field(default_factory=list)
    increments: dict[str, int] = field(default_factory=dict)
    history_entry: dict[str, Any] | None = None
    condition: str | None = None
    condition_values: dict[str, Any] = field(default_factory=dict)
    condition_names: dict[str, str] = field(default_factory=dict)

    def expression(self) -> dict[str, Any]:
        names: dict[str, str] = dict(self.condition_names)
        values: dict[str, Any] = {k: to_ddb(v) for k, v in self.condition_values.items()}
        sets, adds, deletes, removes = [], [], [], []

        def name(attr: str) -> str:
            # Nested map paths ("suspects.i-1") become "#n0.#n1".
            parts = []
            for part in attr.split("."):
                placeholder = f"#f{len(names)}"
                names[placeholder] = part
                parts.append(placeholder)
            return ".".join(parts)

        for i, (attr, value) in enumerate(self.set_fields.items()):
            values[f":s{i}"] = to_ddb(value)
            sets.append(f"{name(attr)} = :s{i}")
        for i, (attr, amount) in enumerate(self.increments.items()):
            values[f":inc{i}"] = amount
            values[":zero"] = 0
            n = name(attr)
            sets.append(f"{n} = if_not_exists({n}, :zero) + :inc{i}")
        if self.history_entry is not None:
            values[":hist"] = [to_ddb(self.history_entry)]
            values[":empty"] = []
            n = name("history")
            sets.append(f"{n} = list_append(if_not_exists({n}, :empty), :hist)")
        for i, (attr, members) in enumerate(self.add_to_sets.items()):
            if members:
                values[f":a{i}"] = set(members)
                adds.append(f"{name(attr)} :a{i}")
        for i, (attr, members) in enumerate(self.delete_from_sets.items()):
            if members:
                values[f":d{i}"] = set(members)
                deletes.append(f"{name(attr)} :d{i}")
        removes = [name(attr) for attr in self.remove_fields]
        clauses = []
        if sets:
            clauses.append("SET " + ", ".join(sets))
        if adds:
            clauses.append("ADD " + ", ".join(adds))
        if deletes:
            clauses.append("DELETE " + ", ".join(deletes))
        if removes:
            clauses.append("REMOVE " + ", ".join(removes))
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": self.key,
            "UpdateExpression": " ".join(clauses),
            "ExpressionAttributeNames": names,
        }
        if values:
            params["ExpressionAttributeValues"] = values
        if self.condition:
            params["ConditionExpression"] = self.condition
        return params


def state_condition(
    attr: str, allowed: Iterable[str], prefix: str, extra: str | None = None
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """``#attr IN (:p0, :p1)`` plus its values, for an Update's condition."""
    allowed = list(allowed)
    placeholders = [f":{prefix}{i}" for i in range(len(allowed))]
    names = {f"#{prefix}": attr}
    condition = f"#{prefix} IN ({', '.join(placeholders)})"
    if extra:
        condition = f"({condition}) AND ({extra})"
    return condition, dict(zip(placeholders, allowed, strict=True)), names


class Repository:
    """Persistence of the recovery loop's records."""

    def __init__(self, dynamodb: Any, job_table: str, instance_table: str) -> None:
        self._ddb = dynamodb  # boto3 DynamoDB *resource*
        self._client = dynamodb.meta.client  # type-transforming client (transactions)
        self.job_table_name = job_table
        self.instance_table_name = instance_table
        self._jobs = dynamodb.Table(job_table)
        self._instances = dynamodb.Table(instance_table)

    # ------------------------------------------------------------------ mapping
    @staticmethod
    def job_from_item(item: Mapping[str, Any]) -> Job:
        item = from_ddb(dict(item))
        return Job(
            job_id=item["job_id"],
            state=JobState(item["job_state"]),
            world_size=int(item["world_size"]),
            attempt=int(item.get("attempt", 1)),
            recoveries_used=int(item.get("recoveries_used", 0)),
            max_recovery_attempts=int(item.get("max_recovery_attempts", 1)),
            suspects=dict(item.get("suspects", {})),
            fault_started_at=item.get("fault_started_at"),
            last_error=item.get("last_error", ""),
            verdicts=dict(item.get("verdicts", {})),
            created_at=item.get("created_at", 0.0),
            updated_at=item.get("updated_at", 0.0),
            source=item.get("source", "ecs-tags"),
        )

    @staticmethod
    def job_to_item(job: Job) -> dict[str, Any]:
        return to_ddb(
            {
                JOB_PK: job_item_key(job.job_id),
                "item_type": "JOB",
                "job_id": job.job_id,
                "job_state": job.state.value,
                "world_size": job.world_size,
                "attempt": job.attempt,
                "recoveries_used": job.recoveries_used,
                "max_recovery_attempts": job.max_recovery_attempts,
                "suspects": job.suspects,
                "verdicts": job.verdicts,
                "last_error": job.last_error,
                "created_at": job.created_at,
                "updated_at": job.updated_at,
                "source": job.source,
            }
        )

    @staticmethod
    def rank_from_item(item: Mapping[str, Any]) -> Rank:
        item = from_ddb(dict(item))
        return Rank(
            job_id=item["job_id"],
            rank=int(item["rank"]),
            state=RankState(item["rank_state"]),
            attempt=int(item.get("attempt", 1)),
            task_arn=item.get(JOB_BY_TASK_PK, ""),
            task_definition_arn=item.get("task_definition_arn", ""),
            container_inst_id=item.get("container_inst_id", ""),
            container_instance_arn=item.get("container_instance_arn", ""),
            ec2_instance_id=item.get("ec2_instance_id", ""),
            overrides=json.loads(item.get("overrides_json") or "{}"),
            tags=json.loads(item.get("tags_json") or "[]"),
            group=item.get("group", ""),
            started_by=item.get("started_by", ""),
            exit_code=item.get("exit_code"),
            stop_reason=item.get("stop_reason", ""),
            last_heartbeat_at=item.get("last_heartbeat_at"),
            registered_at=item.get("registered_at", 0.0),
        )

    @staticmethod
    def rank_to_item(rank: Rank) -> dict[str, Any]:
        item: dict[str, Any] = {
            JOB_PK: rank_item_key(rank.job_id, rank.rank),
            "item_type": "RANK",
            "job_id": rank.job_id,
            "rank": rank.rank,
            "rank_state": rank.state.value,
            "attempt": rank.attempt,
            JOB_BY_TASK_PK: rank.task_arn,
            "task_definition_arn": rank.task_definition_arn,
            "container_inst_id": rank.container_inst_id,
            "container_instance_arn": rank.container_instance_arn,
            "ec2_instance_id": rank.ec2_instance_id,
            # Overrides and tags are kept verbatim as JSON: they are replayed as-is on
            # restart, and stopped tasks vanish from ECS after about an hour.
            "overrides_json": json.dumps(rank.overrides, sort_keys=True),
            "tags_json": json.dumps(rank.tags, sort_keys=True),
            "group": rank.group,
            "started_by": rank.started_by,
            "registered_at": rank.registered_at,
        }
        if rank.is_live and rank.container_inst_id:
            item[JOB_BY_INSTANCE_PK] = rank.container_inst_id
        if rank.exit_code is not None:
            item["exit_code"] = rank.exit_code
        if rank.last_heartbeat_at is not None:
            item["last_heartbeat_at"] = rank.last_heartbeat_at
        return to_ddb({k: v for k, v in item.items() if v != ""})

    @staticmethod
    def instance_from_item(item: Mapping[str, Any]) -> Instance:
        item = from_ddb(dict(item))
        return Instance(
            container_inst_id=item[INSTANCE_PK],
            state=InstanceState(item.get("instance_state", InstanceState.AVAILABLE.value)),
            container_instance_arn=item.get("container_instance_arn", ""),
            ec2_instance_id=item.get("ec2_instance_id", ""),
            hc_jobs=set(item.get("hc_jobs", set())),
            hc_task_arn=item.get("hc_task_arn", ""),
            hc_started_by=item.get("hc_started_by", ""),
            hc_start_attempts=int(item.get("hc_start_attempts", 0)),
            hc_requested_at=item.get("hc_requested_at"),
            reboot_requested_at=item.get("reboot_requested_at"),
            reboot_issued_at=item.get("reboot_issued_at"),
            seen_disconnected_after_reboot=bool(item.get("seen_disconnected_after_reboot", False)),
            boot_time=item.get("boot_time"),
            waiting_jobs=set(item.get("waiting_jobs", set())),
            deadline_at=item.get(DEADLINE_SK),
            last_verdict=dict(item.get("last_verdict", {})),
            quarantine_reason=item.get("quarantine_reason", ""),
        )

    # -------------------------------------------------------------------- reads
    def get_job(self, job_id: str) -> Job | None:
        item = self._jobs.get_item(Key={JOB_PK: job_item_key(job_id)}, ConsistentRead=True).get(
            "Item"
        )
        return self.job_from_item(item) if item else None

    def get_rank(self, job_id: str, rank: int) -> Rank | None:
        item = self._jobs.get_item(
            Key={JOB_PK: rank_item_key(job_id, rank)}, ConsistentRead=True
        ).get("Item")
        return self.rank_from_item(item) if item else None

    def get_ranks(self, job: Job) -> list[Rank]:
        """All rank items of a job, strongly consistent, by key (world_size items)."""
        keys = [{JOB_PK: rank_item_key(job.job_id, r)} for r in range(job.world_size)]
        items = self._batch_get(self.job_table_name, keys)
        ranks = [self.rank_from_item(i) for i in items]
        return sorted(ranks, key=lambda r: r.rank)

    def find_rank_by_task(self, task_arn: str) -> Rank | None:
        response = self._jobs.query(
            IndexName=JOB_BY_TASK_INDEX,
            KeyConditionExpression="#t = :t",
            ExpressionAttributeNames={"#t": JOB_BY_TASK_PK},
            ExpressionAttributeValues={":t": task_arn},
            Limit=2,
        )
        items = response.get("Items", [])
        if not items:
            return None
        # The index holds keys only (and is eventually consistent): read the item by key.
        item = self._jobs.get_item(Key={JOB_PK: items[0][JOB_PK]}, ConsistentRead=True).get("Item")
        return self.rank_from_item(item) if item and "rank" in item else None

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]:
        """Ranks still holding GPUs on an instance (sparse index: history is never read)."""
        response = self._jobs.query(
            IndexName=JOB_BY_INSTANCE_INDEX,
            KeyConditionExpression="#i = :i",
            ExpressionAttributeNames={"#i": JOB_BY_INSTANCE_PK},
            ExpressionAttributeValues={":i": container_inst_id},
        )
        return [self.rank_from_item(i) for i in response.get("Items", [])]

    def get_instance(self, container_inst_id: str) -> Instance | None:
        item = self._instances.get_item(
            Key={INSTANCE_PK: container_inst_id}, ConsistentRead=True
        ).get("Item")
        return self.instance_from_item(item) if item else None

    def get_instances(self, ids: Iterable[str]) -> dict[str, Instance]:
        keys = [{INSTANCE_PK: i} for i in sorted(set(ids))]
        items = self._batch_get(self.instance_table_name, keys)
        found = (self.instance_from_item(i) for i in items)
        return {inst.container_inst_id: inst for inst in found}

    def due_instances(self, now: float) -> list[Instance]:
        return [self.instance_from_item(i) for i in self._due(self._instances, now)]

    def due_job_items(self, now: float) -> list[dict[str, Any]]:
        return [from_ddb(dict(i)) for i in self._due(self._jobs, now)]

    def _due(self, table: Any, now: float) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "IndexName": DEADLINE_INDEX,
            "KeyConditionExpression": "#b = :b AND #d <= :now",
            "ExpressionAttributeNames": {"#b": DEADLINE_PK, "#d": DEADLINE_SK},
            "ExpressionAttributeValues": {":b": DEADLINE_BUCKET, ":now": to_ddb(float(now))},
        }
        while True:
            response = table.query(**kwargs)
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return items
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _batch_get(self, table: str, keys: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for start in range(0, len(keys), _BATCH_GET_LIMIT):
            pending: dict[str, Any] = {
                table: {"Keys": list(keys[start : start + _BATCH_GET_LIMIT]), "ConsistentRead": True}
            }
            for _ in range(8):
                response = self._client.batch_get_item(RequestItems=pending)
                items.extend(response.get("Responses", {}).get(table, []))
                pending = response.get("UnprocessedKeys") or {}
                if not pending:
                    break
            else:
                raise RuntimeError(f"BatchGetItem left keys unprocessed on {table}")
        return items

    # ------------------------------------------------------------------- writes
    def create_job_if_absent(self, job: Job) -> bool:
        try:
            self._jobs.put_item(
                Item=self.job_to_item(job),
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": JOB_PK},
            )
            return True
        except ClientError as error:
            if _is_condition_failure(error):
                return False
            raise

    def put_rank_registration(self, rank: Rank) -> bool:
        """Write a rank unless the table already has this task or a newer attempt."""
        item = self.rank_to_item(rank)
        try:
            self._jobs.put_item(
                Item=item,
                ConditionExpression=(
                    "attribute_not_exists(#k) OR (#a < :a) OR "
                    "(#a = :a AND #t <> :t AND #s IN (:starting))"
                ),
                ExpressionAttributeNames={
                    "#k": JOB_PK,
                    "#a": "attempt",
                    "#t": JOB_BY_TASK_PK,
                    "#s": "rank_state",
                },
                ExpressionAttributeValues={
                    ":a": rank.attempt,
                    ":t": rank.task_arn,
                    ":starting": RankState.STARTING.value,
                },
            )
            return True
        except ClientError as error:
            if _is_condition_failure(error):
                return False
            raise

    def put_instance_if_absent(self, instance: Instance) -> bool:
        item = to_ddb(
            {
                INSTANCE_PK: instance.container_inst_id,
                "instance_state": instance.state.value,
                "container_instance_arn": instance.container_instance_arn,
                "ec2_instance_id": instance.ec2_instance_id,
                "registered_at": clock.now(),
            }
        )
        item = {k: v for k, v in item.items() if v != ""}
        try:
            self._instances.put_item(
                Item=item,
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": INSTANCE_PK},
            )
            return True
        except ClientError as error:
            if _is_condition_failure(error):
                return False
            raise

    def apply(self, update: Update) -> bool:
        """Run one conditional update; False when its condition did not hold."""
        try:
            self._client.update_item(**update.expression())
            return True
        except ClientError as error:
            if _is_condition_failure(error):
                return False
            raise

    def apply_returning(self, update: Update) -> dict[str, Any] | None:
        """Like :meth:`apply`, returning the item as written (None when the condition failed)."""
        try:
            response = self._client.update_item(**update.expression(), ReturnValues="ALL_NEW")
            return from_ddb(dict(response.get("Attributes", {})))
        except ClientError as error:
            if _is_condition_failure(error):
                return None
            raise

    def transact(self, updates: Sequence[Update]) -> bool:
        """All or nothing: no state is ever half-written across items."""
        if len(updates) == 1:
            return self.apply(updates[0])
        try:
            self._client.transact_write_items(
                TransactItems=[{"Update": u.expression()} for u in updates]
            )
            return True
        except ClientError as error:
            if _is_condition_failure(error):
                return False
            raise

    # ------------------------------------------------------------ update makers
    def job_transition(
        self,
        job_id: str,
        to: JobState,
        *,
        from_states: Iterable[JobState],
        attempt: int | None,
        reason: str,
        actor: str,
        set_fields: dict[str, Any] | None = None,
        increments: dict[str, int] | None = None,
        remove_fields: list[str] | None = None,
        extra_condition: str | None = None,
        extra_values: dict[str, Any] | None = None,
        extra_names: dict[str, str] | None = None,
    ) -> Update:
        states = [s.value for s in from_states]
        extra = "#att = :att" if attempt is not None else None
        if extra_condition:
            extra = f"({extra}) AND ({extra_condition})" if extra else extra_condition
        condition, values, names = state_condition("job_state", states, "js", extra)
        if attempt is not None:
            values[":att"] = attempt
            names["#att"] = "attempt"
        values.update(extra_values or {})
        names.update(extra_names or {})
        now = clock.now()
        fields = {"job_state": to.value, "updated_at": now, **(set_fields or {})}
        return Update(
            table=self.job_table_name,
            key={JOB_PK: job_item_key(job_id)},
            set_fields=fields,
            increments=increments or {},
            remove_fields=remove_fields or [],
            history_entry={"at": now, "to": to.value, "reason": reason[:500], "actor": actor,
                           "from": "|".join(states)},
            condition=condition,
            condition_values=values,
            condition_names=names,
        )

    def rank_update(
        self,
        rank: Rank,
        to: RankState,
        *,
        from_states: Iterable[RankState],
        set_fields: dict[str, Any] | None = None,
    ) -> Update:
        """Move one rank; the task ARN in the condition ignores stale attempts."""
        condition, values, names = state_condition(
            "rank_state", [s.value for s in from_states], "rs", "#task = :task"
        )
        values[":task"] = rank.task_arn
        names["#task"] = JOB_BY_TASK_PK
        remove = [] if to in (RankState.STARTING, RankState.RUNNING, RankState.NODE_LOST,
                              RankState.HUNG, RankState.STOP_REQUESTED) else [JOB_BY_INSTANCE_PK]
        if to not in (RankState.RUNNING, RankState.NODE_LOST, RankState.HUNG):
            remove.append(HB_PK)  # leave the sparse heartbeat index: only watched ranks stay
        return Update(
            table=self.job_table_name,
            key={JOB_PK: rank_item_key(rank.job_id, rank.rank)},
            set_fields={"rank_state": to.value, "updated_at": clock.now(), **(set_fields or {})},
            remove_fields=remove,
            condition=condition,
            condition_values=values,
            condition_names=names,
        )

    def instance_update(
        self,
        container_inst_id: str,
        *,
        from_states: Iterable[InstanceState] | None = None,
        to: InstanceState | None = None,
        set_fields: dict[str, Any] | None = None,
        add_to_sets: dict[str, set[str]] | None = None,
        delete_from_sets: dict[str, set[str]] | None = None,
        remove_fields: list[str] | None = None,
        increments: dict[str, int] | None = None,
        deadline_at: float | None = None,
        clear_deadline: bool = False,
        extra_condition: str | None = None,
        extra_values: dict[str, Any] | None = None,
        extra_names: dict[str, str] | None = None,
        allow_missing: bool = False,
    ) -> Update:
        fields = dict(set_fields or {})
        remove = list(remove_fields or [])
        if to is not None:
            fields["instance_state"] = to.value
        fields["updated_at"] = clock.now()
        if deadline_at is not None:
            fields[DEADLINE_PK] = DEADLINE_BUCKET
            fields[DEADLINE_SK] = deadline_at
        elif clear_deadline:
            remove += [DEADLINE_PK, DEADLINE_SK]
        condition = None
        values: dict[str, Any] = {}
        names: dict[str, str] = {}
        if from_states is not None:
            states = [s.value for s in from_states]
            condition, values, names = state_condition("instance_state", states, "is", extra_condition)
            if allow_missing:
                names["#ik"] = INSTANCE_PK
                condition = f"attribute_not_exists(#ik) OR ({condition})"
        elif extra_condition:
            condition = extra_condition
        values.update(extra_values or {})
        names.update(extra_names or {})
        return Update(
            table=self.instance_table_name,
            key={INSTANCE_PK: container_inst_id},
            set_fields=fields,
            add_to_sets=add_to_sets or {},
            delete_from_sets=delete_from_sets or {},
            remove_fields=remove,
            increments=increments or {},
            condition=condition,
            condition_values=values,
            condition_names=names,
        )

    def job_deadline_fields(self, deadline_at: float) -> dict[str, Any]:
        return {DEADLINE_PK: DEADLINE_BUCKET, DEADLINE_SK: deadline_at}

    @staticmethod
    def deadline_attributes() -> list[str]:
        return [DEADLINE_PK, DEADLINE_SK]
