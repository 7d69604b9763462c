"""A launch the older release's launcher left in flight when the stack was upgraded (its ledger
entry on the scheduler's lease, the job STARTING with no start intent and a plan the start
fan-out cannot start from) is ended by the next tick (``queue.ledger_drain``): completed when
every rank registered, else aborted the new way (its started ranks stopped, the job requeued and
launched again by the start fan-out). No task is left running, none started twice."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import JobState, RankState, job_group
from gpu_recovery.domain.rank_template import LAUNCH
from gpu_recovery.queue import scheduler as scheduler_module
from gpu_recovery.queue.ledger_drain import ENTRY_MARGIN_SECONDS, old_started_by
from gpu_recovery.queue.scheduler import ADMISSION_MARGIN_SECONDS
from gpu_recovery.recovery.launch_templates import LaunchSpec, build_overrides, rank_tags
from gpu_recovery.recovery.ranks import RankRegistration
from gpu_recovery.repository import from_ddb
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.scheduling import LEASE_KEY, SchedulingRepository
from gpu_recovery.settings import MIN_SCHEDULER_TIME_BUDGET_SECONDS, SchedulerConfig, SettingsError
from tests.fixtures.queue_cluster import make_queue_cluster
from tests.queue_scheduler._launches import Recorded


def _old_launch_in_flight(qc: Any, job_id: str, *, started: int, registered: int, first_node: int = 0
                          ) -> list[str]:
    """What the older release's launcher left when its tick died mid-launch of ``job_id``
    (attempt 1 on node-``first_node``, the next node ...): its claim (the job STARTING, its plan
    without the task definition's ARN and container, the plan's nodes, its ledger entry),
    ``started`` ranks' StartTasks (its startedBy) and ``registered`` of them registered with the
    recovery loop. The tasks started."""
    store = SchedulingRepository(qc.repo.jobs)
    item = qc.item(job_id)
    world = int(item["world_size"])
    nodes = [qc.sim.node(f"node-{first_node + i}") for i in range(world)]
    now = qc.sim.now()
    plan = {"attempt": 1, "world_size": world, "rank0_node": nodes[0].container_instance_id,
            "master_addr": "10.0.0.10", "master_port": 29500, "instance_type": "", "relocated": False}
    claim = qc.repo.jobs.job_transition(
        job_id, JobState.STARTING, from_states=[JobState.QUEUED], attempt=0, reason="admitted",
        actor="scheduler",
        set_fields={"attempt": 1, "launch": plan, "launch_claimed_at": now,
                    **qc.repo.jobs.job_deadline_fields(now + 120)},
        remove_fields=[C.QUEUE_PK, C.QUEUE_SK, "launched_at", "wait_reason", "held"])
    lease = Update(table=store.table, key={C.JOB_PK: LEASE_KEY},
                   set_fields={"owner": "old-tick", "expires_at": 0, "item_type": "LEASE",
                               "inflight": {job_id: {"attempt": 1, "claimed_at": now, "resumes": 0}}})
    plan_items = store.plan_updates(job_id, 1, [n.container_instance_arn for n in nodes],
                                    [n.instance_id for n in nodes])
    assert store.db.transact([claim, lease, *plan_items])
    spec = LaunchSpec.from_item(item)
    tasks = []
    for rank in range(started):
        overrides = build_overrides(spec, "train", job_id=job_id, rank=rank, world_size=world, attempt=1,
                                    master_addr=plan["master_addr"], master_port=29500)
        tags = rank_tags(job_id, rank, world, 1)
        response = aws.client("ecs").start_task(
            cluster=qc.local.cluster_name, taskDefinition=qc.train_td,
            containerInstances=[nodes[rank].container_instance_arn],
            startedBy=old_started_by(job_id, 1, rank), group=job_group(job_id), overrides=overrides,
            tags=tags)
        task = str(response["tasks"][0]["taskArn"])
        tasks.append(task)
        if rank < registered:
            qc.recovery.register_rank(RankRegistration(
                job_id=job_id, rank=rank, world_size=world, attempt=1, task_arn=task,
                task_definition_arn=qc.train_td, container_instance_arn=nodes[rank].container_instance_arn,
                ec2_instance_id=nodes[rank].instance_id, overrides=overrides, tags=tags,
                group=job_group(job_id), started_by=old_started_by(job_id, 1, rank), state=RankState.STARTING,
                max_recovery_attempts=1, max_app_restarts=0, gpus=8))
    return tasks


def _ledger(qc: Any) -> dict[str, Any]:
    got = qc.table().get_item(Key={C.JOB_PK: LEASE_KEY}, ConsistentRead=True).get("Item") or {}
    return dict(from_ddb(got).get("inflight") or {})


def test_a_launch_whose_ranks_all_registered_before_the_upgrade_is_completed() -> None:
    """Given the older launcher's launch of a 2-node job: both ranks started and registered, its
    tick dead before it marked the launch complete
    When the upgraded scheduler ticks
    Then the launch is complete (attempt 1 STARTED), the job runs on its two tasks, the ledger
    entry is gone and nothing is started again."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        tasks = _old_launch_in_flight(qc, job, started=2, registered=2)
        result = qc.scheduler().tick()
        assert result.drained == [{"job_id": job, "action": "completed"}]
        assert _ledger(qc) == {}
        item = qc.item(job)
        assert item["launched_at"] and [a["outcome"] for a in item["attempts"]] == ["STARTED"]
        qc.sim.run_for(60)
        qc.recovery.sweep()
        assert qc.state(job) is JobState.RUNNING
        assert sorted(t.arn for t in qc.live_tasks(job)) == sorted(tasks)
        assert qc.scheduler().tick().drained == []  # once: the ledger is empty
    finally:
        gen.close()


def test_a_launch_cut_short_by_the_upgrade_is_aborted_and_launched_again_the_new_way() -> None:
    """Given the older launcher's launch of a 2-node job: rank 0 started and registered, rank 1
    started (its task running) but not registered, its tick dead
    When the upgraded scheduler ticks, the recovery sweep runs, and the back-off passes
    Then the rank 1 task no one knows is stopped, the launch is aborted (requeued, rank 0 stopped
    through the stop fan-out), the ledger entry gone; the job is then launched again as
    attempt 2 by the start fan-out, on two new tasks, none of the old ones left."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        old = _old_launch_in_flight(qc, job, started=2, registered=1)
        scheduler = qc.scheduler()
        result = scheduler.tick()
        assert result.drained == [{"job_id": job, "action": "aborted"}]
        assert _ledger(qc) == {}
        item = qc.item(job)
        assert item["job_state"] == JobState.PENDING_RESOURCES.value
        assert [a["outcome"] for a in item["attempts"]] == ["START_FAILED"]
        asked = {t.arn for t in qc.live_tasks(job) if t.desired_status == "STOPPED"}
        assert asked == set(old)  # both asked to stop by this tick
        qc.sim.run_for(60)
        assert not {t.arn for t in qc.live_tasks(job)} & set(old)  # both stopped
        for _ in range(10):
            qc.sim.run_for(60)
            qc.recovery.sweep()
            if scheduler.tick().admitted == [job]:
                break
        item = qc.item(job)
        assert item["attempt"] == 2 and item["start_fanout"]["kind"] == LAUNCH
        qc.sim.run_for(60)
        live = {t.arn for t in qc.live_tasks(job)}
        assert len(live) == 2 and not live & set(old)
        assert qc.state(job) is JobState.RUNNING
    finally:
        gen.close()


def test_a_start_intent_on_an_older_plan_logs_an_error_instead_of_crashing(caplog: Any) -> None:
    """Given a launch intent on a plan the older launcher wrote (no task definition ARN, no
    container)
    When the start fan-out runs it
    Then nothing is started and one clear error says what the plan lacks (no KeyError)."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        _old_launch_in_flight(qc, job, started=0, registered=0)
        qc.table().update_item(Key={C.JOB_PK: C.job_item_key(job)}, UpdateExpression="SET start_fanout = :f",
                               ExpressionAttributeValues={":f": {"attempt": 1, "at": 0, "kind": LAUNCH}})
        with caplog.at_level(logging.ERROR):
            qc.recovery.start_ranks(job)
        assert qc.live_tasks(job) == []
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("task_definition_arn" in message for message in errors)
    finally:
        gen.close()


def test_a_launch_the_old_launcher_requeued_with_a_stop_refused_has_its_tasks_stopped() -> None:
    """Given the older launcher's launch of a 2-node job aborted by that launcher (requeued, no
    stop intent) with rank 0 registered and rank 1 started but not registered, ECS having
    refused their stops (its ledger entry kept for its next tick)
    When the upgraded scheduler ticks
    Then both tasks are asked to stop (rank 1 found by its old startedBy) and the entry goes."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        old = _old_launch_in_flight(qc, job, started=2, registered=1)
        store = SchedulingRepository(qc.repo.jobs)
        assert store.requeue_after_failed_launch(
            job, 1, reason="start failed (INSUFFICIENT_RESOURCES)", queue_order=C.queue_order(0, 0.0, job),
            not_before=qc.sim.now() + 600, resource_failures=1, attempts=[])
        result = qc.scheduler().tick()
        assert result.drained == [{"job_id": job, "action": "abandoned"}]
        assert _ledger(qc) == {}
        asked = {t.arn for t in qc.live_tasks(job) if t.desired_status == "STOPPED"}
        assert asked == set(old)
    finally:
        gen.close()


def test_a_requeued_launch_whose_old_tasks_are_not_stopped_yet_is_not_admitted(monkeypatch: Any) -> None:
    """Given the older launcher's launch of a 2-node job aborted by that launcher (requeued, its
    back-off over, no stop intent), both ranks started, ECS refusing StopTask at the first tick
    When the upgraded scheduler ticks, then ticks again once ECS takes the stops
    Then the first tick keeps the ledger entry and does not admit the job (its old tasks still
    run: it would run twice, on the two free nodes); the second drains it."""
    gen = make_queue_cluster(nodes=[8, 8, 8, 8])  # two free nodes: room for it beside its old tasks
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        _old_launch_in_flight(qc, job, started=2, registered=2)
        store = SchedulingRepository(qc.repo.jobs)
        assert store.requeue_after_failed_launch(
            job, 1, reason="start failed (INSUFFICIENT_RESOURCES)", queue_order=C.queue_order(0, 0.0, job),
            not_before=0, resource_failures=1, attempts=[])
        scheduler = qc.scheduler()
        ecs = scheduler.drain.ecs  # type: ignore[union-attr]

        def refused(task_arn: str, reason: str) -> None:
            raise RuntimeError("ThrottlingException")

        monkeypatch.setattr(ecs, "stop_task", refused)
        first = scheduler.tick()
        assert first.drained == [{"job_id": job, "action": "stops_pending"}]
        assert first.admitted == [] and job in _ledger(qc)
        monkeypatch.undo()
        assert scheduler.tick().drained == [{"job_id": job, "action": "abandoned"}]
        assert _ledger(qc) == {}
    finally:
        gen.close()


def test_a_tick_dying_mid_drain_leaves_the_entry_for_the_next_one(monkeypatch: Any) -> None:
    """Given the older launcher's launch cut short (rank 0 registered, rank 1 not started)
    When the upgraded tick aborts it and dies before it removes the ledger entry, then the next
    tick runs
    Then the next tick finishes the drain (the entry goes) and the job is launched again once."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        _old_launch_in_flight(qc, job, started=1, registered=1)
        scheduler = qc.scheduler()
        store = scheduler.drain.store  # type: ignore[union-attr]
        drop = store.drop_ledger_entry

        def dies(job_id: str) -> bool:
            monkeypatch.setattr(store, "drop_ledger_entry", drop)
            raise RuntimeError("died")

        monkeypatch.setattr(store, "drop_ledger_entry", dies)
        assert scheduler.tick().drained == [{"job_id": job, "action": "drain_failed"}]
        assert qc.state(job) is JobState.PENDING_RESOURCES and job in _ledger(qc)
        assert scheduler.tick().drained == [{"job_id": job, "action": "abandoned"}]
        assert _ledger(qc) == {}
        for _ in range(10):
            qc.sim.run_for(60)
            qc.recovery.sweep()
            if scheduler.tick().admitted == [job]:
                break
        qc.sim.run_for(60)
        assert qc.item(job)["attempt"] == 2 and len(qc.live_tasks(job)) == 2
    finally:
        gen.close()


def test_the_drain_keeps_to_the_ticks_time_budget(monkeypatch: Any) -> None:
    """Given the older launcher's launches of two 1-node jobs in flight (both ranks started and
    registered), the tick's budget 30 s, and the first drain taking 40 s (a slow AWS)
    When the upgraded scheduler ticks, then ticks again
    Then the first tick drains the first launch only and defers the second (it stays in the
    ledger, its job not admitted, counted in UpgradeLaunchesNotDrained); the next tick drains it."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        first, second = _two_old_launches_in_flight(qc)
        scheduler = qc.scheduler()
        recorded = Recorded()
        monkeypatch.setattr(qc.recovery.metrics_relay, "target", recorded)
        _drain_taking(scheduler, monkeypatch, 40)
        drained = scheduler.tick(time_budget_seconds=30).drained
        earlier, later = sorted([first, second])
        assert drained == [{"job_id": earlier, "action": "completed"},
                           {"job_id": later, "action": "deferred"}]
        assert set(_ledger(qc)) == {later}
        assert recorded.names.count("UpgradeLaunchesNotDrained") == 1
        assert scheduler.tick(time_budget_seconds=30).drained == [{"job_id": later, "action": "completed"}]
        assert _ledger(qc) == {}
        assert recorded.names.count("UpgradeLaunchesNotDrained") == 1
    finally:
        gen.close()


def test_launches_not_drained_are_counted_every_tick(monkeypatch: Any) -> None:
    """Given the older launcher's launch of a 2-node job aborted by that launcher (requeued, both
    ranks started and registered), ECS refusing every StopTask
    When the upgraded scheduler ticks twice
    Then each tick counts the launch in UpgradeLaunchesNotDrained (it keeps the job out of
    admission: only a WARNING log said so), in the metrics of its own invocation (the recovery's
    relay pointed at them after the scheduler was built); once ECS takes the stops it is drained
    and no longer counted."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        _old_launch_in_flight(qc, job, started=2, registered=2)
        assert SchedulingRepository(qc.repo.jobs).requeue_after_failed_launch(
            job, 1, reason="start failed (INSUFFICIENT_RESOURCES)", queue_order=C.queue_order(0, 0.0, job),
            not_before=0, resource_failures=1, attempts=[])
        scheduler = qc.scheduler()
        ecs = scheduler.drain.ecs  # type: ignore[union-attr]
        stop_task = ecs.stop_task

        def refused(task_arn: str, reason: str) -> None:
            raise RuntimeError("ThrottlingException")

        monkeypatch.setattr(ecs, "stop_task", refused)
        for _ in range(2):
            invocation = Recorded()
            monkeypatch.setattr(qc.recovery.metrics_relay, "target", invocation)
            assert scheduler.tick().drained == [{"job_id": job, "action": "stops_pending"}]
            assert invocation.names == ["UpgradeLaunchesNotDrained"]
        monkeypatch.setattr(ecs, "stop_task", stop_task)
        assert scheduler.tick().drained == [{"job_id": job, "action": "abandoned"}]
        assert invocation.names == ["UpgradeLaunchesNotDrained"]
    finally:
        gen.close()


def _two_old_launches_in_flight(qc: Any) -> tuple[str, str]:
    """The older launcher's launches of two 1-node jobs in flight, both in its ledger (each rank
    started and registered, on node-0 and node-1)."""
    first, second = qc.submit(nnodes=1, gpus=8), qc.submit(nnodes=1, gpus=8)
    for node, job in enumerate((first, second)):
        _old_launch_in_flight(qc, job, started=1, registered=1, first_node=node)
    entry = {"attempt": 1, "claimed_at": int(qc.sim.now()), "resumes": 0}
    qc.table().update_item(Key={C.JOB_PK: LEASE_KEY}, UpdateExpression="SET inflight = :l",
                           ExpressionAttributeValues={":l": {first: entry, second: entry}})
    return first, second


def _drain_taking(scheduler: Any, monkeypatch: Any, seconds: float) -> None:
    """Each entry's first read takes ``seconds`` of the tick's clock (a slow AWS)."""
    elapsed = [0.0]
    monkeypatch.setattr(scheduler_module, "time", SimpleNamespace(monotonic=lambda: elapsed[0]))
    store = scheduler.drain.store
    job_item = store.job_item

    def slow(job_id: str) -> Any:
        elapsed[0] += seconds
        return job_item(job_id)

    monkeypatch.setattr(store, "job_item", slow)


@dataclass
class TwoOldLaunches:
    """The older launcher's launches of two 1-node jobs in flight (each rank started and
    registered, on node-0 and node-1; ``earlier`` is drained first), a 1-node job ``queued``
    behind them and a free node; ``scheduler`` the upgraded one."""

    qc: Any
    scheduler: Any
    earlier: str
    later: str
    queued: str
    monkeypatch: pytest.MonkeyPatch

    def drain_taking(self, seconds: float) -> None:
        _drain_taking(self.scheduler, self.monkeypatch, seconds)


@pytest.fixture
def two_old_launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoOldLaunches]:
    gen = make_queue_cluster(nodes=[8, 8, 8])
    qc = next(gen)
    try:
        first, second = _two_old_launches_in_flight(qc)
        queued = qc.submit(nnodes=1, gpus=8)
        earlier, later = sorted([first, second])
        yield TwoOldLaunches(qc, qc.scheduler(), earlier, later, queued, monkeypatch)
    finally:
        gen.close()


def test_the_drain_takes_an_entry_only_with_its_margin_left(two_old_launches: TwoOldLaunches) -> None:
    """Given the older launcher's launches of two 1-node jobs in flight, the tick's budget 45 s,
    and the first entry's drain taking 25 s (20 s left, 5 s of them the drain's once admission's
    15 s are kept: less than an entry's own calls may take)
    When the upgraded scheduler ticks
    Then the second entry is deferred (not started with 5 s of the drain's share left, its calls
    running into admission's time); the next tick drains it."""
    setup = two_old_launches
    setup.drain_taking(25)
    earlier, later, scheduler = setup.earlier, setup.later, setup.scheduler
    assert scheduler.tick(time_budget_seconds=45).drained == [
        {"job_id": earlier, "action": "completed"}, {"job_id": later, "action": "deferred"}]
    assert set(_ledger(setup.qc)) == {later}
    setup.monkeypatch.undo()
    assert scheduler.tick(time_budget_seconds=45).drained == [{"job_id": later, "action": "completed"}]


def test_the_drain_leaves_admission_its_share_of_the_budget(two_old_launches: TwoOldLaunches) -> None:
    """Given the older launcher's launches of two 1-node jobs in flight, a 1-node job queued behind
    them and a free node, the tick's budget 30 s, each entry's drain taking 10 s
    When the upgraded scheduler ticks, then ticks again
    Then the first tick drains the first entry, defers the second (admission's 15 s are not the
    drain's) and still admits the queued job: entries whose calls are slow tick after tick delay
    the drain, never the queue behind it; the next tick drains the second entry."""
    setup = two_old_launches
    setup.drain_taking(10)
    earlier, later, scheduler = setup.earlier, setup.later, setup.scheduler
    result = scheduler.tick(time_budget_seconds=30)
    assert result.drained == [{"job_id": earlier, "action": "completed"},
                              {"job_id": later, "action": "deferred"}]
    assert result.admitted == [setup.queued]
    assert scheduler.tick(time_budget_seconds=30).drained == [{"job_id": later, "action": "completed"}]


def test_a_budget_below_the_margins_still_drains_an_entry_a_tick(two_old_launches: TwoOldLaunches) -> None:
    """Given the older launcher's launches of two 1-node jobs in flight and a tick's budget of 5 s
    (below admission's share and an entry's margin: the setting refuses it, but the invocation's
    time left, which the handler passes, can be that short)
    When the upgraded scheduler ticks twice
    Then each tick drains one entry (its first whatever is left): the ledger empties, it is never
    deferred tick after tick."""
    setup = two_old_launches
    earlier, later, scheduler = setup.earlier, setup.later, setup.scheduler
    assert scheduler.tick(time_budget_seconds=5).drained == [
        {"job_id": earlier, "action": "completed"}, {"job_id": later, "action": "deferred"}]
    assert scheduler.tick(time_budget_seconds=5).drained == [{"job_id": later, "action": "completed"}]
    assert _ledger(setup.qc) == {}


def test_a_time_budget_setting_below_both_margins_fails_every_tick_naming_it() -> None:
    """Given SCHEDULER_TIME_BUDGET_SECONDS just below 30 s (admission's 15 s and an entry's 10 s
    with the first entry's calls besides)
    When the scheduler's settings are read (each tick reads them)
    Then they are refused, naming the variable and its minimum; 30 s is accepted."""
    assert MIN_SCHEDULER_TIME_BUDGET_SECONDS >= ADMISSION_MARGIN_SECONDS + ENTRY_MARGIN_SECONDS
    with pytest.raises(SettingsError, match=r"SCHEDULER_TIME_BUDGET_SECONDS must be >= 30, got 29"):
        SchedulerConfig.from_env({C.ENV_SCHEDULER_TIME_BUDGET_SECONDS: "29"})
    assert SchedulerConfig.from_env({C.ENV_SCHEDULER_TIME_BUDGET_SECONDS: "30"}).time_budget_seconds == 30.0
