"""Heartbeat writes per partition key (issue 40, defect 9): the busiest partition of the job
table and of each of its indexes, in write units a second, while a cluster reports.

    python -m bench.heartbeat_partitions_bench     # BENCH_HB_NODES=1000 by default

``BENCH_HB_NODES`` nodes (1,000: the in-memory store's update expressions cost ~5 ms each,
so 10,000 nodes' two cycles would take an hour of CPU), one RUNNING job of 8 ranks each,
report their 8 tasks every 30 s (spread evenly over the 30 s) through the real heartbeat
service, on the in-memory DynamoDB (``local_mode.sim.dynamo``) with its partition model
measuring, per partition key value of the table and of each GSI, the write units each
second took (limits lifted: the demand is measured, not what throttling would let
through). One cycle seeds every rank's first heartbeat, the next cycle is measured (each
rank reports once in it). Twice: with the index as it is (``by-heartbeat-slot``: 32
shards, 90 s slots, KEYS_ONLY) and as it was (one partition key ``WATCHED``, the exact
heartbeat time as sort key, ALL projection).

DynamoDB takes about 1,000 write units a second per partition (table or GSI); a GSI
partition over it throttles the base table's writes (GSI back-pressure). Every load of a
heartbeat-index partition grows linearly with the report rate (reports spread evenly), so
the figures are also given for ``PROJECTED_NODES`` (10,000) nodes: the busiest partition's
units times 10,000 / nodes (for the shards, the busiest of 32 samples: an upper bound). A
node's own partitions (``by-container-instance``) do not grow with the cluster.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from local_mode.sim.clock import SimClock

NODES = int(os.environ.get("BENCH_HB_NODES", "1000"))
PROJECTED_NODES = 10_000
RANKS = 8
INTERVAL = 30
T0 = 1_734_220_020.0


def _old_fields(job_id: str, rank: int, at: float, slot: int) -> dict[str, Any]:
    """What a heartbeat wrote before issue 40: one constant partition key, the exact time."""
    from gpu_recovery.constants import HB_AT, HB_BUCKET, HB_PK, HB_SK

    return {HB_AT: at, HB_PK: HB_BUCKET, HB_SK: at}


@contextmanager
def _design(old: bool, sim_clock: SimClock) -> Iterator[Callable[[], Any]]:
    """The job table's definition and heartbeat fields of one design (the old one: its index
    with an ALL projection, its fields); yields a factory of the in-memory store."""
    from gpu_recovery import constants as C
    from gpu_recovery.repository.heartbeat import HeartbeatRepository
    from local_mode.sim.dynamo import MemoryDynamo

    definitions = C.table_definitions()
    job = dict(definitions["job"])
    if old:
        job["GlobalSecondaryIndexes"] = [
            {**g, "Projection": {"ProjectionType": "ALL"}} if g["IndexName"] == C.JOB_BY_HEARTBEAT_INDEX
            else g for g in job["GlobalSecondaryIndexes"]]
    saved = HeartbeatRepository.heartbeat_fields

    def store() -> Any:
        db = MemoryDynamo({C.DEFAULT_INSTANCE_TABLE_NAME: "instance"}, now=sim_clock.now, validate=False)
        db.create_table(TableName=C.DEFAULT_JOB_TABLE_NAME, **job)
        return db

    if old:
        setattr(HeartbeatRepository, "heartbeat_fields", staticmethod(_old_fields))  # noqa: B010
    try:
        yield store
    finally:
        setattr(HeartbeatRepository, "heartbeat_fields", staticmethod(saved))  # noqa: B010




def task_arn(job: str, rank: int) -> str:
    return f"arn:aws:ecs:us-east-1:123456789012:task/gpu-cluster/{job}r{rank}a1"


def measure(old: bool, nodes: int = NODES) -> dict[str, Any]:
    from gpu_recovery import clock
    from gpu_recovery import constants as C
    from gpu_recovery.constants import JobState, RankState
    from gpu_recovery.domain.heartbeat_policy import HeartbeatSettings, ReportedTask
    from gpu_recovery.domain.models import Instance, Job, Rank
    from gpu_recovery.heartbeat.service import HeartbeatService
    from gpu_recovery.recovery.notices import Notices
    from gpu_recovery.repository import Repository
    from gpu_recovery.repository.heartbeat import HeartbeatRepository
    from local_mode.sim.dynamo import PartitionThroughput

    started = time.perf_counter()
    sim_clock = SimClock(T0)  # the simulated wall clock the store's seconds are counted on
    clock.set_clock(sim_clock.now, lambda s: None)
    try:
        with _design(old, sim_clock) as store:
            db = store()
            repo = Repository(db, C.DEFAULT_JOB_TABLE_NAME, C.DEFAULT_INSTANCE_TABLE_NAME)
            # Nothing here reaches ECS, SNS or the recovery loop (every rank keeps reporting).
            unused: Any = None
            service = HeartbeatService(HeartbeatRepository(repo), HeartbeatSettings(), unused,
                                       Notices(repo.notices, repo.faults, unused), lambda: unused)
            for n in range(nodes):
                node, job = f"node{n:05d}", f"job{n:05d}"
                repo.instances.put_instance_if_absent(Instance(node))
                repo.registrations.create_job_if_absent(Job(job, JobState.RUNNING, RANKS, created_at=T0,
                                                            updated_at=T0))
                for r in range(RANKS):
                    rank = Rank(job, r, RankState.RUNNING, 1, task_arn(job, r), "td", node)
                    repo.registrations.put_rank_registration(rank)

            def cycle(start: float) -> None:
                for n in range(nodes):
                    sim_clock.set(start + (n * INTERVAL) / nodes)  # evenly over the interval
                    job = f"job{n:05d}"
                    service.report_tasks(f"node{n:05d}", sim_clock.now(),
                                         [ReportedTask(task_arn(job, r)) for r in range(RANKS)])

            cycle(T0)
            throughput = PartitionThroughput(math.inf, math.inf)
            db.partition_throughput = throughput
            cycle(T0 + INTERVAL)
            peaks, taken = throughput.peaks(), throughput.write_units()
    finally:
        clock.reset_clock()
    by_index: dict[str, tuple[str, float]] = {}
    for (table, index, key), units in peaks.items():
        name = f"{table}/{index or '(table)'}"
        if units > by_index.get(name, ("", -1.0))[1]:
            by_index[name] = (str(key), units)
    busiest = max(by_index.items(), key=lambda kv: kv[1][1])
    index = f"{C.DEFAULT_JOB_TABLE_NAME}/{C.JOB_BY_HEARTBEAT_INDEX}"
    written = {i for _, i, _ in taken}
    return {
        "design": ("before issue 40 (one key, ALL)" if old
                   else "by-heartbeat-slot (32 shards, 90 s slots, KEYS_ONLY)"),
        "nodes": nodes, "rank_heartbeats_per_second": round(nodes * RANKS / INTERVAL),
        "busiest_partition": {"where": busiest[0], "key": busiest[1][0], "wcu_per_second": busiest[1][1]},
        "heartbeat_index_busiest_wcu_per_second": by_index.get(index, ("", 0.0))[1],
        f"heartbeat_index_busiest_wcu_per_second_at_{PROJECTED_NODES}_nodes": round(
            by_index.get(index, ("", 0.0))[1] * PROJECTED_NODES / nodes),
        "heartbeat_index_partitions_written": len({k for _, i, k in peaks if i == C.JOB_BY_HEARTBEAT_INDEX}),
        "over_1000_wcu_per_second": sorted(f"{t}/{i or '(table)'}:{k}" for (t, i, k), u in peaks.items()
                                           if u > 1000)[:5],
        "wcu_per_node_report": round(sum(taken.values()) / nodes, 2),
        "wcu_per_node_report_by_index": {
            i or "(table)": round(sum(u for (_, j, _), u in taken.items() if j == i) / nodes, 2)
            for i in sorted(written)},
        "seconds": round(time.perf_counter() - started, 1),
    }


def run() -> dict[str, Any]:
    result = {"after": measure(False), "before": measure(True)}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run()
