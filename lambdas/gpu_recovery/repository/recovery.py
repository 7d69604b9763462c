"""Persistence of the recovery loop: jobs, ranks and container instances.

Stages call intents (``enter_recovery``, ``claim_health_check``,
``record_reboot_issued``...): every condition expression of the loop is written here.
An intent returns False when its condition did not hold (a duplicate, a race lost, a
state moved on); it raises on any other error, having written nothing (single items
and transactions are all-or-nothing).

The generic builders (``job_transition``, ``rank_update``, ``instance_update``) remain
for the heartbeat and queue repositories, which share these tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    BREAKER_ITEM_KEY,
    DEADLINE_BUCKET,
    DEADLINE_INDEX,
    DEADLINE_PK,
    DEADLINE_SK,
    HB_PK,
    HC_WAIT_PK,
    INSTANCE_PK,
    JOB_BY_INSTANCE_INDEX,
    JOB_BY_INSTANCE_PK,
    JOB_BY_TASK_INDEX,
    JOB_BY_TASK_PK,
    JOB_PK,
    QUEUE_PK,
    QUEUE_SK,
    job_item_key,
    rank_item_key,
    refused_item_key,
)
from gpu_recovery.domain.breaker_hold import BreakerHold
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.relocation import RelocationWait
from gpu_recovery.domain.state_machine import check_transition, sources_of
from gpu_recovery.domain.states import (
    FATAL_SUSPECT_VERDICTS,
    HEALTH_CHECK_STATES,
    HEARTBEAT_WATCHED_RANK_STATES,
    HOLDING_RANK_STATES,
    LIVE_RANK_STATES,
    InstanceState,
    JobState,
    RankState,
    SuspectVerdict,
)
from gpu_recovery.repository.base import DynamoGateway, Update, from_ddb, state_condition, to_ddb
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.health_check_slots import WAIT_SWEEP_SECONDS, Claim, HealthCheckSlots
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.notices import NoticeRepository

_DEADLINE = [DEADLINE_PK, DEADLINE_SK]
SPEND_INFRASTRUCTURE = "infrastructure"
SPEND_APPLICATION = "application"
_SPEND_COUNTER = {SPEND_INFRASTRUCTURE: "recoveries_used", SPEND_APPLICATION: "app_restarts_used"}


@dataclass(frozen=True)
class RankStop:
    """A rank's STOPPED event, written in the same transaction as the job's reaction."""

    rank: Rank
    to: RankState
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobVerdict:
    """What one node decision (a health-check verdict, or a definitive fault) does to one
    waiting job."""

    job: Job
    to: JobState
    label: SuspectVerdict
    findings: dict[str, Any]
    last_error: str = ""
    spend: str = ""  # "infrastructure" | "application" | "" (nothing charged)
    deadline_at: float | None = None  # PENDING_RESTART: when the sweep looks again
    record: dict[str, Any] | None = None  # the suspect's evidence + plan (+ label)
    relocate: bool = False  # the restart moves ranks off unusable nodes
    restart_reason: str = ""
    reason: str = ""  # the history entry (default: "verdict <label> on <instance>")
    waits_for_reboot: bool = False  # the job's restart waits until the node is back
    infra_hint: bool = False  # healthy, and the catalog charges a restart to the infrastructure budget
    held: bool = False  # the node's reboot was held back by the breaker (counted in the tally)
    # HOLD: the budget the restart spends once the held job goes on ("": not charged again).
    hold_spend: str | None = None


@dataclass(frozen=True)
class NodeDecision:
    """What a node decision does to the instance item (see ``record_node_decision``)."""

    from_states: tuple[InstanceState, ...]
    to: InstanceState | None  # None: the state stays
    findings: dict[str, Any] | None = None  # last_verdict
    fault_history: list[dict[str, Any]] | None = None
    last_fault: dict[str, Any] | None = None
    quarantine_reason: str = ""
    reboot_reason: str = ""
    terminate: bool = False  # replace by TerminateInstanceInAutoScalingGroup after the drain
    breaker_blocked: dict[str, Any] | None = None  # SUSPECT: the action the breaker held back
    hc_started_by: str | None = None  # the verdict of this health check only
    hc_jobs_count: int | None = None  # ... and only if no job joined it since it was read
    restart_jobs: tuple[str, ...] = ()  # jobs restarting once the node is back
    follow_up_at: float | None = None  # a reboot or drain still to do: the sweep finishes it
    cordon: dict[str, Any] | None = None  # known bad: cordon it (domain.cordon.cordon_record)
    uncordon: bool = False  # healthy again (a passed diag): clear its cordon


@dataclass(frozen=True)
class JobFailure:
    """A job failed (or, ``moves``, goes on elsewhere) because an instance it waits for
    timed out."""

    job: Job
    reason: str
    label: SuspectVerdict
    moves: bool = False  # relocatable and waiting to restart: the node no longer holds it
    suspect_pending: bool = False  # its verdict for the node was still to come (counted now)
    suspect_rebooting: bool = False  # it waited for the node's reboot (no longer)


class Repository:
    """Jobs, ranks and instances of the recovery loop."""

    def __init__(self, dynamodb: Any, job_table: str, instance_table: str) -> None:
        self.db = DynamoGateway(dynamodb)
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

    # ================================================================== mapping
    @staticmethod
    def job_from_item(item: Mapping[str, Any]) -> Job:
        item = from_ddb(dict(item))
        restarted = item.get("restarted_attempt")
        attempt = int(item.get("attempt", 1))
        source = item.get("source", "ecs-tags")
        return Job(
            job_id=item["job_id"],
            state=JobState(item["job_state"]),
            world_size=int(item["world_size"]),
            attempt=attempt,
            recoveries_used=int(item.get("recoveries_used", 0)),
            max_recovery_attempts=int(item.get("max_recovery_attempts", 1)),
            app_restarts_used=int(item.get("app_restarts_used", 0)),
            max_app_restarts=int(item.get("max_app_restarts", 0)),
            fault_started_at=item.get("fault_started_at"),
            last_error=item.get("last_error", ""),
            created_at=item.get("created_at", 0.0),
            updated_at=item.get("updated_at", 0.0),
            source=source,
            restarted_attempt=int(restarted) if restarted is not None else None,
            tally=FaultTally.from_item(item.get("fault")),
            relocate=bool(item.get("relocate", False)),
            relocated=int(item.get("relocated_attempt") or 0) == attempt,
            restart_reason=str(item.get("restart_reason", "")),
            suspend=dict(item.get("suspend") or {}),
            relocatable_tags=source == "queue" or bool(item.get("relocatable", False)),
            stop_fanout=dict(item.get("stop_fanout") or {}),
            start_fanout=dict(item.get("start_fanout") or {}),
            last_fault=dict(item.get("last_fault") or {}),
            relocation_wait=RelocationWait.from_item(item["job_id"], item.get("relocation_wait"), attempt),
            breaker_hold=BreakerHold.from_item(item["job_id"], item.get("breaker_hold"), attempt),
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
                "app_restarts_used": job.app_restarts_used,
                "max_app_restarts": job.max_app_restarts,
                "relocatable": job.relocatable_tags,
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
            stop_requested_at=item.get("stop_requested_at"),
            launch_attempt=item.get("launch_attempt"),
            launch_lease_until=item.get("launch_lease_until"),
            gpus=int(item.get("gpus") or 0),
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
        if rank.gpus:
            item["gpus"] = rank.gpus
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
            hc_lease_until=item.get("hc_lease_until"),
            hc_owner=str(item.get("hc_owner") or ""),
            hc_job_slot=bool(item.get("hc_job_slot", True)),
            hc_claimed_at=item.get("hc_claimed_at"),
            hc_waiting_for_slot=bool(item.get(HC_WAIT_PK)),
            hc_left=set(item.get("hc_left", set())),
            reboot_requested_at=item.get("reboot_requested_at"),
            reboot_claimed_at=item.get("reboot_claimed_at"),
            reboot_issued_at=item.get("reboot_issued_at"),
            disconnected_at=item.get("disconnected_at"),
            disconnected_version=int(item.get("disconnected_version", 0)),
            boot_time=item.get("boot_time"),
            waiting_jobs=set(item.get("waiting_jobs", set())),
            deadline_at=item.get(DEADLINE_SK),
            last_verdict=dict(item.get("last_verdict", {})),
            quarantine_reason=item.get("quarantine_reason", ""),
            drain_pending=bool(item.get("drain_pending", False)),
            terminate_pending=bool(item.get("terminate_pending", False)),
            terminate_claimed_at=item.get("terminate_claimed_at"),
            fault_history=list(item.get("fault_history") or []),
            reboot_reason=item.get("reboot_reason", ""),
            breaker_blocked=dict(item.get("breaker_blocked") or {}),
            cordon=dict(item.get("cordon") or {}),
            cordon_version=item.get("cordon_version"),
        )

    # ==================================================================== reads
    def get_job(self, job_id: str) -> Job | None:
        item = self.db.get(self.job_table_name, {JOB_PK: job_item_key(job_id)})
        return self.job_from_item(item) if item else None

    def get_job_item(self, job_id: str) -> dict[str, Any] | None:
        item = self.db.get(self.job_table_name, {JOB_PK: job_item_key(job_id)})
        return from_ddb(item) if item else None

    def get_rank(self, job_id: str, rank: int) -> Rank | None:
        item = self.db.get(self.job_table_name, {JOB_PK: rank_item_key(job_id, rank)})
        return self.rank_from_item(item) if item else None

    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]:
        """Ranks ``first`` to ``last - 1`` of a job (one batch of a fan-out), by key."""
        keys = [{JOB_PK: rank_item_key(job_id, r)} for r in range(first, last)]
        ranks = [self.rank_from_item(i) for i in self.db.batch_get(self.job_table_name, keys)]
        return sorted(ranks, key=lambda r: r.rank)

    def get_ranks(self, job: Job) -> list[Rank]:
        """All rank items of a job, strongly consistent, by key (world_size items): for
        operators' views and small gangs, never per event of a large one."""
        keys = [{JOB_PK: rank_item_key(job.job_id, r)} for r in range(job.world_size)]
        ranks = [self.rank_from_item(i) for i in self.db.batch_get(self.job_table_name, keys)]
        return sorted(ranks, key=lambda r: r.rank)

    def find_rank_by_task(self, task_arn: str) -> Rank | None:
        response = self.db.query_page(
            self.job_table_name,
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
        item = self.db.get(self.job_table_name, {JOB_PK: items[0][JOB_PK]})
        return self.rank_from_item(item) if item and "rank" in item else None

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]:
        """Ranks still holding GPUs on an instance (sparse index: history is never read)."""
        items = self.db.query_all(
            self.job_table_name,
            IndexName=JOB_BY_INSTANCE_INDEX,
            KeyConditionExpression="#i = :i",
            ExpressionAttributeNames={"#i": JOB_BY_INSTANCE_PK},
            ExpressionAttributeValues={":i": container_inst_id},
        )
        return [self.rank_from_item(i) for i in items]

    def get_instance(self, container_inst_id: str) -> Instance | None:
        item = self.db.get(self.instance_table_name, {INSTANCE_PK: container_inst_id})
        return self.instance_from_item(item) if item else None

    def get_instances(self, ids: Iterable[str]) -> dict[str, Instance]:
        keys = [{INSTANCE_PK: i} for i in sorted(set(ids))]
        found = (self.instance_from_item(i) for i in self.db.batch_get(self.instance_table_name, keys))
        return {inst.container_inst_id: inst for inst in found}

    def due_instances(self, now: float, limit: int | None = None) -> list[Instance]:
        return [self.instance_from_item(i) for i in self._due(self.instance_table_name, now, limit)]

    def due_job_items(self, now: float, limit: int | None = None) -> list[dict[str, Any]]:
        return [from_ddb(dict(i)) for i in self._due(self.job_table_name, now, limit)]

    def due_instance_pages(self, now: float, page: int) -> Iterator[list[Instance]]:
        """:meth:`due_instances` a page at a time, read as the caller asks for the next."""
        for items in self._due_pages(self.instance_table_name, now, page):
            yield [self.instance_from_item(i) for i in items]

    def due_job_item_pages(self, now: float, page: int) -> Iterator[list[dict[str, Any]]]:
        for items in self._due_pages(self.job_table_name, now, page):
            yield [from_ddb(dict(i)) for i in items]

    @staticmethod
    def _due_query(now: float) -> dict[str, Any]:
        return dict(
            IndexName=DEADLINE_INDEX,
            KeyConditionExpression="#b = :b AND #d <= :now",
            ExpressionAttributeNames={"#b": DEADLINE_PK, "#d": DEADLINE_SK},
            ExpressionAttributeValues={":b": DEADLINE_BUCKET, ":now": to_ddb(float(now))},
        )

    def _due(self, table: str, now: float, limit: int | None) -> list[dict[str, Any]]:
        """Items whose deadline passed, oldest first (at most ``limit``: one page)."""
        if limit is None:
            return self.db.query_all(table, **self._due_query(now))
        return list(self.db.query_page(table, Limit=limit, **self._due_query(now)).get("Items", []))

    def _due_pages(self, table: str, now: float, page: int) -> Iterator[list[dict[str, Any]]]:
        """Pages from where the last one ended (an item handled meanwhile moved to a later
        deadline; one whose step failed keeps its place, before the next page: neither is
        read twice in one pass)."""
        kwargs = self._due_query(now)
        while True:
            response = self.db.query_page(table, Limit=page, **kwargs)
            yield list(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    # ============================================================ registration
    def create_job_if_absent(self, job: Job) -> bool:
        return self.db.put_if_absent(self.job_table_name, self.job_to_item(job), JOB_PK)

    def put_rank_registration(self, rank: Rank) -> bool:
        """Write a rank unless the table already has this task or a newer attempt."""
        return self.db.put_conditional(
            self.job_table_name,
            self.rank_to_item(rank),
            "attribute_not_exists(#k) OR (#a < :a) OR (#a = :a AND #t <> :t AND #s IN (:starting))",
            {"#k": JOB_PK, "#a": "attempt", "#t": JOB_BY_TASK_PK, "#s": "rank_state"},
            {":a": rank.attempt, ":t": rank.task_arn, ":starting": RankState.STARTING.value},
        )

    def mark_refused(self, job_id: str, world_size: int, now: float, also: Sequence[Update] = ()) -> bool:
        """A tagged job too large to protect: True the first time only (operators are told once,
        ``also``: the e-mail owed)."""
        return self.db.transact([Update(
            table=self.job_table_name, key={JOB_PK: refused_item_key(job_id)},
            set_fields={"item_type": "REFUSED", "world_size": world_size, "refused_at": now},
            condition="attribute_not_exists(#k)", condition_names={"#k": JOB_PK}), *also])

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
        return self.db.put_if_absent(self.instance_table_name, item, INSTANCE_PK)

    # ================================================================ rank intents
    def mark_rank_running(self, rank: Rank) -> bool:
        return self.db.apply(self.rank_update(rank, RankState.RUNNING, from_states=[RankState.STARTING]))

    def request_rank_stop(self, rank: Rank, why: str, now: float) -> bool:
        """Mark a live rank STOP_REQUESTED (once) before asking ECS to stop it."""
        return self.db.apply(self.rank_update(rank, RankState.STOP_REQUESTED, from_states=LIVE_RANK_STATES,
                                              set_fields={"stop_reason": why[:300],
                                                          "stop_requested_at": now}))

    def record_rank_stop(self, stop: RankStop) -> bool:
        return self.db.apply(self._rank_stop_update(stop))

    def _rank_stop_update(self, stop: RankStop) -> Update:
        return self.rank_update(stop.rank, stop.to, from_states=HOLDING_RANK_STATES, set_fields=stop.fields)

    def claim_rank_launch(self, rank: Rank, attempt: int, lease_until: float, now: float) -> bool:
        """Start rank ``rank`` for ``attempt`` at most once at a time: a lease on the rank item
        of the previous attempt. A holder that died lets the lease expire; the next one
        looks the task up by startedBy before starting it."""
        return self.db.apply(Update(
            table=self.job_table_name,
            key={JOB_PK: rank_item_key(rank.job_id, rank.rank)},
            set_fields={"launch_attempt": attempt, "launch_lease_until": lease_until},
            condition=("#a = :prev AND (attribute_not_exists(#la) OR #la <> :a OR #lu < :now)"),
            condition_values={":prev": attempt - 1, ":a": attempt, ":now": now},
            condition_names={"#a": "attempt", "#la": "launch_attempt", "#lu": "launch_lease_until"},
        ))

    # ================================================================= job intents
    def stop_fanout_fields(self, attempt: int, why: str, now: float) -> dict[str, Any]:
        """The intent to stop every live rank of ``attempt`` (a fan-out of StopTask batches),
        committed with the job's transition; the sweep sends it again until confirmed."""
        return {"stop_fanout": {"attempt": attempt, "why": why[:300], "at": now, "rounds": 0}}

    def enter_recovery(self, job_id: str, attempt: int, *, from_states: Iterable[JobState], reason: str,
                       now: float, deadline_at: float, rank_stop: RankStop | None = None,
                       actor: str = "recovery") -> bool:
        """The first suspect of a fault: job -> PENDING_HEALTHCHECK with a fresh tally and the
        intent to stop every other rank (with the rank's stop in the same transaction, so a
        retry never finds one written without the other). The suspect itself is an item of
        its own (``FaultRepository.open_suspect``), written before."""
        job = self.job_transition(
            job_id, JobState.PENDING_HEALTHCHECK, from_states=from_states, attempt=attempt,
            reason=reason, actor=actor,
            set_fields={"fault": FaultTally(attempt=attempt).to_item(), "fault_started_at": now,
                        "last_error": reason[:1000], **self.stop_fanout_fields(attempt, reason, now),
                        # In the deadline index while in recovery: the queue scheduler holds
                        # the job's nodes, and the sweep finishes what a delivery left undone.
                        **self.job_deadline_fields(deadline_at)},
            remove_fields=["relocate", "restart_reason"],
        )
        return self._with_rank(job, rank_stop)

    def restart_in_place(self, job: Job, *, from_states: Iterable[JobState], reason: str, now: float,
                         deadline_at: float, spend: str, restart_reason: str,
                         rank_stop: RankStop | None = None,
                         last_fault: dict[str, Any] | None = None) -> bool:
        """A fault that needs no node action (an application error within its budget, a
        transient fault): job -> PENDING_RESTART on the same nodes, the budget charged, every
        other rank to be stopped, with the rank's stop in the same transaction."""
        fields: dict[str, Any] = {
            "fault": FaultTally(attempt=job.attempt).to_item(), "fault_started_at": now,
            "last_error": reason[:1000], "restart_reason": restart_reason[:500],
            **self.stop_fanout_fields(job.attempt, reason, now), **self.job_deadline_fields(deadline_at)}
        if last_fault is not None:
            fields["last_fault"] = last_fault
        update = self.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=from_states, attempt=job.attempt,
            reason=reason, actor="recovery", set_fields=fields,
            increments={_SPEND_COUNTER[spend]: 1} if spend else None,
            remove_fields=["relocate"],
        )
        return self._with_rank(update, rank_stop)

    def finish_job(self, job_id: str, attempt: int | None, to: JobState, reason: str, *,
                   actor: str = "recovery", fields: dict[str, Any] | None = None,
                   from_states: Iterable[JobState] | None = None,
                   rank_stop: RankStop | None = None, stop_ranks_of: int | None = None,
                   stop_why: str = "", also: Sequence[Update] = ()) -> bool:
        """Move a job to a terminal state (from any state that may reach it). With
        ``stop_ranks_of`` (an attempt) the intent to stop that attempt's live ranks is
        committed too, and a deadline kept until the fan-out is confirmed."""
        sources = [s for s in (from_states or sources_of(to))]
        now = clock.now()
        extra = dict(fields or {})
        remove = list(_DEADLINE)
        if stop_ranks_of is not None:
            extra.update(self.stop_fanout_fields(stop_ranks_of, stop_why or reason, now))
            extra.update(self.job_deadline_fields(now + 60))
            remove = []
        job = self.job_transition(job_id, to, from_states=sources, attempt=attempt, reason=reason,
                                  actor=actor, set_fields=extra, remove_fields=remove)
        return self._with_rank(job, rank_stop, also)

    def _with_rank(self, job_update: Update, rank_stop: RankStop | None, also: Sequence[Update] = ()) -> bool:
        rank = [self._rank_stop_update(rank_stop)] if rank_stop is not None else []
        return self.db.transact([*rank, job_update, *also])

    def confirm_job_running(self, job_id: str, attempt: int, reason: str, actor: str = "recovery",
                            also: Sequence[Update] = ()) -> bool:
        return self.db.transact([self.job_transition(
            job_id, JobState.RUNNING, from_states=[JobState.STARTING], attempt=attempt,
            reason=reason, actor=actor, remove_fields=[*_DEADLINE, "start_fanout"]), *also])

    def mark_job_canceled(self, job_id: str, reason: str, actor: str = "recovery") -> bool:
        return self.db.apply(self.job_transition(
            job_id, JobState.CANCELED, from_states=[JobState.CANCELING], attempt=None,
            reason=reason, actor=actor))

    def mark_not_relocatable(self, job_id: str) -> bool:
        """A rank of the job lacks gpu-recovery:relocatable=true: the job is not relocatable."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job_id)},
            set_fields={"relocatable": False}, condition="#r = :t",
            condition_values={":t": True}, condition_names={"#r": "relocatable"}))

    def rearm_job(self, job: Job, deadline_at: float) -> bool:
        """Push a job's deadline (no history entry: nothing happened to the job)."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            set_fields=self.job_deadline_fields(deadline_at),
            condition="#st = :st AND #att = :att",
            condition_values={":st": job.state.value, ":att": job.attempt},
            condition_names={"#st": "job_state", "#att": "attempt"},
        ))

    def clear_job_deadline(self, job_id: str, state: JobState, deadline_at: Any) -> bool:
        """Only the deadline the sweep read: a newer one (a new state) stays."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job_id)},
            remove_fields=list(_DEADLINE),
            condition="#st = :st AND #dl = :dl",
            condition_values={":st": state.value, ":dl": deadline_at},
            condition_names={"#st": "job_state", "#dl": DEADLINE_SK},
        ))

    def claim_gang_restart(self, job: Job, *, now: float, deadline_at: float,
                           placement: Update | None = None, moves: Mapping[str, Any] | None = None,
                           reason: str = "") -> bool:
        """PENDING_RESTART -> STARTING with attempt + 1 and the intent to start every rank
        (a fan-out of StartTask batches), exactly once per fault. A relocation's placement
        item (node -> target) is written in the same transaction: whoever resumes the launch
        starts every rank where this claim said."""
        new_attempt = job.attempt + 1
        fields: dict[str, Any] = {"attempt": new_attempt, "restarted_attempt": new_attempt,
                                  "restarted_at": now, **self.job_deadline_fields(deadline_at),
                                  "start_fanout": {"attempt": new_attempt, "at": now}}
        if placement is not None:
            fields["relocated_attempt"] = new_attempt
            fields["relocations"] = [*self._relocations(job.job_id), {
                "at": now, "attempt": new_attempt, "reason": reason[:500],
                "moves": {node: str(m.get("node", "")) for node, m in list((moves or {}).items())[:20]},
                "nodes_moved": len(moves or {})}][-20:]
        update = self.job_transition(
            job.job_id, JobState.STARTING, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=reason or f"gang restart, attempt {new_attempt}", actor="recovery",
            set_fields=fields)
        return self.db.transact([update, placement]) if placement is not None else self.db.apply(update)

    def record_fanout_sent(self, job: Job, kind: str, attempt: int, now: float) -> bool:
        """The fan-out's batches are on their queue (or were run): confirmed."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={f"{kind}.sent_at": now},
            condition="#f.#a = :a", condition_values={":a": attempt},
            condition_names={"#f": kind, "#a": "attempt"}))

    def record_stop_round(self, job: Job, attempt: int, rounds: int, now: float) -> bool:
        """The stops of ``attempt`` were asked again (a paced round): when, and how often."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={"stop_fanout.rounds": rounds, "stop_fanout.sent_at": now},
            condition="#f.#a = :a AND (attribute_not_exists(#f.#r) OR #f.#r < :r)",
            condition_values={":a": attempt, ":r": rounds},
            condition_names={"#f": "stop_fanout", "#a": "attempt", "#r": "rounds"}))

    def end_stop_fanout(self, job: Job, attempt: int) -> bool:
        """Every rank of ``attempt`` ended: nothing is left to stop (a terminal job leaves the
        deadline index)."""
        update = Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            remove_fields=["stop_fanout", *(_DEADLINE if job.state.is_terminal else [])],
            condition="#f.#a = :a AND #st = :st",
            condition_values={":a": attempt, ":st": job.state.value},
            condition_names={"#f": "stop_fanout", "#a": "attempt", "#st": "job_state"})
        return self.db.apply(update)

    def conclude_fault(self, job: Job, to: JobState, *, reason: str, error: str, spend: str,
                       restart_reason: str, deadline_at: float | None, also: Sequence[Update] = ()) -> bool:
        """Every verdict in (counted once every rank ended): the job leaves
        PENDING_HEALTHCHECK on the tally as read."""
        condition, values, names = self.faults.tally_condition(job)
        now = clock.now()
        fields: dict[str, Any] = {}
        if error:
            fields["last_error"] = error[:1000]
        if restart_reason:
            fields["restart_reason"] = restart_reason[:500]
        if deadline_at is not None:
            fields.update(self.job_deadline_fields(deadline_at))
        if to.is_terminal:
            fields.update(self.stop_fanout_fields(job.attempt, error or reason, now))
            fields.update(self.job_deadline_fields(now + 60))
        return self.db.transact([self.job_transition(
            job.job_id, to, from_states=[job.state], attempt=job.attempt, reason=reason, actor="recovery",
            set_fields=fields, increments={_SPEND_COUNTER[spend]: 1} if spend else None,
            extra_condition=condition, extra_values=values, extra_names=names), *also])

    def _relocations(self, job_id: str) -> list[dict[str, Any]]:
        item = self.get_job_item(job_id) or {}
        return list(item.get("relocations") or [])

    def wait_for_relocation(self, job: Job, wait: RelocationWait, deadline_at: float) -> bool:
        """No healthy free node for a relocatable job: it stays PENDING_RESTART with its
        wait (once per fault: a duplicate or late delivery neither extends nor restarts it)
        and a deadline, so the sweep tries again. Nothing is charged."""
        return self.db.apply(self.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=wait.waiting_reason(), actor="recovery",
            set_fields={"relocation_wait": wait.to_item(), **self.job_deadline_fields(deadline_at)},
            extra_condition="attribute_not_exists(#rw) OR #rw.#ra <> :att",
            extra_names={"#rw": "relocation_wait", "#ra": "attempt"}))

    def leave_suspects_before_verdict(self, job: Job, nodes: Sequence[str], *, reason: str,
                                      deadline_at: float) -> bool:
        """Spare first: the job leaves its suspect ``nodes`` before their verdicts, at once
        and once per fault: PENDING_HEALTHCHECK -> PENDING_RESTART to relocate (on the tally
        as read, so a verdict landing meanwhile makes one of the two fail), one
        infrastructure recovery charged, each suspect PENDING -> LEFT, and on each node's
        open health check the job moved from ``hc_jobs`` (its verdict no longer waited for)
        to ``hc_left`` (the check goes on for the node; the evidence is on the suspect)."""
        faults = self.faults
        now = clock.now()
        condition, values, names = faults.tally_condition(job)
        updates = [self.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=[JobState.PENDING_HEALTHCHECK],
            attempt=job.attempt, reason=reason, actor="recovery",
            set_fields={"relocate": True, "restart_reason": reason[:500],
                        "left_before_verdict": {"attempt": job.attempt, "at": now, "nodes": list(nodes)},
                        **self.job_deadline_fields(deadline_at)},
            increments={"fault.decided": len(nodes), "fault.fatal": len(nodes),
                        _SPEND_COUNTER[SPEND_INFRASTRUCTURE]: 1},
            extra_condition=condition, extra_values=values, extra_names=names)]
        left = f"{job.job_id}#{job.attempt}"
        for node in nodes:
            updates.append(faults.decide_suspect(
                job, node, SuspectVerdict.LEFT, findings={"source": "left before the verdict", "at": now},
                record=None, rebooting=False, now=now))
            updates.append(self.instance_update(
                node, from_states=HEALTH_CHECK_STATES, delete_from_sets={"hc_jobs": {job.job_id}},
                add_to_sets={"hc_left": {left}}, extra_condition="contains(#hcj, :job)",
                extra_values={":job": job.job_id}, extra_names={"#hcj": "hc_jobs"}))
        return self.db.transact(updates)

    def hold_job(self, job: Job, hold: BreakerHold, deadline_at: float, also: Sequence[Update] = ()) -> bool:
        """A job that cannot move waits for a node whose reboot the breaker held back:
        PENDING_RESTART -> HELD on the same attempt with its hold and a deadline (the sweep
        looks again); nothing is charged. A hold of this attempt already written (the job
        went on and is held again for another node) keeps its deadline: the caller passes it."""
        return self.db.transact([self.job_transition(
            job.job_id, JobState.HELD, from_states=[JobState.PENDING_RESTART], attempt=job.attempt,
            reason=hold.waiting_reason(), actor="recovery",
            set_fields={"breaker_hold": hold.to_item(), **self.job_deadline_fields(deadline_at)}), *also])

    def resume_held_job(self, job: Job, hold: BreakerHold, reason: str, now: float) -> bool:
        """Every node the held job waited for is back: HELD -> PENDING_RESTART on the same
        attempt, its restart charged now (once: the transition is conditional on HELD)."""
        return self.db.apply(self.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=[JobState.HELD], attempt=job.attempt,
            reason=reason, actor="recovery",
            set_fields={"breaker_hold.resumed_at": now, **self.job_deadline_fields(now + 60)},
            increments={_SPEND_COUNTER[hold.spend]: 1} if hold.spend in _SPEND_COUNTER else None))

    def requeue_for_relocation(self, job: Job, *, queue_order: str, relocation: dict[str, Any],
                               reason: str, also: Sequence[Update] = ()) -> bool:
        """A queue job leaves its unusable nodes: PENDING_RESTART -> PENDING_RESOURCES at the
        head of its priority; the scheduler places it on healthy nodes (attempt + 1, a new
        MASTER_ADDR) and records where each rank moved."""
        return self.db.transact([self.job_transition(
            job.job_id, JobState.PENDING_RESOURCES, from_states=[JobState.PENDING_RESTART],
            attempt=job.attempt, reason=reason, actor="recovery",
            set_fields={QUEUE_PK: "QUEUE", QUEUE_SK: queue_order, "not_before": 0,
                        "relocation": relocation},
            remove_fields=[*_DEADLINE, "relocate", "launched_at", "launch_claimed_at"],
        ), *also])

    # ============================================================ instance intents
    def open_health_check(self, inst_id: str, job_id: str, *, now: float, retry_at: float) -> bool:
        """AVAILABLE / SUSPECT (or unknown) -> HEALTH_CHECK_PENDING with this job waiting."""
        return self.db.apply(self.instance_update(
            inst_id, from_states=[InstanceState.AVAILABLE, InstanceState.SUSPECT], allow_missing=True,
            to=InstanceState.HEALTH_CHECK_PENDING,
            set_fields={"hc_requested_at": now, "hc_start_attempts": 0},
            add_to_sets={"hc_jobs": {job_id}},
            remove_fields=["hc_task_arn", "hc_started_by", "hc_lease_until", "waiting_jobs"],
            deadline_at=retry_at,
        ))

    def join_health_check(self, inst_id: str, job_id: str) -> bool:
        return self.db.apply(self.instance_update(
            inst_id, from_states=HEALTH_CHECK_STATES, add_to_sets={"hc_jobs": {job_id}}))

    def claim_health_check(self, instance: Instance, started_by: str, lease_until: float, *, owner: str,
                           per_job: int, cluster: int, now: float) -> Claim:
        """HEALTH_CHECK_PENDING -> HEALTH_CHECKING with a slot of the cluster's and one of
        ``owner``'s: the claim is committed before StartTask, and its startedBy finds the
        task again if the answer to StartTask is lost. A job's share as large as the
        cluster's can never be the limit that binds: no share is counted then (one hot
        item less in every claim and verdict), and the instance says so for the release."""
        job_slot = HealthCheckSlots.keeps_job_share(per_job=per_job, cluster=cluster)
        claim = self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
            to=InstanceState.HEALTH_CHECKING,
            set_fields={"hc_started_by": started_by, "hc_lease_until": lease_until, "hc_owner": owner,
                        "hc_claimed_at": now, "hc_job_slot": job_slot},
            remove_fields=HealthCheckSlots.wait_attributes(), deadline_at=lease_until,
            extra_condition="#att = :att", extra_values={":att": instance.hc_start_attempts},
            extra_names={"#att": "hc_start_attempts"},
        )
        return self.slots.claim(claim, owner, per_job=per_job if job_slot else None, cluster=cluster)

    def wait_for_health_check_slot(self, instance: Instance, owner: str, now: float) -> bool:
        """No slot free: the pending check waits in its owner's queue (no time limit while it
        waits; the sweep looks at it every ten minutes)."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
            set_fields=HealthCheckSlots.wait_fields(owner), deadline_at=now + WAIT_SWEEP_SECONDS,
            extra_condition="#att = :att", extra_values={":att": instance.hc_start_attempts},
            extra_names={"#att": "hc_start_attempts"}))

    def abandon_health_check(self, instance: Instance, reason: str) -> bool:
        """A pending check no job waits for any more (they all moved on): the node is
        AVAILABLE again, as it was before it was suspected."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
            to=InstanceState.AVAILABLE, set_fields={"hc_abandoned": reason[:300]},
            remove_fields=["hc_jobs", "hc_left", "hc_started_by", "hc_lease_until",
                           *HealthCheckSlots.wait_attributes()],
            clear_deadline=True, extra_condition="#att = :att",
            extra_values={":att": instance.hc_start_attempts}, extra_names={"#att": "hc_start_attempts"}))

    def take_over_health_check_claim(self, instance: Instance, lease_until: float, now: float) -> bool:
        """A claim whose holder died (lease expired, no task recorded): take it over."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECKING],
            set_fields={"hc_lease_until": lease_until}, deadline_at=lease_until,
            extra_condition="#sb = :sb AND attribute_not_exists(#arn) AND "
                            "(attribute_not_exists(#lu) OR #lu < :now)",
            extra_values={":sb": instance.hc_started_by, ":now": now},
            extra_names={"#sb": "hc_started_by", "#arn": "hc_task_arn", "#lu": "hc_lease_until"},
        ))

    def record_health_check_task(self, inst_id: str, started_by: str, task_arn: str,
                                 deadline_at: float) -> bool:
        return self.db.apply(self.instance_update(
            inst_id, from_states=[InstanceState.HEALTH_CHECKING],
            set_fields={"hc_task_arn": task_arn}, remove_fields=["hc_lease_until"],
            deadline_at=deadline_at,
            extra_condition="#sb = :sb", extra_values={":sb": started_by},
            extra_names={"#sb": "hc_started_by"},
        ))

    def release_health_check_claim(self, instance: Instance, started_by: str, *, placement_failed: bool,
                                   retry_at: float) -> bool:
        """StartTask answered and started nothing: back to HEALTH_CHECK_PENDING, its slot
        given back."""
        return self.db.transact([self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECKING],
            to=InstanceState.HEALTH_CHECK_PENDING,
            increments={"hc_start_attempts": 1} if placement_failed else {},
            remove_fields=["hc_started_by", "hc_lease_until", "hc_owner", "hc_job_slot"],
            deadline_at=retry_at,
            extra_condition="#sb = :sb AND attribute_not_exists(#arn)",
            extra_values={":sb": started_by},
            extra_names={"#sb": "hc_started_by", "#arn": "hc_task_arn"},
        ), *self.slots.release(instance)])

    def retry_health_check(self, instance: Instance, started_by: str, retry_at: float) -> bool:
        """The check ended without a verdict (image pull, OOM...): run it again (its slot
        given back; it takes one again when it starts)."""
        return self.db.transact([self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECKING],
            to=InstanceState.HEALTH_CHECK_PENDING, increments={"hc_start_attempts": 1},
            remove_fields=["hc_task_arn", "hc_started_by", "hc_lease_until", "hc_owner", "hc_job_slot"],
            deadline_at=retry_at,
            extra_condition="#sb = :sb", extra_values={":sb": started_by},
            extra_names={"#sb": "hc_started_by"},
        ), *self.slots.release(instance)])

    def rearm_instance(self, inst_id: str, state: InstanceState, deadline_at: float) -> bool:
        return self.db.apply(self.instance_update(inst_id, from_states=[state], deadline_at=deadline_at))

    def clear_instance_deadline(self, inst_id: str, state: InstanceState) -> bool:
        return self.db.apply(self.instance_update(inst_id, from_states=[state], clear_deadline=True))

    def record_node_decision(self, instance: Instance, decision: NodeDecision,
                             jobs: Sequence[JobVerdict], now: float,
                             breaker: Update | None = None, also: Sequence[Update] = ()) -> bool:
        """One node decision (a health check's verdict, or a definitive fault without one)
        on the instance, every job waiting for it and the blast-radius breaker, atomically.
        A verdict applies only to its own check (its startedBy) and only if no job joined
        it since it was read. A reboot or a drain still to do keeps a deadline
        (``follow_up_at``) so the sweep finishes it if this delivery dies. ``also``: other
        updates built here (e.g. :meth:`lost_job_failure`) that belong to the decision."""
        fields: dict[str, Any] = {}
        remove = ["hc_jobs", "hc_left", "hc_lease_until", "hc_owner", "hc_job_slot",
                  *HealthCheckSlots.wait_attributes()]
        if decision.findings is not None:
            fields["last_verdict"] = decision.findings
        if decision.fault_history is not None:
            fields["fault_history"] = decision.fault_history
        if decision.last_fault is not None:
            fields["last_fault"] = decision.last_fault
        to = decision.to
        if to is InstanceState.REBOOTING:
            fields.update(reboot_requested_at=now, reboot_reason=decision.reboot_reason[:300])
            remove += ["reboot_claimed_at", "reboot_issued_at", "disconnected_at", "disconnected_version",
                       "breaker_blocked"]
        if to is InstanceState.QUARANTINED:
            fields.update(quarantine_reason=decision.quarantine_reason[:500], drain_pending=True)
            if decision.terminate:
                fields["terminate_pending"] = True
            remove += ["breaker_blocked"]
        if decision.breaker_blocked is not None:
            fields["breaker_blocked"] = decision.breaker_blocked
        cordon_sync: list[Update] = []
        if decision.cordon is not None:
            fields.update(self.cordons.cordon_fields(decision.cordon, now))
            cordon_sync.append(self.cordons.sync_update(instance.container_inst_id, now))
        elif decision.uncordon and instance.cordoned:
            more, gone, sync = self.cordons.uncordon_updates(instance.container_inst_id, now)
            fields.update(more)
            remove += gone
            cordon_sync.append(sync)
        extra: list[str] = []
        values: dict[str, Any] = {}
        names: dict[str, str] = {}
        if decision.hc_started_by is not None:
            extra.append("#sb = :sb")
            values[":sb"] = decision.hc_started_by
            names["#sb"] = "hc_started_by"
        if decision.hc_jobs_count is not None:
            # No job left waiting (they all left before the verdict): the emptied set is gone.
            extra.append("(attribute_not_exists(#hcj) OR size(#hcj) = :hcn)" if decision.hc_jobs_count == 0
                         else "size(#hcj) = :hcn")
            values[":hcn"] = decision.hc_jobs_count
            names["#hcj"] = "hc_jobs"
        follow_up = decision.follow_up_at is not None
        updates = [self.instance_update(
            instance.container_inst_id, from_states=decision.from_states, to=to,
            set_fields=fields, remove_fields=remove,
            deadline_at=decision.follow_up_at, clear_deadline=not follow_up,
            add_to_sets={"waiting_jobs": set(decision.restart_jobs)} if decision.restart_jobs else None,
            extra_condition=" AND ".join(extra) or None, extra_values=values, extra_names=names,
        )]
        for verdict in jobs:
            updates += self.job_verdict_updates(instance.container_inst_id, verdict)
        updates += self.faults.verdict_after_leaving(instance, decision.findings, to or instance.state, now)
        if instance.state is InstanceState.HEALTH_CHECKING \
                and InstanceState.HEALTH_CHECKING in decision.from_states:
            updates += self.slots.release(instance)
        if breaker is not None:
            updates.append(breaker)
        updates += cordon_sync
        updates += list(also)
        return self.db.transact(updates)

    def lost_job_failure(self, job: Job, reason: str, last_fault: dict[str, Any] | None = None) -> Update:
        """NODE_LOST -> FAILED on the same attempt (its node unreachable), with the fault's
        evidence and decision and the intent to stop its ranks; for
        :meth:`record_node_decision` (``also``) or :meth:`fail_lost_job`."""
        now = clock.now()
        fields: dict[str, Any] = {"last_error": reason[:1000],
                                  **self.stop_fanout_fields(job.attempt, reason, now),
                                  **self.job_deadline_fields(now + 60)}
        if last_fault is not None:
            fields["last_fault"] = last_fault
        return self.job_transition(
            job.job_id, JobState.FAILED, from_states=[JobState.NODE_LOST], attempt=job.attempt,
            reason=reason, actor="heartbeat", set_fields=fields)

    def fail_lost_job(self, job: Job, reason: str, last_fault: dict[str, Any] | None = None,
                      also: Sequence[Update] = ()) -> bool:
        """The same, without a node decision (the node is not AVAILABLE / SUSPECT, or observe
        mode leaves it alone and this is recorded separately)."""
        return self.db.transact([self.lost_job_failure(job, reason, last_fault), *also])

    def record_node_fault(self, inst_id: str, *, fault_history: list[dict[str, Any]],
                          last_fault: dict[str, Any] | None, read_version: int) -> bool:
        """A fault that changed nothing on the node (a restart in place, an application
        error) joins its history, only if no other such write landed since the history was
        read (``fault_history_version``; a lost race re-reads and appends again)."""
        fields: dict[str, Any] = {"fault_history": fault_history}
        if last_fault is not None:
            fields["last_fault"] = last_fault
        return self.db.apply(self.instance_update(
            inst_id, set_fields=fields, increments={"fault_history_version": 1},
            extra_condition="attribute_exists(#k) AND (attribute_not_exists(#fv) OR #fv = :fv)",
            extra_values={":fv": read_version},
            extra_names={"#k": INSTANCE_PK, "#fv": "fault_history_version"}))

    def record_drained(self, inst_id: str, *, terminate_next: bool = False, uncordon: bool = False) -> bool:
        """ECS confirmed the quarantine's DRAINING: nothing left for the sweep (unless the
        node is still to be terminated in its Auto Scaling group). DRAINING keeps every
        placement off the node from now on, so a cordon it had (``uncordon``) is cleared
        with it: an operator who sets the node ACTIVE again finds it placeable."""
        fields: dict[str, Any] = {}
        remove = ["drain_pending"]
        sync: list[Update] = []
        if uncordon:
            now = clock.now()
            fields, gone, update = self.cordons.uncordon_updates(inst_id, now)
            remove += gone
            sync.append(update)
        return self.db.transact([self.instance_update(
            inst_id, from_states=[InstanceState.QUARANTINED], set_fields=fields, remove_fields=remove,
            clear_deadline=not terminate_next, extra_condition="attribute_exists(#dp)",
            extra_names={"#dp": "drain_pending"}), *sync])

    def claim_termination(self, instance: Instance, now: float, lease_seconds: float) -> bool:
        """The intent to call TerminateInstanceInAutoScalingGroup, committed before the call;
        a claim older than the lease (its holder died) may be taken over, and the taker
        looks the instance up before calling again."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.QUARANTINED],
            set_fields={"terminate_claimed_at": now},
            extra_condition="attribute_exists(#tp) AND (attribute_not_exists(#tc) OR #tc < :stale)",
            extra_values={":stale": now - lease_seconds},
            extra_names={"#tp": "terminate_pending", "#tc": "terminate_claimed_at"},
        ))

    def record_termination(self, inst_id: str, result: str, now: float) -> bool:
        """The termination was requested (or found done / impossible): confirmed."""
        return self.db.apply(self.instance_update(
            inst_id, from_states=[InstanceState.QUARANTINED],
            set_fields={"terminate_result": result[:300], "terminated_at": now},
            remove_fields=["terminate_pending"], clear_deadline=True,
            extra_condition="attribute_exists(#tp)", extra_names={"#tp": "terminate_pending"},
        ))

    # ================================================================ breaker
    def get_breaker(self) -> dict[str, Any] | None:
        item = self.db.get(self.instance_table_name, {INSTANCE_PK: BREAKER_ITEM_KEY})
        return from_ddb(item) if item else None

    def breaker_update(self, state: Mapping[str, Any], read_version: int | None) -> Update:
        """Write the breaker's state, only if nobody wrote it since it was read (its version;
        ``None``: the item did not exist)."""
        fields = {k: state.get(k) for k in ("state", "version", "window", "backlog", "tripped_at",
                                             "trip_reason", "trips", "last_reset_at", "last_reset_by")}
        fields["item_type"] = "BREAKER"
        for extra in ("released", "limit", "cluster_gpu_nodes", "window_seconds", "cordons"):
            if extra in state:
                fields[extra] = state[extra]
        if read_version is None:
            condition, values, names = "attribute_not_exists(#k)", {}, {"#k": INSTANCE_PK}
        else:
            condition, values, names = "#v = :v", {":v": read_version}, {"#v": "version"}
        return Update(table=self.instance_table_name, key={INSTANCE_PK: BREAKER_ITEM_KEY},
                      set_fields=fields, condition=condition, condition_values=values,
                      condition_names=names)

    def save_breaker(self, state: Mapping[str, Any], read_version: int | None) -> bool:
        return self.db.apply(self.breaker_update(state, read_version))

    def drop_released(self, node: str) -> bool:
        """A released backlog entry was carried out (or is moot): remove it."""
        return self.db.apply(Update(
            table=self.instance_table_name, key={INSTANCE_PK: BREAKER_ITEM_KEY},
            remove_fields=[f"released.{node}"], condition="attribute_exists(#r.#n)",
            condition_names={"#r": "released", "#n": node}))

    def record_observed_fault(self, inst_id: str, *, fault_history: list[dict[str, Any]] | None,
                              last_fault: dict[str, Any]) -> bool:
        """Observe mode: what would have been done, on the node (its state untouched)."""
        fields: dict[str, Any] = {"last_fault": last_fault}
        if fault_history is not None:
            fields["fault_history"] = fault_history
        return self.db.apply(self.instance_update(
            inst_id, set_fields=fields, extra_condition="attribute_exists(#k)",
            extra_names={"#k": INSTANCE_PK}))

    def get_instance_item(self, container_inst_id: str) -> dict[str, Any] | None:
        """The raw instance item (the node agent's XIDs and telemetry, the fault history)."""
        item = self.db.get(self.instance_table_name, {INSTANCE_PK: container_inst_id})
        return from_ddb(item) if item else None

    def record_verdict_of_busy_instance(self, instance: Instance, verdict: JobVerdict,
                                        restart: bool, also: Sequence[Update] = ()) -> bool:
        """A job joins an instance already rebooting or quarantined by another job's fault:
        the verdict it waits for is already known."""
        updates = [self.instance_update(
            instance.container_inst_id, from_states=[instance.state],
            add_to_sets={"waiting_jobs": {verdict.job.job_id}} if restart else None)]
        updates += self.job_verdict_updates(instance.container_inst_id, verdict)
        return self.db.transact([*updates, *also])

    def job_verdict_updates(self, inst_id: str, verdict: JobVerdict) -> list[Update]:
        """The suspect's verdict (PENDING -> label, once) and the job's tally and state, on the
        tally as read: a concurrent verdict makes the transaction fail and the caller decide
        again on fresh counts, so the last verdict always sees every other one."""
        faults = self.faults
        job = verdict.job
        now = clock.now()
        suspect = faults.decide_suspect(job, inst_id, verdict.label, findings=verdict.findings,
                                        record=verdict.record, rebooting=verdict.waits_for_reboot, now=now)
        fields: dict[str, Any] = {}
        if verdict.last_error:
            fields["last_error"] = verdict.last_error[:1000]
        if verdict.deadline_at is not None:
            fields.update(self.job_deadline_fields(verdict.deadline_at))
        if verdict.relocate:
            fields["relocate"] = True
        if verdict.restart_reason:
            fields["restart_reason"] = verdict.restart_reason[:500]
        terminal = verdict.to.is_terminal
        if terminal:
            fields.update(self.stop_fanout_fields(job.attempt, verdict.last_error or verdict.reason, now))
            fields.update(self.job_deadline_fields(now + 60))
        counts = {"fault.decided": 1}
        if verdict.label in FATAL_SUSPECT_VERDICTS:
            counts["fault.fatal"] = 1
        if verdict.label is SuspectVerdict.REBOOT:
            counts["fault.reboot"] = 1
        if verdict.waits_for_reboot:
            counts["fault.rebooting"] = 1
        if verdict.infra_hint:
            counts["fault.infra"] = 1
        if verdict.held:
            counts["fault.held"] = 1
        if verdict.hold_spend is not None:
            # Charged when the held job goes on (BreakerHold.spend), not while it waits.
            fields["breaker_hold"] = {"attempt": job.attempt, "spend": verdict.hold_spend}
        if verdict.spend:
            counts[_SPEND_COUNTER[verdict.spend]] = 1
        condition, values, names = faults.tally_condition(job)
        update = self.job_transition(
            job.job_id, verdict.to, from_states=[job.state], attempt=job.attempt,
            reason=verdict.reason or f"verdict {verdict.label.value} on {inst_id}", actor="recovery",
            set_fields=fields, increments=counts, extra_condition=condition, extra_values=values,
            extra_names=names)
        if verdict.to is job.state:
            # Not a state change: the verdict is on the suspect item. One history entry per
            # checked node would fill the job's bounded history (pushing its real changes
            # out) and make the hot job item, written by every verdict, grow with the job.
            update.history_entry = None
        return [suspect, update]

    def claim_reboot(self, instance: Instance, now: float) -> bool:
        """The intent to call the reboot API, committed before the call (one caller at a
        time; a claim whose answer was never recorded is taken over only by
        :meth:`take_over_reboot_claim`)."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reboot_claimed_at": now},
            extra_condition="#rq = :rq AND attribute_not_exists(#rc) AND attribute_not_exists(#ri)",
            extra_values={":rq": instance.reboot_requested_at},
            extra_names={"#rq": "reboot_requested_at", "#rc": "reboot_claimed_at", "#ri": "reboot_issued_at"},
        ))

    def take_over_reboot_claim(self, instance: Instance, now: float) -> bool:
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reboot_claimed_at": now},
            extra_condition="#rq = :rq AND #rc = :rc AND attribute_not_exists(#ri)",
            extra_values={":rq": instance.reboot_requested_at, ":rc": instance.reboot_claimed_at},
            extra_names={"#rq": "reboot_requested_at", "#rc": "reboot_claimed_at", "#ri": "reboot_issued_at"},
        ))

    def record_reboot_issued(self, instance: Instance, path: str, now: float, deadline_at: float) -> bool:
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reboot_issued_at": now, "reboot_path": path}, deadline_at=deadline_at,
            extra_condition="#rq = :rq", extra_values={":rq": instance.reboot_requested_at},
            extra_names={"#rq": "reboot_requested_at"},
        ))

    def release_reboot_claim(self, instance: Instance, claimed_at: float, retry_at: float) -> bool:
        """The reboot API refused the call (nothing happened): let the next try issue it."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            remove_fields=["reboot_claimed_at"], deadline_at=retry_at,
            extra_condition="#rq = :rq AND #rc = :rc AND attribute_not_exists(#ri)",
            extra_values={":rq": instance.reboot_requested_at, ":rc": claimed_at},
            extra_names={"#rq": "reboot_requested_at", "#rc": "reboot_claimed_at", "#ri": "reboot_issued_at"},
        ))

    def record_agent_disconnected(self, instance: Instance, at: float, version: int) -> bool:
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"disconnected_at": at, "disconnected_version": version},
            extra_condition="#rq = :rq AND attribute_not_exists(#dc)",
            extra_values={":rq": instance.reboot_requested_at},
            extra_names={"#rq": "reboot_requested_at", "#dc": "disconnected_at"},
        ))

    def mark_instance_back(self, instance: Instance, now: float) -> bool:
        """REBOOTING -> AVAILABLE, once per reboot. The jobs waiting for it stay listed until
        each is released (:meth:`release_waiting_job`); a deadline lets the sweep finish that
        if this delivery dies."""
        waiting = bool(instance.waiting_jobs)
        fields: dict[str, Any] = {"returned_at": now}
        remove: list[str] = []
        sync: list[Update] = []
        if instance.cordoned:  # healthy again: its cordon goes with the reboot (same transaction)
            more, remove, update = self.cordons.uncordon_updates(instance.container_inst_id, now)
            fields.update(more)
            sync.append(update)
        return self.db.transact([self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING], to=InstanceState.AVAILABLE,
            set_fields=fields, remove_fields=remove, deadline_at=now + 60 if waiting else None,
            clear_deadline=not waiting,
            extra_condition="#rq = :rq", extra_values={":rq": instance.reboot_requested_at},
            extra_names={"#rq": "reboot_requested_at"},
        ), *sync])

    def release_waiting_job(self, inst_id: str, job: Job | None, job_id: str) -> bool:
        """The node is back: it no longer holds ``job_id``'s gang restart. The job's count of
        rebooting nodes goes down once (its suspect item's ``rebooting`` flag) in the same
        transaction as the instance lets the job go."""
        leave = self.instance_update(
            inst_id, delete_from_sets={"waiting_jobs": {job_id}}, extra_condition="contains(#wj, :j)",
            extra_values={":j": job_id}, extra_names={"#wj": "waiting_jobs"})
        if job is None or not job.in_fault:
            return self.db.apply(leave)
        faults = self.faults
        suspect = faults.get_suspect(job.job_id, job.attempt, inst_id)
        if suspect is None or not suspect.rebooting:
            return self.db.apply(leave)
        return self.db.transact([leave, faults.node_back(job, inst_id), faults.tally_back(job)])

    def clear_waiting_deadline(self, inst_id: str) -> bool:
        """Every waiting job was released: the sweep has nothing left on the node."""
        return self.db.apply(self.instance_update(
            inst_id, from_states=[InstanceState.AVAILABLE], clear_deadline=True,
            extra_condition="attribute_not_exists(#wj) OR size(#wj) = :zero",
            extra_values={":zero": 0}, extra_names={"#wj": "waiting_jobs"}))

    def time_out_instance(self, instance: Instance, *, quarantine: bool, what: str,
                          failures: Sequence[JobFailure], actor: str = "sweep",
                          fault_history: list[dict[str, Any]] | None = None,
                          breaker_blocked: dict[str, Any] | None = None,
                          breaker: Update | None = None, cordon: dict[str, Any] | None = None,
                          also: Sequence[Update] = ()) -> bool:
        """The instance's health check or reboot ran out of time: the instance leaves
        recovery (QUARANTINED, or SUSPECT when nothing proved it faulty, when the breaker
        held its quarantine back — ``breaker_blocked`` — or observe mode left it undrained)
        and every job waiting for it fails (or, relocatable, no longer waits for it and
        counts it unusable), atomically, with the breaker's new state."""
        faults = self.faults
        inst_id = instance.container_inst_id
        fields: dict[str, Any] = {"quarantine_reason": what[:500]}
        if quarantine:
            fields["drain_pending"] = True
        if fault_history is not None:
            fields["fault_history"] = fault_history
        if breaker_blocked is not None and not quarantine:
            fields["breaker_blocked"] = breaker_blocked
        cordon_sync: list[Update] = []
        if cordon is not None and not quarantine:  # left undrained: out of placement by its cordon
            version = clock.now()
            fields.update(self.cordons.cordon_fields(cordon, version))
            cordon_sync.append(self.cordons.sync_update(inst_id, version))
        updates = [self.instance_update(
            inst_id, from_states=[instance.state],
            to=InstanceState.QUARANTINED if quarantine else InstanceState.SUSPECT,
            set_fields=fields, remove_fields=["hc_jobs", "hc_left", "waiting_jobs", "hc_lease_until",
                                              "hc_owner", "hc_job_slot", *HealthCheckSlots.wait_attributes()],
            deadline_at=clock.now() + 60 if quarantine else None, clear_deadline=not quarantine)]
        if breaker is not None:
            updates.append(breaker)
        updates += cordon_sync
        if instance.state is InstanceState.HEALTH_CHECKING:
            updates += self.slots.release(instance)
        now = clock.now()
        updates += self.faults.verdict_after_leaving(
            instance, {"verdict": "timeout", "reason": what[:300]},
            InstanceState.QUARANTINED if quarantine else InstanceState.SUSPECT, now)
        for failure in failures:
            job = failure.job
            if failure.moves:
                # Relocatable, waiting to restart: the node is unusable now, not awaited.
                counts = {"fault.fatal": 1}
                if failure.suspect_pending:
                    counts["fault.decided"] = 1
                    updates.append(faults.decide_suspect(job, inst_id, failure.label, findings={},
                                                         record=None, rebooting=False, now=now))
                else:
                    updates.append(faults.relabel_suspect(job, inst_id, failure.label))
                    if failure.suspect_rebooting:
                        counts["fault.rebooting"] = -1
                condition, values, names = faults.tally_condition(job)
                updates.append(Update(
                    table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
                    increments=counts, set_fields={"relocate": True},
                    condition=f"#st = :st AND {condition}",
                    condition_values={":st": job.state.value, **values},
                    condition_names={"#st": "job_state", **names}))
                continue
            updates.append(faults.relabel_suspect(job, inst_id, failure.label))
            updates.append(self.job_transition(
                job.job_id, JobState.FAILED, from_states=[job.state], attempt=job.attempt,
                reason=failure.reason, actor=actor,
                set_fields={"last_error": failure.reason[:1000],
                            **self.stop_fanout_fields(job.attempt, failure.reason, now),
                            **self.job_deadline_fields(now + 60)}))
        return self.db.transact([*updates, *also])

    # ======================================================= generic (shared) API
    def apply(self, update: Update) -> bool:
        return self.db.apply(update)

    def apply_returning(self, update: Update) -> dict[str, Any] | None:
        return self.db.apply_returning(update)

    def transact(self, updates: Sequence[Update]) -> bool:
        return self.db.transact(updates)

    def _batch_get(self, table: str, keys: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.db.batch_get(table, keys)

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
        """A job state change, checked against the one job state machine."""
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
        remove = [] if to in HOLDING_RANK_STATES else [JOB_BY_INSTANCE_PK]
        if to not in HEARTBEAT_WATCHED_RANK_STATES:
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
            remove += _DEADLINE
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
        return list(_DEADLINE)
