"""Issue 28, health-check slots outside every transaction: a slot is a claim token among a
slot item's holders, taken and given back by plain conditional UpdateItems; what a claim or a
release that died half-way leaves is freed by the sweep's reaper (the repository against the
in-memory DynamoDB)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError

from gpu_recovery import constants as C
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.shards import stable_shard
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository import Repository
from gpu_recovery.repository.health_check_slots import (
    HOLDERS,
    REAP_AFTER_SECONDS,
    Claim,
    HealthCheckSlots,
    claim_token,
)
from tests.fixtures.memory_repository import INSTANCES, JOBS, T0, memory_repository, pending_health_check

SHARDS = C.HEALTH_CHECK_SLOT_SHARDS


def _claim(repo: Repository, instance: Instance, *, cluster: int = 2048, per_job: int = 10_000,
           now: float = T0) -> Claim:
    return repo.health_checks.claim(instance, f"sb-{instance.container_inst_id}", now + 75, owner="j1",
                                   per_job=per_job, cluster=cluster, now=now).outcome


def _shard_holders(repo: Repository, shard: int) -> set[str]:
    item = repo.tables.db.get(INSTANCES, {C.INSTANCE_PK: C.health_check_slot_shard_key(shard)}) or {}
    return set(item.get(HOLDERS) or ())


def _job_holders(repo: Repository, job: str = "j1") -> set[str]:
    item = repo.tables.db.get(JOBS, {C.JOB_PK: C.health_check_slots_key(job)}) or {}
    return set(item.get(HOLDERS) or ())


def _all_holders(repo: Repository) -> set[str]:
    return set().union(*(_shard_holders(repo, s) for s in range(SHARDS)))


def test_a_claim_puts_its_token_on_its_shard_and_the_instance_records_it() -> None:
    repo = memory_repository()
    answer = repo.health_checks.claim(pending_health_check(repo, "n1"), "sb-n1", T0 + 75, owner="j1",
                                     per_job=4, cluster=16, now=T0)
    assert answer.outcome is Claim.CLAIMED and answer.instance is not None
    stored = repo.instances.get_instance("n1")
    assert stored is not None and stored.hc_slot_token == answer.instance.hc_slot_token != ""
    assert stored.hc_slot_token.startswith(f"n1|{int(T0)}|") and stored.hc_slot_token.endswith("|j1")
    assert stored.hc_slot_shard is not None
    assert _shard_holders(repo, stored.hc_slot_shard) == {stored.hc_slot_token}
    assert _job_holders(repo) == {stored.hc_slot_token}  # the job's share is counted (4 < 16)
    assert repo.slots.running() == 1


def test_no_slot_write_is_in_a_transaction() -> None:
    """The slot items are touched by plain UpdateItems only: claim, release and verdict."""
    repo = memory_repository()
    sent: list[dict[str, Any]] = []
    transact = repo.tables.db.transact

    def watched(updates: Any) -> bool:
        sent.extend(u.key for u in updates)
        return bool(transact(updates))

    repo.tables.db.transact = watched  # type: ignore[method-assign]
    assert _claim(repo, pending_health_check(repo, "n1"), per_job=4, cluster=16) is Claim.CLAIMED
    claimed = repo.instances.get_instance("n1")
    assert claimed is not None
    assert repo.health_checks.retry(claimed, "sb-n1", T0 + 30)
    assert repo.slots.running() == 0 and _job_holders(repo) == set()
    slot_keys = [k for k in sent if str(next(iter(k.values()))).startswith(C.HEALTH_CHECK_SLOTS_KEY)
                 or k.get(C.JOB_PK) == C.health_check_slots_key("j1")]
    assert slot_keys == []


def test_a_full_job_share_refuses_and_gives_the_shard_token_back() -> None:
    repo = memory_repository()
    assert _claim(repo, pending_health_check(repo, "n1"), per_job=1, cluster=16) is Claim.CLAIMED
    assert _claim(repo, pending_health_check(repo, "n2"), per_job=1, cluster=16) is Claim.JOB_FULL
    held = repo.instances.get_instance("n1")
    assert held is not None
    assert _all_holders(repo) == _job_holders(repo) == {held.hc_slot_token}
    assert repo.slots.running() == 1


def test_a_raced_claim_gives_its_own_token_back_not_the_winners() -> None:
    """Two deliveries of one claim in the same second: the loser's token is its own."""
    repo = memory_repository()
    instance = pending_health_check(repo, "n1")
    assert _claim(repo, instance, per_job=4, cluster=16) is Claim.CLAIMED
    assert _claim(repo, instance, per_job=4, cluster=16) is Claim.RACED
    winner = repo.instances.get_instance("n1")
    assert winner is not None
    assert _all_holders(repo) == _job_holders(repo) == {winner.hc_slot_token}


def test_the_release_gives_the_token_back_after_its_commit() -> None:
    repo = memory_repository()
    answer = repo.health_checks.claim(pending_health_check(repo, "n1"), "sb-n1", T0 + 75, owner="j1",
                                     per_job=4, cluster=16, now=T0)
    assert answer.instance is not None
    assert repo.slots.release(answer.instance) == []  # nothing in the instance's transaction
    assert repo.health_checks.release_claim(answer.instance, "sb-n1", placement_failed=True, retry_at=T0 + 30)
    assert repo.slots.running() == 0 and _job_holders(repo) == set()
    back = repo.instances.get_instance("n1")
    assert back is not None and back.hc_slot_token == "" and back.check.attempts == 1
    # A release that did not commit (the claim moved on) gives nothing back.
    again = repo.health_checks.claim(back, "sb-n1-2", T0 + 75, owner="j1", per_job=4, cluster=16, now=T0)
    assert again.outcome is Claim.CLAIMED
    assert not repo.health_checks.release_claim(answer.instance, "sb-n1", placement_failed=False,
                                               retry_at=T0 + 30)
    assert repo.slots.running() == 1


def _lose_give_backs(repo: Repository, monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(*args: Any) -> None:
        raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")  # the answer lost

    monkeypatch.setattr(repo.slots, "_let_go", lost)


def test_a_lost_release_is_freed_by_the_reaper_once_old_not_before(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = memory_repository()
    assert _claim(repo, pending_health_check(repo, "n1"), per_job=4, cluster=16) is Claim.CLAIMED
    claimed = repo.instances.get_instance("n1")
    assert claimed is not None
    with monkeypatch.context() as patch:
        _lose_give_backs(repo, patch)
        assert repo.health_checks.retry(claimed, "sb-n1", T0 + 30)  # committed; its give-back lost
    assert repo.slots.running() == 1 and _job_holders(repo) == {claimed.hc_slot_token}
    assert repo.slots.reap(T0 + REAP_AFTER_SECONDS - 1) == 0  # young: a release may be in flight
    assert repo.slots.running() == 1
    assert repo.slots.reap(T0 + REAP_AFTER_SECONDS + 1) == 1
    assert repo.slots.running() == 0 and _job_holders(repo) == set()


def test_a_claim_that_died_before_its_instance_is_freed_by_the_reaper() -> None:
    repo = memory_repository()
    pending_health_check(repo, "n1")
    shard = stable_shard("n1", SHARDS)
    token = claim_token("n1", T0, "j1")
    slots: HealthCheckSlots = repo.slots
    # (1) of the claim done, on the shard and the job's item; the delivery died before (2).
    assert slots._hold(INSTANCES, {C.INSTANCE_PK: C.health_check_slot_shard_key(shard)}, token, 32, {})
    assert slots._hold(JOBS, {C.JOB_PK: C.health_check_slots_key("j1")}, token, 4, {})
    assert slots.reap(T0 + REAP_AFTER_SECONDS + 1) == 1
    assert slots.running() == 0 and _job_holders(repo) == set()


def test_a_check_holding_its_slot_is_never_reaped_however_long_it_runs() -> None:
    repo = memory_repository()
    assert _claim(repo, pending_health_check(repo, "n1"), per_job=4, cluster=16) is Claim.CLAIMED
    assert repo.slots.reap(T0 + 100 * REAP_AFTER_SECONDS) == 0
    assert repo.slots.running() == 1 and len(_job_holders(repo)) == 1


def test_the_reaper_looks_up_at_most_its_cap_a_run() -> None:
    repo = memory_repository()
    for i in range(5):
        pending_health_check(repo, f"n{i}")
        shard = stable_shard(f"n{i}", SHARDS)
        assert repo.slots._hold(INSTANCES, {C.INSTANCE_PK: C.health_check_slot_shard_key(shard)},
                                claim_token(f"n{i}", T0, ""), 32, {})
    later = T0 + REAP_AFTER_SECONDS + 1
    assert [repo.slots.reap(later, cap=2) for _ in range(4)] == [2, 2, 1, 0]
    assert repo.slots.running() == 0


def test_checks_running_long_do_not_hide_the_orphans_from_a_capped_reaper() -> None:
    """Old tokens that their instances hold come first in every shard's order; the cap's
    sample still reaches the orphan behind them."""
    repo = memory_repository()
    shard = stable_shard("z9", SHARDS)
    same_shard = [n for n in (f"a{i}" for i in range(5000)) if stable_shard(n, SHARDS) == shard][:6]
    for node in same_shard:  # their tokens sort before z9's on the same shard
        assert _claim(repo, pending_health_check(repo, node)) is Claim.CLAIMED  # held, never reaped
    pending_health_check(repo, "z9")
    assert repo.slots._hold(INSTANCES, {C.INSTANCE_PK: C.health_check_slot_shard_key(shard)},
                            claim_token("z9", T0, ""), 32, {})
    later = T0 + REAP_AFTER_SECONDS + 1
    reaped = sum(repo.slots.reap(later, cap=2) for _ in range(40))
    assert reaped == 1 and repo.slots.running() == 6


def test_a_check_claimed_by_the_release_before_gives_back_its_counts() -> None:
    """Upgrade: no token on the instance, a number ``running`` on its shard and its job's
    item: counted by ``running()``, decremented in the release's transaction."""
    repo = memory_repository()
    assert _claim(repo, pending_health_check(repo, "n1"), per_job=4, cluster=16) is Claim.CLAIMED
    claimed = repo.instances.get_instance("n1")
    assert claimed is not None and claimed.hc_slot_shard is not None
    shard = claimed.hc_slot_shard
    instances, jobs = repo.tables.db.table(INSTANCES), repo.tables.db.table(JOBS)
    instances.put_item(Item={C.INSTANCE_PK: C.health_check_slot_shard_key(shard), "running": 1})
    jobs.put_item(Item={C.JOB_PK: C.health_check_slots_key("j1"), "running": 1})
    instances.update_item(Key={C.INSTANCE_PK: "n1"}, UpdateExpression="REMOVE hc_slot_token")
    legacy = repo.instances.get_instance("n1")
    assert legacy is not None and legacy.hc_slot_token == "" and legacy.hc_slot_shard == shard
    assert repo.slots.running() == 1
    # A new claim's condition counts holders only (the legacy count is not its limit).
    assert _claim(repo, pending_health_check(repo, "n2"), per_job=1, cluster=16) is Claim.CLAIMED
    assert repo.slots.running() == 2
    assert repo.health_checks.retry(legacy, "sb-n1", T0 + 30)
    assert repo.slots.running() == 1
    job_item = repo.tables.db.get(JOBS, {C.JOB_PK: C.health_check_slots_key("j1")}) or {}
    assert int(job_item.get("running") or 0) == 0 and len(job_item.get(HOLDERS) or ()) == 1


def _answers_lost(repo: Repository, monkeypatch: pytest.MonkeyPatch, key: dict[str, str], *,
                  retried: bool) -> list[bool]:
    """The first write to ``key`` lands but its answer is lost: ``retried``, botocore sends it
    again and answers with the second try's result (its condition now read against the
    write's own result); else the caller sees the timeout. The writes' results are recorded."""
    apply = repo.tables.db.apply
    results: list[bool] = []

    def lossy(update: Any) -> bool:
        first = apply(update)
        if update.key != key or results:
            return bool(first)
        results.append(first)
        if not retried:
            raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
        results.append(apply(update))
        return bool(results[-1])

    monkeypatch.setattr(repo.tables.db, "apply", lossy)
    return results


@pytest.mark.parametrize("retried", [True, False], ids=["botocore-retried", "timed-out"])
def test_a_claim_whose_instance_write_answer_was_lost_is_still_claimed_holding_its_slot(
        monkeypatch: pytest.MonkeyPatch, retried: bool) -> None:
    """Given the instance's claim written but its answer lost, Then the claim is the same
    try's (its token passes the condition again): CLAIMED, its slot held, not RACED with its
    running check's slot given back (the cluster would run one check more than its limit)."""
    repo = memory_repository()
    instance = pending_health_check(repo, "n1")
    results = _answers_lost(repo, monkeypatch, {C.INSTANCE_PK: "n1"}, retried=retried)
    assert _claim(repo, instance, per_job=4, cluster=16) is Claim.CLAIMED
    assert results[0] is True
    held = repo.instances.get_instance("n1")
    assert held is not None and held.state is InstanceState.HEALTH_CHECKING
    assert _all_holders(repo) == _job_holders(repo) == {held.hc_slot_token}
    assert repo.slots.running() == 1


@pytest.mark.parametrize("retried", [True, False], ids=["botocore-retried", "timed-out"])
def test_a_slot_whose_write_answer_was_lost_is_held_on_its_one_shard(
        monkeypatch: pytest.MonkeyPatch, retried: bool) -> None:
    """Given one slot a shard and the token's write to its shard landed with its answer lost,
    Then the claim holds that shard (the full shard's condition passes its own token): its
    token is not left on a second shard, where it would count twice until reaped."""
    repo = memory_repository()
    instance = pending_health_check(repo, "n1")
    shard = stable_shard("n1", SHARDS)
    _answers_lost(repo, monkeypatch, {C.INSTANCE_PK: C.health_check_slot_shard_key(shard)}, retried=retried)
    assert _claim(repo, instance, cluster=SHARDS) is Claim.CLAIMED
    held = repo.instances.get_instance("n1")
    assert held is not None and held.hc_slot_shard == shard
    assert _shard_holders(repo, shard) == _all_holders(repo) == {held.hc_slot_token}
    assert repo.slots.running() == 1
