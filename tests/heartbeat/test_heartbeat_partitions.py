"""The heartbeat index against DynamoDB's per-partition limits (issue 40, defect 9).

A second of a 10,000-node cluster's heartbeats (8 ranks a node, reports every 30 s: about
2,700 rank heartbeats a second), all moving their index entry (the worst second), on the
in-memory DynamoDB with its partition throughput model on: the sharded, slotted, KEYS_ONLY
index keeps every partition under its limit; the index as it was (one constant partition
key, the exact heartbeat time as sort key) throttles, and through GSI back-pressure the base
table's writes with it. At 1/SCALE of the cluster with the limits scaled alike (every load
here grows linearly with the cluster), to keep the quick tier quick; ``make bench``
(bench/heartbeat_bench.py) measures the whole cluster's second against the real limits.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.constants import HB_AT, HB_BUCKET, HB_PK, HB_SK, JobState, RankState
from gpu_recovery.domain.heartbeat_policy import HeartbeatSettings, ReportedTask
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.heartbeat.service import HeartbeatService
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.repository import Repository, base
from gpu_recovery.repository.base import is_contention
from gpu_recovery.repository.heartbeat import HeartbeatRepository
from local_mode.sim.dynamo import MemoryDynamo, PartitionThroughput
from local_mode.sim.dynamo.throughput import PARTITION_READ_UNITS_PER_SECOND, PARTITION_WRITE_UNITS_PER_SECOND
from tests.fixtures.clock import ManualClock
from tests.fixtures.memory_repository import INSTANCES, JOBS
from tests.heartbeat.world import StubEcs, StubNotifier, StubRecovery, task_arn

T0 = 1_734_220_000.0
SCALE = 8
# x 8 ranks in one second: a 10,000-node cluster's second (2,667 rank heartbeats), / SCALE
NODES = 340 // SCALE
RANKS = 8
WRITE_LIMIT = PARTITION_WRITE_UNITS_PER_SECOND / SCALE


@pytest.fixture
def clk(monkeypatch: pytest.MonkeyPatch) -> Iterator[ManualClock]:
    c = ManualClock(T0)
    clock.set_clock(c, c.advance)  # a write's backoff passes simulated time, not real time
    # The backoff's jitter from a seeded source: the same second every run.
    monkeypatch.setattr(base, "random", random.Random(40))
    yield c
    clock.reset_clock()


def _cluster(clk: ManualClock) -> tuple[HeartbeatService, PartitionThroughput]:
    """NODES nodes, one RUNNING job of RANKS ranks each, every rank heartbeating once at T0
    (seeded with the throughput model off: the set-up is not the measured second)."""
    db = MemoryDynamo({JOBS: "job", INSTANCES: "instance"}, now=clk)
    repo = Repository(db, JOBS, INSTANCES)
    service = HeartbeatService(HeartbeatRepository(repo), HeartbeatSettings(), StubEcs(),
                               Notices(repo.notices, repo.faults, StubNotifier()), StubRecovery)
    for n in range(NODES):
        node, job = f"node{n:04d}", f"job{n:04d}"
        repo.instances.put_instance_if_absent(Instance(node))
        repo.registrations.create_job_if_absent(Job(job, JobState.RUNNING, RANKS, created_at=T0,
                                                    updated_at=T0))
        for r in range(RANKS):
            rank = Rank(job, r, RankState.RUNNING, 1, task_arn(job, r), "td", node)
            assert repo.registrations.put_rank_registration(rank)
        _report(service, n, T0)
    throughput = PartitionThroughput(WRITE_LIMIT, PARTITION_READ_UNITS_PER_SECOND / SCALE)
    db.partition_throughput = throughput
    return service, throughput


def _report(service: HeartbeatService, n: int, at: float) -> Any:
    job = f"job{n:04d}"
    return service.report_tasks(f"node{n:04d}", at, [ReportedTask(task_arn(job, r)) for r in range(RANKS)])


def _one_second(clk: ManualClock, service: HeartbeatService) -> tuple[int, float, int]:
    """Every node reports within one second, 100 s after the seed (every rank in a new
    slot): (ranks refreshed, seconds it took: a throttled write's backoff waits, reports
    still refused after every retry: the agent's next report carries them)."""
    start = clk.advance(100)
    refreshed = refused = 0
    for n in range(NODES):
        try:
            refreshed += _report(service, n, clk()).refreshed
        except ClientError as error:
            if not is_contention(error):
                raise
            refused += 1
    return refreshed, clk() - start, refused


def test_a_second_of_a_large_cluster_s_heartbeats_stays_under_every_partition_limit(clk: ManualClock) -> None:
    service, throughput = _cluster(clk)
    refreshed, took, refused = _one_second(clk, service)
    assert (refreshed, took, refused, dict(throughput.throttled)) == (NODES * RANKS, 0, 0, {})
    partition, units = throughput.busiest()
    assert units <= WRITE_LIMIT / 2, f"{partition} took {units} WCU in one second"
    # The index is sharded: every shard took a share of the second's moves.
    index = {p: u for p, u in throughput.peaks().items() if p[1] == "by-heartbeat-slot"}
    assert len(index) == 32 and sum(index.values()) == 2 * NODES * RANKS


def test_the_old_heartbeat_index_throttles_the_base_table(clk: ManualClock,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The same second with the index as it was (one partition key, the exact heartbeat as
    sort key): its one partition takes two units per heartbeat (the entry moves), twice its
    limit: the base table's writes are refused with it (GSI back-pressure) and the second's
    reports get through only with their backoffs, over seconds (or not at all: a report
    whose retries all meet the full partition is refused)."""
    monkeypatch.setattr(HeartbeatRepository, "heartbeat_fields", staticmethod(
        lambda job_id, rank, at, slot: {HB_AT: at, HB_PK: HB_BUCKET, HB_SK: at}))
    service, throughput = _cluster(clk)
    _, took, _ = _one_second(clk, service)
    assert throughput.throttled["IndexWriteKeyRangeThroughputExceeded"] > 0
    # The one partition takes its limit a second: the second's index writes take seconds.
    assert took > 2 * NODES * RANKS / WRITE_LIMIT - 1, took
    (_, index, key), units = throughput.busiest()
    assert (index, key) == ("by-heartbeat-slot", HB_BUCKET) and units > WRITE_LIMIT - 2  # full
