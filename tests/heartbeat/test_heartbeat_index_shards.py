"""The heartbeat index's partition keys: 32 deployed, fewer where the functions are told so
(``HEARTBEAT_INDEX_SHARDS``: local mode's small campaign worlds); a rank's heartbeat lands in one
of them and the sweep reads every one of them, whatever their count."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import ENV_HEARTBEAT_INDEX_SHARDS, HB_PK, HB_SHARDS, JobState, RankState
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.repository import Repository
from gpu_recovery.repository.heartbeat import HeartbeatRepository
from gpu_recovery.settings import SettingsError, heartbeat_index_shards
from local_mode.sim.dynamo import MemoryDynamo
from tests.fixtures.memory_repository import INSTANCES, JOBS
from tests.heartbeat.world import task_arn

T0 = 1_734_220_000.0


def test_the_functions_read_their_shard_count_and_refuse_more_than_deployed() -> None:
    assert heartbeat_index_shards({}) == HB_SHARDS == 32
    assert heartbeat_index_shards({ENV_HEARTBEAT_INDEX_SHARDS: "4"}) == 4
    for bad in ("0", "33", "four"):
        with pytest.raises(SettingsError, match=ENV_HEARTBEAT_INDEX_SHARDS):
            heartbeat_index_shards({ENV_HEARTBEAT_INDEX_SHARDS: bad})


@pytest.mark.parametrize("shards", [1, 4, HB_SHARDS])
def test_every_stale_rank_is_found_in_however_many_shards(shards: int) -> None:
    """40 ranks heartbeat at T0, 30 of them again at T0 + 300: the sweep's read at T0 + 200
    finds exactly the 10 silent ones, and every heartbeat sits in one of the ``shards`` keys."""
    base = Repository(MemoryDynamo({JOBS: "job", INSTANCES: "instance"}, now=lambda: T0), JOBS, INSTANCES)
    repo = HeartbeatRepository(base, shards=shards)
    base.registrations.create_job_if_absent(Job("j", JobState.RUNNING, 40, created_at=T0, updated_at=T0))
    for r in range(40):
        rank = Rank("j", r, RankState.RUNNING, 1, task_arn("j", r), "td", "node-a")
        assert base.registrations.put_rank_registration(rank)
        fresh = base.jobs.get_rank("j", r)
        assert fresh is not None
        assert repo.refresh_rank(fresh, repo.heartbeat_fields("j", r, T0 if r < 10 else T0 + 300, 90))
    keys = {item[HB_PK] for item in repo.stale_rank_items(T0 + 400)}
    assert len(keys) <= shards and all(int(key.rpartition("#")[2]) < shards for key in keys)
    stale = repo.stale_rank_items(T0 + 200)
    assert sorted(int(item["rank"]) for item in stale) == list(range(10))
