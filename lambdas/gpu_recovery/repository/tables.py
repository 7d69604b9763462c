"""What every repository of the recovery loop's two tables shares: the tables, the
sub-repositories over them (the deadline index among them) and the builders of conditional
updates (a job's transition, a rank's, an instance's).

:class:`RecoveryTables` is the base of the intents of jobs and ranks and of instances
(``Repository.jobs``, ``Repository.instances``: built ``over`` one ``RecoveryTables``,
``Repository.tables``, so all three share its state), and what the aggregates it carries are
built over (``node_tasks``, ``breaker``, ``warnings``...). The builders are also what the
heartbeat and queue repositories, which share these tables, build their own intents with;
they write through the tables' gateway (``db``: ``DynamoGateway``), which no stage sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Self

from gpu_recovery import clock
from gpu_recovery.constants import (
    DEADLINE_BUCKET,
    DEADLINE_PK,
    DEADLINE_SK,
    HB_PK,
    INSTANCE_PK,
    JOB_BY_INSTANCE_PK,
    JOB_BY_TASK_PK,
    JOB_PK,
    job_item_key,
    rank_item_key,
)
from gpu_recovery.domain.goodput import GP
from gpu_recovery.domain.models import Rank
from gpu_recovery.domain.state_machine import check_transition
from gpu_recovery.domain.states import (
    HEARTBEAT_WATCHED_RANK_STATES,
    HOLDING_RANK_STATES,
    InstanceState,
    JobState,
    RankState,
)
from gpu_recovery.repository import records
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, DynamoGateway, Update, state_condition
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.health_check_slots import HealthCheckSlots
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.node_task_claims import NodeTaskClaims
from gpu_recovery.repository.notices import NoticeRepository
from gpu_recovery.repository.preflight import PreflightRepository
from gpu_recovery.repository.tenant_evidence import TenantEvidenceRepository


class RecoveryTables:
    """The job and instance tables, and what every aggregate's intents are built with."""

    def __init__(self, dynamodb: Any, job_table: str, instance_table: str, *,
                 deadline_shards: int = 1) -> None:
        self.db = DynamoGateway(dynamodb, deadline_shards=deadline_shards)
        self._ddb = dynamodb  # boto3 DynamoDB *resource* (the other repositories share it)
        self.job_table_name = job_table
        self.instance_table_name = instance_table
        self._jobs = dynamodb.Table(job_table)
        self._instances = dynamodb.Table(instance_table)
        self.latches = LatchRepository(self)  # rank counts of an attempt
        self.faults = FaultRepository(self)  # suspect items, tallies, placements
        self.slots = HealthCheckSlots(self)  # health checks running: the cluster's, each job's
        self.cordons = CordonRepository(self)  # known-bad nodes and their ECS attribute syncs
        self.notices = NoticeRepository(self)  # e-mails owed (the outbox)
        self.preflight = PreflightRepository(self)  # gang preflights and the fleet's baselines
        self.tenant_evidence = TenantEvidenceRepository(self)  # suspects the stack's check cleared
        self.node_tasks = NodeTaskClaims(self)  # a node task's claim, every kind's
        # The sweep's reads of the deadline index, and the scheduler's of the jobs holding nodes.
        self.deadlines = DeadlineIndex(self)

    @classmethod
    def over(cls, tables: RecoveryTables) -> Self:
        """This aggregate over tables already open: one state with ``tables`` (the same
        gateway, the same sub-repositories), so the aggregates of one ``Repository`` never
        hold two copies of it."""
        aggregate = cls.__new__(cls)
        aggregate.__dict__ = tables.__dict__
        return aggregate

    # ================================================================== mapping
    job_from_item = staticmethod(records.job_from_item)
    job_to_item = staticmethod(records.job_to_item)
    rank_from_item = staticmethod(records.rank_from_item)
    rank_to_item = staticmethod(records.rank_to_item)
    instance_from_item = staticmethod(records.instance_from_item)

    # ================================================================ builders
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
        ledger: Mapping[str, Any] | None = None,
    ) -> Update:
        """A job state change, checked against the one job state machine. ``ledger``: the
        change's goodput facts (``domain.goodput``), kept in its history entry."""
        sources = list(from_states)
        for source in sources:
            if source is not to:
                check_transition(source, to)
        states = [s.value for s in sources]
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
                           "from": "|".join(states), **({GP: dict(ledger)} if ledger else {})},
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
        keep_watched: bool = False,
    ) -> Update:
        """Move one rank; the task ARN in the condition ignores stale attempts. A rank leaving
        the watched states leaves the heartbeat index too, unless ``keep_watched`` (a
        suspension's stop: its rank stays watched until STOPPED, ``heartbeat.escalation``)."""
        condition, values, names = state_condition(
            "rank_state", [s.value for s in from_states], "rs", "#task = :task"
        )
        values[":task"] = rank.task_arn
        names["#task"] = JOB_BY_TASK_PK
        remove = [] if to in HOLDING_RANK_STATES else [JOB_BY_INSTANCE_PK]
        if to not in HEARTBEAT_WATCHED_RANK_STATES and not keep_watched:
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
            if "suspect_origin" not in fields and "suspect_origin" not in remove:
                remove.append("suspect_origin")  # it says why the node is SUSPECT: that flag only
        fields["updated_at"] = clock.now()
        if deadline_at is not None:
            fields[DEADLINE_PK] = DEADLINE_BUCKET
            fields[DEADLINE_SK] = deadline_at
        elif clear_deadline:
            remove += DEADLINE_ATTRIBUTES
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
