"""Issue 28, no hot item: the cluster's health-check slots on shard items (the repository
against the in-memory DynamoDB)."""

from __future__ import annotations

from gpu_recovery import constants as C
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.shards import shard_shares, stable_shard
from gpu_recovery.repository import Repository
from gpu_recovery.repository.health_check_slots import Claim
from local_mode.sim.dynamo import MemoryDynamo

JOBS, INSTANCES = C.DEFAULT_JOB_TABLE_NAME, C.DEFAULT_INSTANCE_TABLE_NAME
T0 = 1_800_000_000.0


def _repo() -> Repository:
    return Repository(MemoryDynamo({JOBS: "job", INSTANCES: "instance"}), JOBS, INSTANCES)


def _pending(repo: Repository, node: str, job: str = "j1") -> Instance:
    assert repo.open_health_check(node, job, now=T0, retry_at=T0 + 60)
    instance = repo.get_instance(node)
    assert instance is not None
    return instance


def _claim(repo: Repository, instance: Instance, *, cluster: int, per_job: int = 10_000) -> Claim:
    return repo.claim_health_check(instance, f"sb-{instance.container_inst_id}", T0 + 75,
                                   owner="j1", per_job=per_job, cluster=cluster, now=T0)


def _shard_counts(repo: Repository) -> dict[int | None, int]:
    return {k: v for k, v in repo.slots.running_by_shard().items() if v}


def _nodes_of_shard(shard: int, shards: int, count: int) -> list[str]:
    found = []
    i = 0
    while len(found) < count:
        if stable_shard(f"n{i}", shards) == shard:
            found.append(f"n{i}")
        i += 1
    return found


def test_a_claim_takes_a_slot_on_its_nodes_shard_and_records_it() -> None:
    repo = _repo()
    instance = _pending(repo, "n1")
    assert _claim(repo, instance, cluster=2048) is Claim.CLAIMED
    claimed = repo.get_instance("n1")
    assert claimed is not None and claimed.hc_slot_shard == stable_shard("n1", C.HEALTH_CHECK_SLOT_SHARDS)
    assert _shard_counts(repo) == {claimed.hc_slot_shard: 1}
    assert repo.slots.running() == 1


def test_a_full_shard_sends_the_claim_to_the_next_one_with_room() -> None:
    repo = _repo()
    # A limit of 32 over 16 shards: 2 each. Three nodes of one shard: the third goes elsewhere.
    assert shard_shares(32, C.HEALTH_CHECK_SLOT_SHARDS) == [2] * 16
    home = 5
    nodes = _nodes_of_shard(home, C.HEALTH_CHECK_SLOT_SHARDS, 3)
    for node in nodes:
        assert _claim(repo, _pending(repo, node), cluster=32) is Claim.CLAIMED
    third = repo.get_instance(nodes[2])
    assert third is not None and third.hc_slot_shard == home + 1  # the next shard round the ring
    assert _shard_counts(repo) == {home: 2, home + 1: 1}


def test_the_cluster_is_full_only_when_every_shard_is_and_never_runs_more_than_its_limit() -> None:
    repo = _repo()
    limit = 5  # five shards of one slot
    results = [_claim(repo, _pending(repo, f"n{i}"), cluster=limit) for i in range(8)]
    assert results.count(Claim.CLAIMED) == limit and results.count(Claim.CLUSTER_FULL) == 3
    assert repo.slots.running() == limit
    assert set(_shard_counts(repo).values()) == {1}


def test_the_release_gives_the_slot_back_to_the_shard_the_claim_recorded() -> None:
    repo = _repo()
    node = _nodes_of_shard(3, C.HEALTH_CHECK_SLOT_SHARDS, 2)
    first, second = (_pending(repo, n) for n in node)
    assert _claim(repo, first, cluster=16) is Claim.CLAIMED  # shard 3 (its share: 1)
    assert _claim(repo, second, cluster=16) is Claim.CLAIMED  # shard 3 full: shard 4
    second_now = repo.get_instance(node[1])
    assert second_now is not None and second_now.hc_slot_shard == 4
    assert repo.retry_health_check(second_now, f"sb-{node[1]}", T0 + 30)
    assert _shard_counts(repo) == {3: 1}
    back = repo.get_instance(node[1])
    assert back is not None and back.hc_slot_shard is None and back.state.value == "HEALTH_CHECK_PENDING"


def test_a_check_claimed_before_the_shards_is_released_on_the_unsharded_item() -> None:
    repo = _repo()
    instance = _pending(repo, "n1")
    assert _claim(repo, instance, cluster=8) is Claim.CLAIMED
    # Rewritten as a claim of the release before: no shard on the instance, its count on
    # the single item.
    shard = stable_shard("n1", 8)
    table = repo.db.table(INSTANCES)
    table.put_item(Item={C.INSTANCE_PK: C.HEALTH_CHECK_SLOTS_KEY, "item_type": "HC_SLOTS", "running": 1})
    table.put_item(Item={C.INSTANCE_PK: C.health_check_slot_shard_key(shard), "running": 0})
    table.update_item(Key={C.INSTANCE_PK: "n1"}, UpdateExpression="REMOVE hc_slot_shard")
    legacy = repo.get_instance("n1")
    assert legacy is not None and legacy.hc_slot_shard is None
    assert repo.slots.running() == 1
    assert repo.retry_health_check(legacy, "sb-n1", T0 + 30)
    assert repo.slots.running() == 0
    assert _shard_counts(repo) == {}
