"""Items whose size grows with the cluster stay under DynamoDB's 400 KB item limit at the
scale the project claims (docs/sizing.md: 10,000 nodes), issue 40: the placement holds and
the breaker's item, written through the repository to the in-memory DynamoDB (which measures
items by DynamoDB's rules and refuses one over 400 KB) with the request guard on. (What grows
with a job, 8,192 tasks, is chunked or bounded by design: the latch and tally shards, the
launch plan's chunks, the history; ``tests/local_mode/test_scale_sim.py`` runs the whole
recovery at that size in the slow tier.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain import cordon as cordon_policy
from gpu_recovery.domain import placement
from gpu_recovery.domain.breaker import breaker as breaker_policy
from gpu_recovery.domain.relocation import SpareNode
from gpu_recovery.repository import Repository
from local_mode.sim.contract.requests import RequestGuard
from local_mode.sim.contract.state import ClusterState, key_schemas
from local_mode.sim.dynamo import MAX_ITEM_BYTES, MemoryDynamo

JOBS, INSTANCES = "jobs", "instances"
CLUSTER_NODES = 10_000
NOW = 1_800_000_000.0


@pytest.fixture
def store() -> Iterator[tuple[MemoryDynamo, Repository, RequestGuard]]:
    definitions = C.table_definitions()
    dynamo = MemoryDynamo({JOBS: "job", INSTANCES: "instance"})
    guard = RequestGuard(
        ClusterState(
            lambda ref: None, key_schemas({JOBS: definitions["job"], INSTANCES: definitions["instance"]})
        )
    )
    dynamo.check_request = lambda model, wire: guard.check("dynamodb", model, wire)
    yield dynamo, Repository(dynamo, JOBS, INSTANCES), guard
    assert guard.violations == []


def _node() -> str:
    return uuid.uuid4().hex  # a container instance id


def test_the_holds_of_a_10000_node_cluster_with_half_of_it_spare_fit_one_item(
    store: tuple[MemoryDynamo, Repository, RequestGuard],
) -> None:
    """spare_nodes takes up to 50 %: 5,000 holds of ~180 bytes would not fit the worklist's
    one item; the holds are capped (reserved first), and the item stays under 400 KB even
    when every hold changed twice before any sync confirmed (twice the worklist members) and
    ECS refused every node's attribute (no room: each member reported)."""
    dynamo, repo, _ = store
    free = [
        SpareNode(n, f"arn:aws:ecs:us-east-1:123456789012:container-instance/gpu-cluster/{n}", "", 8, 8)
        for n in (_node() for _ in range(CLUSTER_NODES))
    ]
    wanted = placement.plan_holds(spares_wanted=CLUSTER_NODES // 2, current={}, free=free, waits=[])
    assert len(wanted) == placement.MAX_HOLDS
    first = {n: {**h, "spares_wanted": CLUSTER_NODES // 2} for n, h in wanted.items()}
    assert repo.cordons.set_holds(repo.cordons.worklist(), first, NOW)
    lent = {n: {**h, placement.LENT: f"queue-job-{uuid.uuid4()}"} for n, h in first.items()}
    assert repo.cordons.set_holds(repo.cordons.worklist(), lent, NOW + 60)
    read = repo.cordons.worklist()
    members = [m for pending in read.pending.values() for m in pending]
    assert len(read.holds) == placement.MAX_HOLDS and len(members) == 2 * placement.MAX_HOLDS
    assert repo.cordons.record_refused(members)
    assert repo.cordons.worklist().refused == frozenset(members)
    sizes = {k: v for k, v in dynamo.item_bytes(INSTANCES).items() if C.CORDON_SYNC_ITEM_KEY in k}
    assert len(sizes) == C.CORDON_SYNC_SHARDS and max(sizes.values()) < MAX_ITEM_BYTES, sizes


def test_the_breakers_item_in_a_storm_over_a_10000_node_cluster_fits_one_item(
    store: tuple[MemoryDynamo, Repository, RequestGuard],
) -> None:
    """A storm over a 10,000-node cluster: the window (20 %: 2,000 nodes) and the cordon
    limit's (50 %: 5,000) are capped at 1,000 nodes, the backlog at 500 actions (the rest
    refused and counted), each reason at 200 characters: the one item stays under 400 KB.
    (Past the backlog's bound nothing grows: the storm is cut at 1,600 nodes.)"""
    dynamo, repo, _ = store
    storm = breaker_policy.MAX_WINDOW_NODES + breaker_policy.MAX_BACKLOG + 100
    reason = "rebooted after DCGM level 2 reported " + "x" * 500
    state: dict | None = None
    cordons: dict | None = None
    decisions = []
    for i in range(storm):
        node, at = _node(), NOW + i / 100
        decision = breaker_policy.record_action(
            state,
            node=node,
            action="reboot",
            now=at,
            cluster_gpu_nodes=CLUSTER_NODES,
            job_id=f"job-{i % 64:04d}",
            reason=reason,
        )
        state = decision.state
        decisions.append(decision)
        cordons = cordon_policy.admit(cordons, node=node, now=at, cluster_gpu_nodes=CLUSTER_NODES).state
    assert state is not None and cordons is not None
    assert sum(d.allowed for d in decisions) == breaker_policy.MAX_WINDOW_NODES
    assert len(state["backlog"]) == breaker_policy.MAX_BACKLOG and state["backlog_dropped"] == 100
    assert "the backlog is full" in decisions[-1].reason
    assert len(cordons["window"]) == cordon_policy.MAX_WINDOW_NODES
    assert repo.breaker.save({**state, "cordons": cordons}, None)
    size = dynamo.item_bytes(INSTANCES)[f"{INSTANCES}:{C.BREAKER_ITEM_KEY}"]
    assert size < MAX_ITEM_BYTES, size


@pytest.mark.parametrize(("recoveries", "history"), [
    (60, (20, 5)),  # make test: a short history, trimmed and folded ~45 times (~2 s)
    pytest.param(1000, (40, 10), marks=pytest.mark.slow),  # 1,000 recoveries (~40 s)
])
def test_a_job_with_many_recoveries_keeps_an_exact_bounded_goodput_ledger(
    store: tuple[MemoryDynamo, Repository, RequestGuard], monkeypatch: pytest.MonkeyPatch,
    recoveries: int, history: tuple[int, int] | None,
) -> None:
    """Issue 52: a job recovered 1,000 times (each fault on one of 40 nodes, four state
    changes each) through the repository: its history is trimmed and folded into the ledger
    map, which stays bounded (a fixed set of counters, the top nodes and rules), and the
    ledger read back is the exact sum of what happened."""
    from gpu_recovery import clock
    from gpu_recovery.domain import goodput
    from gpu_recovery.domain.models import Job
    from gpu_recovery.repository import base

    if history is not None:
        monkeypatch.setattr(base, "MAX_HISTORY", history[0])
        monkeypatch.setattr(base, "HISTORY_TRIM", history[1])
    _, repo, _ = store
    now = [NOW]
    clock.set_clock(lambda: now[0], lambda s: now.__setitem__(0, now[0] + s))
    try:
        assert repo.registrations.create_job_if_absent(Job("j", C.JobState.RUNNING, 2, created_at=NOW,
                                                           updated_at=NOW, max_recovery_attempts=10_000))
        for i in range(recoveries):
            now[0] += 100
            marks = goodput.fault_marks(fault_at=now[0] - 5, checkpoint_at=now[0] - 35, node=f"n{i % 40}",
                                        rule=f"rule-{i % 13}")
            assert repo.rank_events.enter_recovery("j", i + 1, from_states=[C.JobState.RUNNING],
                                                   reason="fault", now=now[0], deadline_at=now[0] + 60,
                                                   ledger=marks)
            now[0] += 30
            assert repo.tables.db.apply(repo.jobs.job_transition(
                "j", C.JobState.PENDING_RESTART, from_states=[C.JobState.PENDING_HEALTHCHECK], attempt=i + 1,
                reason="verdict", actor="test", ledger=goodput.cause_marks("repair")))
            now[0] += 40
            assert repo.restarts.claim(repo.jobs.get_job("j"), now=now[0], deadline_at=now[0] + 60)
            now[0] += 10
            assert repo.restarts.confirm_running("j", i + 2, "running")
        item = repo.jobs.get_job_item("j")
        assert item is not None
        ledger = goodput.ledger_of(item, now[0])
    finally:
        clock.reset_clock()
    assert len(repr(item["goodput"])) < 2_000
    assert len(item["history"]) <= base.MAX_HISTORY
    assert ledger.faults == recoveries
    seconds, n = ledger.seconds, recoveries
    assert seconds["productive"] == pytest.approx(n * 65)
    assert seconds["lost_work"] == pytest.approx(n * 30) and seconds["detection"] == pytest.approx(n * 5)
    assert seconds["diagnosis"] == pytest.approx(n * 30) and seconds["repair"] == pytest.approx(n * 40)
    assert seconds["restart"] == pytest.approx(n * 10)
    assert ledger.wall == pytest.approx(now[0] - NOW)
    assert len(ledger.nodes) <= goodput.TOP_N + 40 and len(item["goodput"]["nodes"]) == goodput.TOP_N
