"""The by-deadline index split over several partition keys (``deadline_index_shards``): one
partition takes about 1,000 writes a second, and a 1,024-rank cascade puts more deadlines in
the index than that (docs/sizing.md, docs/benchmarks.md). Every item that gets a deadline
lands in its key's shard, every reader reads every shard, and raising the count strands
nothing written before."""

from __future__ import annotations

from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.shards import stable_shard
from gpu_recovery.domain.states import JobState
from gpu_recovery.repository import Repository
from gpu_recovery.repository.scheduling import SchedulingRepository
from local_mode.campaigns import recovery as campaign
from local_mode.campaigns.runner import run_flow
from local_mode.invariants import forgotten_validations
from local_mode.sim.dynamo import MemoryDynamo
from tests.fixtures.memory_repository import INSTANCES, JOBS, T0

NODES = [f"node-{i:02d}" for i in range(24)]


def _tables() -> MemoryDynamo:
    return MemoryDynamo({JOBS: "job", INSTANCES: "instance"})


def _repository(db: MemoryDynamo, shards: int) -> Repository:
    return Repository(db, JOBS, INSTANCES, deadline_shards=shards)


def _buckets(db: MemoryDynamo, table: str) -> set[Any]:
    return {item[C.DEADLINE_PK] for item in db.scan_all(table) if C.DEADLINE_PK in item}


def _open_checks(repo: Repository, nodes: list[str]) -> None:
    for i, node in enumerate(nodes):
        assert repo.health_checks.open(node, "j1", now=T0, retry_at=T0 + 60 + i)


def test_each_item_takes_its_keys_shard_and_every_shard_is_read_oldest_first() -> None:
    db = _tables()
    repo = _repository(db, 4)
    _open_checks(repo, NODES)
    buckets = _buckets(db, INSTANCES)
    assert buckets <= set(repo.tables.db.deadline_buckets()) and len(buckets) == 4
    due = repo.deadlines.due_instances(T0 + 10_000)
    assert [i.container_inst_id for i in due] == NODES  # all of them, oldest deadline first
    assert [i.container_inst_id for i in repo.deadlines.due_instances(T0 + 10_000, limit=5)] == NODES[:5]
    assert {i.container_inst_id for i in repo.deadlines.due_instances(T0 + 60 + 11)} == set(NODES[:12])
    paged = [i.container_inst_id for page in repo.deadlines.due_instance_pages(T0 + 10_000, 3) for i in page]
    assert sorted(paged) == NODES and all(page for page in repo.deadlines.due_instance_pages(T0 + 10_000, 3))


def test_one_shard_is_the_unsharded_index() -> None:
    db = _tables()
    repo = _repository(db, 1)
    _open_checks(repo, NODES[:3])
    assert _buckets(db, INSTANCES) == {C.DEADLINE_BUCKET}
    assert repo.tables.db.deadline_buckets(rotate=7) == [C.DEADLINE_BUCKET]


def test_raising_the_shard_count_strands_nothing_written_before() -> None:
    db = _tables()
    _open_checks(_repository(db, 1), NODES[:6])
    _open_checks(_repository(db, 3), NODES[6:12])
    wider = _repository(db, 8)
    assert {i.container_inst_id for i in wider.deadlines.due_instances(T0 + 10_000)} == set(NODES[:12])


def test_the_jobs_holding_nodes_are_found_in_every_shard() -> None:
    db = _tables()
    repo = _repository(db, 4)
    jobs = [f"job-{i}" for i in range(12)]
    for job_id in jobs:
        assert repo.registrations.create_job_if_absent(Job(job_id, JobState.RUNNING, world_size=2,
                                                           created_at=T0))
        assert repo.rank_events.enter_recovery(job_id, 1, from_states=[JobState.RUNNING], reason="GPU fault",
                                               now=T0, deadline_at=T0 + 60)
    held = {item["job_id"] for item in SchedulingRepository(repo.jobs).jobs_holding_nodes()}
    assert held == set(jobs)
    assert len(_buckets(db, JOBS)) > 1 and _buckets(db, JOBS) <= set(repo.tables.db.deadline_buckets())


def test_an_item_put_whole_with_a_deadline_takes_its_keys_shard_too() -> None:
    """The gang preflight's item is put (PutItem), not updated: it is sharded the same way."""
    db = _tables()
    repo = _repository(db, 4)
    jobs = [f"job-{i}" for i in range(12)]
    for job_id in jobs:
        assert repo.preflight.start(job_id, 2, {}, deadline_at=T0 + 60)
    placed = {item[C.JOB_PK]: item[C.DEADLINE_PK] for item in db.scan_all(JOBS)}
    assert placed == {C.preflight_item_key(job_id, 2): C.deadline_bucket(stable_shard(
        C.preflight_item_key(job_id, 2), 4)) for job_id in jobs}
    assert len(set(placed.values())) > 1


def test_the_backstop_finds_a_validating_node_due_in_any_shard() -> None:
    """local_mode.invariants: a node in validation after repair is due in its key's shard,
    not only in the unsharded bucket (else every sharded run would report it forgotten)."""
    db = _tables()
    repo = _repository(db, 4)
    for node in NODES[:8]:
        fields = {"instance_state": "REBOOTING", "validation": {"since": T0}}
        assert repo.tables.db.apply(repo.instances.instance_update(node, set_fields=fields,
                                                                   deadline_at=T0 + 60, allow_missing=True))
    assert len(_buckets(db, INSTANCES)) > 1
    assert forgotten_validations(repo, T0 + 30, NODES[:8]) == {}
    late = forgotten_validations(repo, T0 + 60 + 3_600, NODES[:8])
    assert set(late) == set(NODES[:8]) and all("due" in why for why in late.values())


class _ShardedGpuFault(campaign.RecoveryScenario):
    def world_options(self) -> dict[str, Any]:
        options = super().world_options()
        options["extra_env"] = {**options["extra_env"], C.ENV_DEADLINE_INDEX_SHARDS: "4"}
        return options


def test_a_gpu_fault_is_recovered_with_the_index_in_four_shards() -> None:
    result = run_flow(_ShardedGpuFault("gpu_fault"))
    assert result.problems() == []
    def sweep_reads(calls: list[Any]) -> int:
        return sum(1 for c in calls if c.operation == "Query" and c.site.startswith("recovery/sweep.py"))

    sharded, unsharded = sweep_reads(result.calls), sweep_reads(campaign.run("gpu_fault").calls)
    # Each of the sweep's reads once a shard (a run or two more or fewer: the runs differ in
    # their timing by a few seconds).
    assert sharded > 3 * unsharded
