"""The recovery loop's items as the domain's objects, and back: jobs, ranks, instances.

Pure mapping (no DynamoDB call): the repositories read items and hand out
:class:`~gpu_recovery.domain.models.Job`, ``Rank`` and ``Instance``; the job and rank of a
registration are written as built here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpu_recovery.constants import (
    DEADLINE_SK,
    HC_WAIT_PK,
    INSTANCE_PK,
    JOB_BY_INSTANCE_PK,
    JOB_BY_TASK_PK,
    JOB_PK,
    job_item_key,
    rank_item_key,
)
from gpu_recovery.domain import goodput
from gpu_recovery.domain.breaker.hold import BreakerHold
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.models import EarlierTask, Instance, Job, Rank
from gpu_recovery.domain.relocation import RelocationWait
from gpu_recovery.domain.restart_wait import RestartWait
from gpu_recovery.domain.states import InstanceState, JobState, RankState
from gpu_recovery.repository import claim_fields
from gpu_recovery.repository.base import from_ddb, to_ddb


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
        restart_ran_marked=int(item.get(goodput.interval_mark_attribute(goodput.RESTART)) or 0) == attempt,
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
        hold_owed=BreakerHold.owed(item.get("breaker_hold"), attempt),
        network=dict(item.get("network") or {}),
        restart_wait=RestartWait.from_item(item.get("restart_wait"), attempt),
        checkpoint=dict(item.get("checkpoint") or {}),
        stopped=dict(item.get("stopped") or {}),
    )


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
            **({"network": job.network} if job.network else {}),
        }
    )


def is_rank_item(item: Mapping[str, Any]) -> bool:
    """A rank's item, not the launch lease alone of a rank never started (``gang_fanouts``:
    it has no rank until the rank is registered over it)."""
    return "rank_state" in item


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
        coupled=bool(item.get("coupled")),
        last_heartbeat_at=item.get("last_heartbeat_at"),
        registered_at=item.get("registered_at", 0.0),
        running_at=item.get("running_at"),
        stop_requested_at=item.get("stop_requested_at"),
        launch_attempt=item.get("launch_attempt"),
        launch_lease_until=item.get("launch_lease_until"),
        gpus=int(item.get("gpus") or 0),
        subnet=str(item.get("subnet") or ""),
        earlier_tasks=tuple(EarlierTask(int(t["attempt"]), str(t["task_arn"]),
                                        str(t.get("task_definition_arn") or ""))
                            for t in item.get("earlier_tasks") or ()),
    )


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
    if rank.subnet:
        item["subnet"] = rank.subnet
    if rank.earlier_tasks:
        item["earlier_tasks"] = [{"attempt": t.attempt, "task_arn": t.task_arn,
                                  "task_definition_arn": t.task_definition_arn} for t in rank.earlier_tasks]
    if rank.is_live and rank.container_inst_id:
        item[JOB_BY_INSTANCE_PK] = rank.container_inst_id
    if rank.exit_code is not None:
        item["exit_code"] = rank.exit_code
    if rank.last_heartbeat_at is not None:
        item["last_heartbeat_at"] = rank.last_heartbeat_at
    return to_ddb({k: v for k, v in item.items() if v != ""})


def instance_from_item(item: Mapping[str, Any]) -> Instance:
    item = from_ddb(dict(item))
    return Instance(
        container_inst_id=item[INSTANCE_PK],
        state=InstanceState(item.get("instance_state", InstanceState.AVAILABLE.value)),
        container_instance_arn=item.get("container_instance_arn", ""),
        ec2_instance_id=item.get("ec2_instance_id", ""),
        tasks=claim_fields.claims_of(item),
        hc_jobs=set(item.get("hc_jobs", set())),
        hc_requested_at=item.get("hc_requested_at"),
        hc_owner=str(item.get("hc_owner") or ""),
        hc_job_slot=bool(item.get("hc_job_slot", True)),
        hc_slot_shard=None if item.get("hc_slot_shard") is None else int(item["hc_slot_shard"]),
        hc_slot_token=str(item.get("hc_slot_token") or ""),
        hc_waiting_for_slot=bool(item.get(HC_WAIT_PK)),
        hc_grouped=bool(item.get("hc_grouped", False)),
        hc_left=set(item.get("hc_left", set())),
        reboot_requested_at=item.get("reboot_requested_at"),
        reboot_claimed_at=item.get("reboot_claimed_at"),
        reboot_issued_at=item.get("reboot_issued_at"),
        reset_pending=bool(item.get("reset_pending", False)),
        disconnected_at=item.get("disconnected_at"),
        disconnected_version=int(item.get("disconnected_version", 0)),
        disconnected_agent=str(item.get("disconnected_agent") or ""),
        reconnected_at=item.get("reconnected_at"),
        reconnected_version=int(item.get("reconnected_version", 0)),
        reconnected_agent=str(item.get("reconnected_agent") or ""),
        boot_time=item.get("boot_time"),
        last_report_at=item.get("last_report_at"),
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
        suspect_fence=dict(item.get("suspect_fence") or {}),
        suspect_origin=str(item.get("suspect_origin") or ""),
        warning=dict(item.get("warning") or {}),
        notice=dict(item.get("notice") or {}),
        validation=dict(item.get("validation") or {}),
        last_validation=dict(item.get("last_validation") or {}),
        replacement_watch=dict(item.get("replacement_watch") or {}),
    )
