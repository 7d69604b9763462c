"""The nodes a gang still holds, as the scheduler's preemption counts them (``running_gangs``):
read from its attempt's latch shards (``ceil(n / 64)`` items), never from its rank items, so a
blocked job's tick costs the same whatever the size of the gangs it could preempt; a rank that
ended leaves its node (freed, counted once: in ECS's free GPUs, not again in the gang's)."""

from __future__ import annotations

from typing import Any

import boto3

from gpu_recovery import constants as C
from gpu_recovery.domain.latch import shard_count
from gpu_recovery.domain.time_sharing import SuspendKind
from gpu_recovery.queue.time_sharing import TimeSharing
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.time_sharing import HoldingRepository, QuotaCharge, QuotaRepository
from gpu_recovery.settings import TimeSharingSettings
from tests.recovery.fakes import REGION, World, world

RANKS = 130  # three latch shards


def holding_gang(w: World, nodes: list[str]) -> HoldingRepository:
    """A running queue job "j" of 8-GPU ranks on ``nodes``, charged to alice (the launch's claim)."""
    w.register_queue_job("j", nodes)
    ddb = boto3.resource("dynamodb", region_name=REGION)
    ddb.create_table(TableName="quota", BillingMode="PAY_PER_REQUEST", **C.table_definitions()["quota"])
    holding = HoldingRepository(w.repo.jobs, QuotaRepository(ddb, "quota"))
    charge = QuotaCharge("alice", 10, len(nodes))
    assert w.repo.tables.db.transact([
        Update(table="jobs", key={C.JOB_PK: C.job_item_key("j")},
               set_fields={**holding.charge_fields(charge, w.now[0]), "gpus_per_node": 8,
                           "launched_at": w.now[0]}),
        holding.quotas.charge_update(charge, limit_read=None, default_limit=None)])
    return holding


def keys_read(w: World, monkeypatch: Any) -> list[str]:
    """Every job-table key read from now on (GetItem and BatchGetItem)."""
    db = w.repo.tables.db
    read: list[str] = []
    get, batch_get = db.get, db.batch_get

    def spied_get(table, key, *args, **kwargs):  # type: ignore[no-untyped-def]
        read.append(str(key.get(C.JOB_PK)))
        return get(table, key, *args, **kwargs)

    def spied_batch_get(table, keys, *args, **kwargs):  # type: ignore[no-untyped-def]
        read.extend(str(k.get(C.JOB_PK)) for k in keys)
        return batch_get(table, keys, *args, **kwargs)

    monkeypatch.setattr(db, "get", spied_get)
    monkeypatch.setattr(db, "batch_get", spied_batch_get)
    return read


def test_a_running_gangs_nodes_are_read_from_its_latch_shards_not_its_ranks(monkeypatch) -> None:
    """Given a running 130-rank NORMAL queue job, When a blocked job of higher priority looks for
    victims, Then the gang's footprint is its 130 nodes with 8 GPUs each, from its three latch
    shards: no rank item read, and read once a tick however often it is asked."""
    with world() as w:
        nodes = [f"node-{i:03d}" for i in range(RANKS)]
        holding = holding_gang(w, nodes)
        sharing = TimeSharing(w.repo.latches, holding, None, TimeSharingSettings())  # type: ignore[arg-type]
        sharing.housekeeping(w.now[0])
        read = keys_read(w, monkeypatch)
        [gang] = sharing.running_gangs(below=100)
        assert sharing.running_gangs(below=100) == [gang]
        assert gang.job_id == "j" and gang.footprint == dict.fromkeys(nodes, 8)
        assert sorted(read) == sorted(C.latch_shard_key("j", 1, s) for s in range(shard_count(RANKS)))


def test_a_gang_being_suspended_counts_only_the_nodes_its_unstopped_ranks_hold(monkeypatch) -> None:
    """Given the 130-rank job preempted for job "h" and 70 of its ranks stopped, When job "h"'s tick
    counts what the suspension frees, Then the gang holds the other 60 ranks' nodes only (the 70
    freed are in ECS's free GPUs already, not counted twice), read from the latch shards."""
    with world() as w:
        nodes = [f"node-{i:03d}" for i in range(RANKS)]
        holding = holding_gang(w, nodes)
        arns = [w.repo.jobs.get_rank("j", r).task_arn for r in range(RANKS)]
        assert w.service.request_suspend("j", 1, kind=SuspendKind.PREEMPTED, reason="preempted by job h",
                                         grace_seconds=60, actor="scheduler", by_job="h")
        assert w.service.go_suspend("j", 0, 1).action == "suspending"
        w.stopped_by_the_stack(arns[:70])
        assert w.repo.jobs.get_job("j").state is C.JobState.SUSPENDING
        sharing = TimeSharing(w.repo.latches, holding, None, TimeSharingSettings())  # type: ignore[arg-type]
        sharing.housekeeping(w.now[0])
        read = keys_read(w, monkeypatch)
        [gang] = sharing.running_gangs(below=0)
        assert gang.preempted_for == "h"
        assert gang.footprint == dict.fromkeys(nodes[70:], 8)
        assert all(key.startswith(C.latch_shard_key("j", 1, 0).rsplit("#", 1)[0]) for key in read), read
