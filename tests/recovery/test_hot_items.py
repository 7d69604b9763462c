"""Issue 28, no hot item: the cluster's health-check slots on shard items (the repository
against the in-memory DynamoDB), and a fault's healthy verdicts counted on tally shards off
the job item, the job settled exactly once by whoever sees every count (the recovery with
fakes of the ports)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.domain.fault_tally import tally_shard_count
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.notifications import NotificationKind
from gpu_recovery.domain.shards import shard_shares, stable_shard
from gpu_recovery.repository import Repository
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.health_check_slots import Claim
from tests.fixtures.memory_repository import INSTANCES, T0, memory_repository, pending_health_check
from tests.recovery.fakes import World, world


def _claim(repo: Repository, instance: Instance, *, cluster: int, per_job: int = 10_000) -> Claim:
    return repo.health_checks.claim(instance, f"sb-{instance.container_inst_id}", T0 + 75,
                                   owner="j1", per_job=per_job, cluster=cluster, now=T0).outcome


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
    repo = memory_repository()
    instance = pending_health_check(repo, "n1")
    assert _claim(repo, instance, cluster=2048) is Claim.CLAIMED
    claimed = repo.instances.get_instance("n1")
    assert claimed is not None and claimed.hc_slot_shard == stable_shard("n1", C.HEALTH_CHECK_SLOT_SHARDS)
    assert _shard_counts(repo) == {claimed.hc_slot_shard: 1}
    assert repo.slots.running() == 1


@pytest.mark.parametrize("per_job", [10_000, 4])
def test_a_claim_answers_with_the_instance_as_it_wrote_it(per_job: int) -> None:
    """The claimer needs no read after its claim: the answer carries the shard and the job
    slot the claim recorded (what the release gives back), as a read would find them."""
    repo = memory_repository()
    home = 7
    nodes = _nodes_of_shard(home, C.HEALTH_CHECK_SLOT_SHARDS, 2)
    first = pending_health_check(repo, nodes[0])
    assert _claim(repo, first, cluster=16, per_job=per_job) is Claim.CLAIMED  # takes shard 7's one slot
    second = pending_health_check(repo, nodes[1])
    answer = repo.health_checks.claim(second, "sb-2", T0 + 75, owner="j1", per_job=per_job, cluster=16,
                                     now=T0 + 1)
    stored = repo.instances.get_instance(nodes[1])
    assert answer.outcome is Claim.CLAIMED and answer.instance is not None and stored is not None
    assert answer.instance.hc_slot_shard == stored.hc_slot_shard == home + 1  # not its home shard
    assert answer.instance.hc_job_slot is stored.hc_job_slot is (per_job < 16)
    for name in ("state", "tasks", "hc_owner", "hc_waiting_for_slot", "deadline_at", "hc_requested_at"):
        assert getattr(answer.instance, name) == getattr(stored, name), name
    # Released with what the answer says: the slots it took are given back.
    assert repo.health_checks.release_claim(answer.instance, "sb-2", placement_failed=False, retry_at=T0 + 30)
    assert _shard_counts(repo) == {home: 1}


def test_a_claim_that_took_nothing_answers_without_an_instance() -> None:
    repo = memory_repository()
    instance = pending_health_check(repo, "n1")
    assert _claim(repo, instance, cluster=8) is Claim.CLAIMED
    again = repo.health_checks.claim(instance, "sb-n1", T0 + 75, owner="j1", per_job=10_000, cluster=8,
                                     now=T0)
    assert again.outcome is Claim.RACED and again.instance is None


def test_a_full_shard_sends_the_claim_to_the_next_one_with_room() -> None:
    repo = memory_repository()
    # A limit of twice the shards: 2 each. Three nodes of one shard: the third goes elsewhere.
    limit = 2 * C.HEALTH_CHECK_SLOT_SHARDS
    assert shard_shares(limit, C.HEALTH_CHECK_SLOT_SHARDS) == [2] * C.HEALTH_CHECK_SLOT_SHARDS
    home = 5
    nodes = _nodes_of_shard(home, C.HEALTH_CHECK_SLOT_SHARDS, 3)
    for node in nodes:
        assert _claim(repo, pending_health_check(repo, node), cluster=limit) is Claim.CLAIMED
    third = repo.instances.get_instance(nodes[2])
    assert third is not None and third.hc_slot_shard == home + 1  # the next shard round the ring
    assert _shard_counts(repo) == {home: 2, home + 1: 1}


def test_the_cluster_is_full_only_when_every_shard_is_and_never_runs_more_than_its_limit() -> None:
    repo = memory_repository()
    limit = 5  # five shards of one slot
    results = [_claim(repo, pending_health_check(repo, f"n{i}"), cluster=limit) for i in range(8)]
    assert results.count(Claim.CLAIMED) == limit and results.count(Claim.CLUSTER_FULL) == 3
    assert repo.slots.running() == limit
    assert set(_shard_counts(repo).values()) == {1}


def test_the_release_gives_the_slot_back_to_the_shard_the_claim_recorded() -> None:
    repo = memory_repository()
    node = _nodes_of_shard(3, C.HEALTH_CHECK_SLOT_SHARDS, 2)
    first, second = (pending_health_check(repo, n) for n in node)
    assert _claim(repo, first, cluster=16) is Claim.CLAIMED  # shard 3 (its share: 1)
    assert _claim(repo, second, cluster=16) is Claim.CLAIMED  # shard 3 full: shard 4
    second_now = repo.instances.get_instance(node[1])
    assert second_now is not None and second_now.hc_slot_shard == 4
    assert repo.health_checks.retry(second_now, f"sb-{node[1]}", T0 + 30)
    assert _shard_counts(repo) == {3: 1}
    back = repo.instances.get_instance(node[1])
    assert back is not None and back.hc_slot_shard is None and back.state.value == "HEALTH_CHECK_PENDING"


def test_a_check_claimed_before_the_shards_is_released_on_the_unsharded_item() -> None:
    repo = memory_repository()
    instance = pending_health_check(repo, "n1")
    assert _claim(repo, instance, cluster=8) is Claim.CLAIMED
    # Rewritten as a claim of the release before: no shard on the instance, its count on
    # the single item.
    shard = stable_shard("n1", 8)
    table = repo.tables.db.table(INSTANCES)
    table.put_item(Item={C.INSTANCE_PK: C.HEALTH_CHECK_SLOTS_KEY, "item_type": "HC_SLOTS", "running": 1})
    table.put_item(Item={C.INSTANCE_PK: C.health_check_slot_shard_key(shard), "running": 0})
    table.update_item(Key={C.INSTANCE_PK: "n1"}, UpdateExpression="REMOVE hc_slot_shard, hc_slot_token")
    legacy = repo.instances.get_instance("n1")
    assert legacy is not None and legacy.hc_slot_shard is None
    assert repo.slots.running() == 1
    assert repo.health_checks.retry(legacy, "sb-n1", T0 + 30)
    assert repo.slots.running() == 0
    assert _shard_counts(repo) == {}


# ------------------------------------------------------------------ the fault's tally
def _cascade(w: World, nodes: list[str]) -> None:
    """Every rank exits 1 on its own (an NCCL cascade): every node is a suspect."""
    for arn in w.register_job("j", nodes):
        w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))


def _healthy(w: World, node: str) -> None:
    [task] = [t for t in w.ecs.health_checks_on(node) if t.last_status == "RUNNING"]
    w.service.on_health_check_stopped(w.health_check_stopped(task, 0))


def _shard_sum(w: World, attempt: int = 1) -> int:
    shards = tally_shard_count(w.repo.jobs.get_job("j").world_size)
    tables = w.repo.tables
    items = [tables.db.get(tables.job_table_name, {C.JOB_PK: C.fault_tally_shard_key("j", attempt, s)})
             for s in range(shards)]
    return sum(len((i or {}).get("decided_nodes") or ()) for i in items)


def _stale_counts_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next verdict decides without the counts on the shards, as a verdict committing
    at the same time as another one does (neither sees the other's count)."""
    real = FaultRepository.counted
    calls = {"n": 0}

    def counted(self: FaultRepository, job: Any) -> Any:
        calls["n"] += 1
        return job if calls["n"] == 1 else real(self, job)
    monkeypatch.setattr(FaultRepository, "counted", counted)


def test_healthy_verdicts_count_on_the_shards_and_the_last_one_restarts_the_job_once() -> None:
    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(4)]
        _cascade(w, nodes)
        for node in nodes[:3]:
            _healthy(w, node)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK and job.tally.total == 4
        assert job.tally.decided == 0 and _shard_sum(w) == 3  # nothing on the job item
        counted = w.repo.faults.counted(job)
        assert counted.tally.decided_all == 3 and counted.tally.pending == 1
        _healthy(w, nodes[3])  # sees the 3 on the shards: the job item's last verdict
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and job.state in (JobState.STARTING, JobState.RUNNING)
        assert job.app_restarts_used == 1 and job.tally.decided == 1 and _shard_sum(w) == 3


def test_the_restart_e_mail_counts_every_suspect_though_most_verdicts_are_on_the_shards() -> None:
    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(8)]  # more than the e-mail names (5)
        _cascade(w, nodes)
        for node in nodes:
            _healthy(w, node)
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and job.state is JobState.RUNNING
        assert job.tally.decided == 1 and _shard_sum(w) == 7  # the job item holds the last one only
        [recovered] = [n for n in w.notifier.sent if n.kind is NotificationKind.RECOVERED]
        assert ("What was done:      DCGM health check of node-0, node-1, node-2, node-3, node-4; "
                "and 3 more suspect node(s) judged; all 8 ranks restarted as attempt 2") in recovered.body


def test_the_shard_a_verdict_counts_on_is_the_one_the_tally_is_summed_from() -> None:
    """Both keyed by the tally's fault attempt (one source): a verdict handed a job whose
    attempt is past its tally's counts on the fault's shards, the ones ``counted`` sums."""
    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(4)]
        _cascade(w, nodes)
        for node in nodes[:2]:
            _healthy(w, node)
        job = w.repo.jobs.get_job("j")
        assert job.tally.attempt == job.attempt == 1 and _shard_sum(w, 1) == 2
        moved_on = replace(job, attempt=2)  # the tally still counts the fault of attempt 1
        w.repo.faults.count_healthy(moved_on, nodes[2], "healthy")
        assert _shard_sum(w, 1) == 3 and _shard_sum(w, 2) == 0
        assert w.repo.faults.counted(job).tally.decided_all == 3


def test_two_last_verdicts_at_once_settle_the_job_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(3)]
        _cascade(w, nodes)
        for node in nodes[:2]:
            _healthy(w, node)
        _stale_counts_once(monkeypatch)
        _healthy(w, nodes[2])  # decided "wait" (it saw no other count): counted on a shard
        assert _shard_sum(w) == 3
        job = w.repo.jobs.get_job("j")
        # After its commit it added every count: the fault concluded, the job restarted once.
        assert job.attempt == 2 and job.app_restarts_used == 1
        assert job.state in (JobState.STARTING, JobState.RUNNING)


def test_a_lost_settlement_after_the_commit_is_finished_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_recovery.recovery.remediation.job_settlement import JobSettlement

    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(3)]
        _cascade(w, nodes)
        for node in nodes[:2]:
            _healthy(w, node)
        _stale_counts_once(monkeypatch)

        def lost(self: JobSettlement, job_id: str) -> str:
            raise TimeoutError("the invocation died after the verdict's commit")
        monkeypatch.setattr(JobSettlement, "settle_counted", lost)
        _healthy(w, nodes[2])  # committed; the work after it failed (logged, not raised)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK and _shard_sum(w) == 3  # every verdict in
        monkeypatch.undo()
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and job.app_restarts_used == 1


def test_a_count_lost_after_the_commit_is_counted_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict committed (its suspect marked counted on a shard), the count itself lost
    (the invocation died, or the write was throttled): the sweep finds the fault short of
    a verdict and counts it from the suspect, and the job goes on."""
    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(3)]
        _cascade(w, nodes)
        for node in nodes[:2]:
            _healthy(w, node)
        _stale_counts_once(monkeypatch)  # it decides "wait", as beside another verdict at once

        def lost(self: FaultRepository, job: Any, node: str, *, infra: bool) -> None:
            raise TimeoutError("the invocation died after the verdict's commit")
        monkeypatch.setattr(FaultRepository, "count_healthy", lost)
        _healthy(w, nodes[2])  # committed; its count failed (logged, not raised)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK and _shard_sum(w) == 2
        assert w.repo.faults.get_suspect("j", 1, nodes[2]).counted_on_shard == "healthy"
        monkeypatch.undo()
        w.advance(61)
        w.service.sweep()
        assert _shard_sum(w) == 3
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and job.app_restarts_used == 1


def test_a_healthy_verdict_counts_once_however_often_it_is_counted() -> None:
    with world(max_app_restarts=1, check_all_nodes_on_fault=True) as w:  # every exit a suspect
        nodes = [f"node-{i}" for i in range(4)]
        _cascade(w, nodes)
        _healthy(w, nodes[0])
        job = w.repo.jobs.get_job("j")
        for _ in range(3):  # a retry after a lost response, the sweep's recount, a duplicate
            w.repo.faults.count_healthy(job, nodes[0], "healthy")
        assert w.repo.faults.recount(job) == 0
        assert _shard_sum(w) == 1 and w.repo.faults.counted(job).tally.pending == 3


def test_counts_of_the_release_before_still_count_on_a_fault_in_flight_across_an_upgrade() -> None:
    with world(max_app_restarts=1, check_all_nodes_on_fault=True) as w:  # every exit a suspect
        nodes = [f"node-{i}" for i in range(4)]
        _cascade(w, nodes)
        job = w.repo.jobs.get_job("j")
        # Two healthy verdicts counted as numbers by the previous release, on shard 0.
        legacy = {C.JOB_PK: C.fault_tally_shard_key("j", 1, 0), "item_type": "TALLY_SHARD",
                  "decided": 2, "infra": 1}
        assert w.repo.tables.db.put_if_absent(w.repo.tables.job_table_name, legacy, C.JOB_PK)
        counted = w.repo.faults.counted(job).tally
        assert counted.decided_all == 2 and counted.infra_all == 1 and counted.pending == 2


def test_no_transaction_touches_a_tally_shard() -> None:
    """Healthy verdicts count with plain UpdateItems (sets: idempotent), so thousands at once
    never cancel each other's transactions on a shared shard."""
    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(4)]
        _cascade(w, nodes)
        real = w.repo.tables.db.transact
        touched: list[str] = []

        def transact(updates: Any, *args: Any, **kwargs: Any) -> Any:
            touched.extend(str(u.key.get(C.JOB_PK, "")) for u in updates)
            return real(updates, *args, **kwargs)
        w.repo.tables.db.transact = transact  # type: ignore[method-assign]
        for node in nodes[:3]:
            _healthy(w, node)
        assert _shard_sum(w) == 3 and touched
        assert not [k for k in touched if "#T#" in k]


def test_tally_shards_grow_with_the_job_so_no_shard_holds_more_than_128_nodes() -> None:
    assert tally_shard_count(8) == 8 and tally_shard_count(1024) == 8 and tally_shard_count(1025) == 9
    assert tally_shard_count(8192) == 64
    assert tally_shard_count(12_800) == 100 and tally_shard_count(100_000) == 100  # one BatchGetItem


def test_the_total_landing_after_the_last_verdict_concludes_the_fault() -> None:
    with world(max_app_restarts=1) as w:
        nodes = [f"node-{i}" for i in range(3)]
        arns = w.register_job("j", nodes)
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))  # one rank fails
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK and job.tally.total is None  # others still stopping
        _healthy(w, nodes[0])  # before every rank ended: counted on a shard, the job waits
        assert _shard_sum(w) == 1 and w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
        for arn in arns[1:]:  # the peers we stopped end: the suspects are counted (1)
            w.service.on_task_state_change(w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                                                          reason="gpu-recovery: suspected GPU fault"))
        job = w.repo.jobs.get_job("j")
        assert job.tally.total == 1 and job.attempt == 2 and job.app_restarts_used == 1


def test_a_dcgm_start_the_ecs_budget_refuses_gives_its_slot_back_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A check whose StartTask gets no token in time (a claim taken over, or another caller
    took the prepaid token's place) never called StartTask, so its claim is released at once
    (not held until its lease expires, then looked up) and it is tried again when a token is
    due, by the sweep; the invocation does not fail (no Lambda retry)."""
    from gpu_recovery.adapters.ecs_budget import RateLimited

    with world() as w:
        arns = w.register_job("j", ["node-0", "node-1"])
        real = w.ecs.start_task
        calls = {"n": 0}

        def limited_once(**kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RateLimited(3.0)
            return real(**kwargs)
        monkeypatch.setattr(w.ecs, "start_task", limited_once)
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
        instance = w.repo.instances.get_instance("node-0")
        assert instance is not None and instance.state.value == "HEALTH_CHECK_PENDING"
        assert instance.check.attempts == 0 and instance.deadline_at == w.now[0] + 3.0
        assert w.repo.slots.running() == 0  # the slot is free again, on the shard it was taken on
        assert _shard_counts(w.repo) == {}
        w.advance(3)
        w.service.sweep()
        assert [t.last_status for t in w.ecs.health_checks_on("node-0")] == ["RUNNING"]
        assert w.repo.slots.running() == 1
        claimed = w.repo.instances.get_instance("node-0")
        assert claimed is not None and _shard_counts(w.repo) == {claimed.hc_slot_shard: 1}
