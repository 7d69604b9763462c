"""Preemption, graceful and forced suspend, resume and quotas: the real scheduler tick and the
recovery handlers against the emulator (moto + simulated ECS, AWS-shaped task events)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.adapters import aws
from gpu_recovery.constants import JobState, RankState
from gpu_recovery.domain.control_token import make_token
from gpu_recovery.domain.time_sharing import Priority
from gpu_recovery.repository.time_sharing import QuotaRepository
from tests.fixtures.queue_cluster import QueueCluster, make_queue_cluster
from tests.queue_scheduler._cluster_moves import steal_gpus

LOW, ABOVE, HIGH = int(Priority.LOW), int(Priority.ABOVE_NORMAL), int(Priority.HIGH)
SECRET = "11" * 32


@pytest.fixture
def tc() -> Iterator[QueueCluster]:
    """Four 8-GPU nodes; the recovery sweep runs every minute."""
    yield from make_queue_cluster(nodes=[8, 8, 8, 8], sweep=True)


def env_of(task: Any) -> dict[str, str]:
    [override] = task.overrides["containerOverrides"]
    return {e["name"]: e["value"] for e in override["environment"]}


def quotas(tc: QueueCluster) -> QuotaRepository:
    return QuotaRepository(aws.resource("dynamodb"), tc.local.quota_table)


def used(tc: QueueCluster, user: str, priority: int) -> int:
    item = quotas(tc).get(user, priority) or {}
    return int(item.get("used_nodes") or 0)


def reasons(tc: QueueCluster, job: str) -> list[str]:
    return [f"{h.get('to')}: {h.get('reason')}" for h in tc.item(job).get("history", [])]


def start_low(tc: QueueCluster, *, nnodes: int = 4, user: str = "alice", run: float | None = None,
              **extra: Any) -> str:
    family = f"low-{len(tc.submitted)}"
    td = tc.sim.register_training_task_definition(family, gpus=8)
    tc.sim.plan_family(family, run_seconds=run, exit_code=0)
    job = tc.submit(nnodes=nnodes, priority=LOW, user=user, task_definition=td,
                    control_secret=SECRET, suspend_grace_seconds=60, quota_subject=user, **extra)
    assert tc.scheduler().tick().admitted == [job]
    tc.sim.run_for(30)
    assert tc.state(job) is JobState.RUNNING
    return job


def submit_high(tc: QueueCluster, *, nnodes: int = 2, user: str = "bob", run: float = 600) -> str:
    td = tc.sim.register_training_task_definition(f"high-{len(tc.submitted)}", gpus=8)
    tc.sim.plan_family(f"high-{len(tc.submitted)}", run_seconds=run, exit_code=0)
    return tc.submit(nnodes=nnodes, priority=HIGH, user=user, task_definition=td, quota_subject=user,
                     control_secret=SECRET)


def test_a_higher_priority_job_preempts_gracefully_and_the_victim_resumes(tc, monkeypatch):
    """Given alice's LOW 4-node job filling the cluster
    When bob's HIGH 2-node job is queued and the scheduler ticks
    Then alice's job is SUSPENDING (not failed): its rank 0 is told through the control channel,
    checkpoints and calls go_suspend(); every rank is stopped at once and the job is SUSPENDED,
    back in the queue; the next tick starts bob's job; when it ends, alice's job resumes with
    RESUME_COUNT=1 at attempt 2, keeps its recovery budget, and completes. Quota usage follows."""
    monkeypatch.setenv(C.ENV_CONTROL_API_URL, "https://api.example/prod")
    low = start_low(tc, run=3600)
    first_tasks = sorted(t.arn for t in tc.live_tasks(low))
    assert used(tc, "alice", LOW) == 4
    high = submit_high(tc)
    tick = tc.scheduler().tick()
    assert tick.preempted == [low] and tick.admitted == []
    item = tc.item(low)
    assert item["job_state"] == "SUSPENDING" and item["suspend"]["by_job"] == high
    assert "preempted by job" in item["suspend"]["reason"]
    assert "forbidden" not in tc.item(high).get("wait_reason", "")
    # Rank 0's environment carries its own control token and the API URL.
    rank0 = next(t for t in tc.live_tasks(low) if t.tags[C.TAG_RANK] == "0")
    env = env_of(rank0)
    assert env[C.CONTROL_URL_ENV] == "https://api.example/prod"
    assert env[C.CONTROL_TOKEN_ENV] == make_token(low, 0, SECRET) and env[C.RESUME_COUNT_ENV] == "0"
    control = runtime.job_control_service()
    assert control.authorize(env[C.CONTROL_TOKEN_ENV]) == (low, 0)
    assert control.status(low, 0)["suspend"] is True
    assert control.status(low, 1)["suspend"] is False  # only rank 0 is told
    # Rank 0 saved its checkpoint; go_suspend() stops every rank at once.
    out = control.go_suspend(low, 0, 1)
    assert out["state"] == "SUSPENDING" and sorted(out["stopping_ranks"]) == [0, 1, 2, 3]
    tc.sim.run_for(30)
    item = tc.item(low)
    assert item["job_state"] == "SUSPENDED" and item[C.QUEUE_PK] == C.QUEUE_BUCKET
    assert item["recoveries_used"] == 0 and item["suspend_count"] == 1
    tick = tc.scheduler().tick()
    assert tick.admitted == [high] and low in tick.quota_released
    assert used(tc, "alice", LOW) == 0 and used(tc, "bob", HIGH) == 2
    tc.sim.run_for(11 * 60)  # bob's job runs 10 minutes and ends
    assert tc.state(high) is JobState.COMPLETE
    tick = tc.scheduler().tick()
    assert tick.admitted == [low] and high in tick.quota_released
    resumed = tc.item(low)
    assert resumed["attempt"] == 2 and resumed["resume_count"] == 1
    assert all(env_of(t)[C.RESUME_COUNT_ENV] == "1" and env_of(t)["ATTEMPT"] == "2"
               for t in tc.live_tasks(low))
    history = reasons(tc, low)
    assert any(r.startswith("SUSPENDING: suspend requested (preempted)") and high in r for r in history)
    assert any(r.startswith("SUSPENDED: suspended (preempted by job") for r in history)
    assert any(r.startswith("STARTING: resumed (resume 1") and high in r for r in history)
    assert used(tc, "alice", LOW) == 4 and used(tc, "bob", HIGH) == 0
    # The relaunch kept attempt 1's task on each rank item (its log is read by attempt).
    job = tc.repo.jobs.get_job(low)
    kept = [r.task_of_attempt(1) for r in tc.repo.jobs.get_ranks(job)]
    assert sorted(t.task_arn for t in kept if t is not None) == first_tasks


def test_a_job_that_ignores_the_suspend_is_stopped_by_force_after_its_grace(tc):
    """Given a LOW job preempted with a 60 s grace whose rank 0 never calls go_suspend()
    When the grace passes
    Then the recovery sweep stops every rank (our stop reason, not a user stop, not a fault):
    SUSPENDED and queued again, no recovery spent, no health check."""
    low = start_low(tc, run=3600)
    submit_high(tc)
    assert tc.scheduler().tick().preempted == [low]
    deadline = tc.item(low)["suspend"]["deadline_at"]
    tc.sim.run_until_true(lambda: tc.sim.now() >= deadline - 5, max_seconds=120)
    assert tc.state(low) is JobState.SUSPENDING  # still within its grace
    tc.sim.run_for(150)  # the next sweep forces the stop; the STOPPED events finish it
    item = tc.item(low)
    assert item["job_state"] == "SUSPENDED", reasons(tc, low)
    assert "grace of 60 s over" in item["suspend"]["stop_reason"]
    assert item["recoveries_used"] == 0 and not item.get("suspects")
    ranks = tc.repo.jobs.get_ranks(tc.repo.jobs.get_job(low))
    assert {r.state for r in ranks} == {RankState.STOPPED}
    assert not any(t.health_check for t in tc.sim.tasks.values())


def test_a_rank_failing_on_its_own_during_the_grace_is_a_fault_not_a_suspension(tc):
    """Given a LOW job being suspended (grace running)
    When one of its ranks dies with a suspect exit code before any stop
    Then the recovery loop takes it (PENDING_HEALTHCHECK): the fault wins over the suspension."""
    low = start_low(tc, run=3600)
    submit_high(tc)
    assert tc.scheduler().tick().preempted == [low]
    victim = next(t for t in tc.live_tasks(low) if t.tags[C.TAG_RANK] == "2")
    tc.sim.inject_task_exit(victim.arn, exit_code=1, after=1)
    tc.sim.run_for(5)
    assert tc.state(low) is JobState.PENDING_HEALTHCHECK, reasons(tc, low)


def test_user_suspend_holds_and_resume_requeues_at_the_original_position(tc):
    """Given two LOW jobs of alice queued behind a full cluster, the first submitted first
    When she suspends the first (held), the second runs after the cluster frees; she resumes the
    first and suspends the second
    Then the first waits at its original position (ahead of later LOW jobs) and starts first."""
    blocker = start_low(tc, nnodes=4, user="carol", run=120)
    first = tc.submit(nnodes=4, priority=LOW, user="alice", quota_subject="alice")
    second = tc.submit(nnodes=4, priority=LOW, user="alice", quota_subject="alice")
    service = tc.jobs_service()
    out = service.suspend(first, "alice")
    assert out["state"] == "SUSPENDED" and out["held"] and tc.item(first)["held"] is True
    assert C.QUEUE_PK not in tc.item(first)
    tc.sim.run_for(150)
    assert tc.state(blocker) is JobState.COMPLETE
    late = tc.submit(nnodes=4, priority=LOW, user="dave", quota_subject="dave")
    assert service.resume(first, "alice")["changed"] is True
    tick = tc.scheduler().tick()
    assert tick.admitted == [first]  # its original position, ahead of the later jobs
    assert tc.state(second) is JobState.QUEUED and tc.state(late) is JobState.QUEUED


def test_a_hold_that_lands_after_the_tick_read_the_queue_is_kept(tc, monkeypatch):
    """Given a suspended job waiting in the queue to be resumed, in the page the scheduler's
    tick has just read
    When its owner holds it (suspend: out of the queue, still SUSPENDED) before the tick
    launches it
    Then the tick's claim fails: the job stays held, nothing is charged or started (the claim
    was conditioned on the state only, and took the hold back)."""
    job = tc.submit(nnodes=2, priority=LOW, user="alice", quota_subject="alice")
    service = tc.jobs_service()
    assert service.suspend(job, "alice")["held"] is True
    assert service.resume(job, "alice")["changed"] is True
    assert tc.state(job) is JobState.SUSPENDED and C.QUEUE_PK in tc.item(job)
    scheduler = tc.scheduler()
    read = scheduler._queue_head

    def page_then_hold():  # the owner's request lands between the tick's read and its claim
        items = list(read())
        assert service.suspend(job, "alice")["held"] is True
        return iter(items)

    monkeypatch.setattr(scheduler, "_queue_head", page_then_hold)
    assert scheduler.tick().admitted == []
    item = tc.item(job)
    assert item["job_state"] == "SUSPENDED" and item["held"] is True and C.QUEUE_PK not in item
    assert not tc.live_tasks(job) and used(tc, "alice", LOW) == 0


def test_running_user_suspend_is_graceful_then_held(tc):
    low = start_low(tc, run=3600)
    service = tc.jobs_service()
    out = service.suspend(low, "alice")
    assert out["state"] == "SUSPENDING" and out["deadline_at"] > tc.sim.now()
    assert runtime.job_control_service().status(low, 0)["suspend"] is True
    runtime.recovery_service().go_suspend(low, 0)
    tc.sim.run_for(30)
    item = tc.item(low)
    assert item["job_state"] == "SUSPENDED" and item["held"] is True and C.QUEUE_PK not in item
    assert tc.scheduler().tick().admitted == []  # held: not in the queue
    assert service.resume(low, "alice")["changed"] is True
    assert tc.scheduler().tick().admitted == [low]


def test_quota_caps_admission_and_is_released_when_jobs_end(tc):
    """Given alice may hold 2 nodes at LOW
    When she queues three 1-node LOW jobs on a free 4-node cluster
    Then two start and the third waits for quota (and says so), although nodes are free; bob's
    job is not held back by her quota; when one of hers ends, the next tick releases its charge
    and starts the third."""
    quotas(tc).set_limit("alice", LOW, 2, by="test", now=tc.sim.now())
    fam = tc.sim.register_training_task_definition("short", gpus=8)
    tc.sim.plan_family("short", run_seconds=300, exit_code=0)
    a, b, c = (tc.submit(nnodes=1, priority=LOW, user="alice", quota_subject="alice", task_definition=fam)
               for _ in range(3))
    bob = tc.submit(nnodes=1, priority=LOW, user="bob", quota_subject="bob", task_definition=fam)
    tick = tc.scheduler().tick()
    assert tick.admitted == [a, b, bob] and tick.quota_waiting == [c]
    assert used(tc, "alice", LOW) == 2
    assert "quota: alice holds 2 of 2 node(s) at LOW" in tc.item(c)["wait_reason"]
    tc.sim.run_for(330)
    assert tc.state(a) is JobState.COMPLETE
    tick = tc.scheduler().tick()
    assert set(tick.quota_released) == {a, b, bob} and tick.admitted == [c]
    assert used(tc, "alice", LOW) == 1 and used(tc, "bob", LOW) == 0


def test_above_normal_is_demoted_after_thirty_minutes_and_becomes_preemptible(tc):
    job = tc.submit(nnodes=4, priority=ABOVE, user="alice", quota_subject="alice", control_secret=SECRET)
    assert tc.scheduler().tick().admitted == [job]
    tc.sim.run_for(29 * 60)
    assert tc.scheduler().tick().demoted == []
    tc.sim.run_for(60)
    assert tc.scheduler().tick().demoted == [job]
    item = tc.item(job)
    assert item["priority"] == int(Priority.NORMAL) and item["demoted_from"] == ABOVE
    assert "ABOVE_NORMAL -> NORMAL after 30 min" in reasons(tc, job)[-1]
    contender = tc.submit(nnodes=2, priority=ABOVE, user="bob", quota_subject="bob")
    assert tc.scheduler().tick().preempted == [job]
    assert tc.state(contender) is JobState.QUEUED


def test_a_launch_a_dead_tick_left_keeps_its_nodes_until_it_is_resumed(tc):
    """Given a tick that claimed a 4-node job and died on its StartTask calls (throttled)
    When a smaller job is queued and the next tick runs before the launch is resumed
    Then the smaller job does not take the nodes planned for the first (it would make the
    resumed launch fail for lack of GPUs); the recovery sweep sends the launch's start intent
    again, which starts every rank there."""
    from local_mode.sim.api_errors import THROTTLING

    first = tc.submit(nnodes=4, priority=HIGH, user="bob", quota_subject="bob")
    tc.local.faults.persistent("ecs", "StartTask", error=THROTTLING)
    outcome = tc.scheduler().tick().launches
    tc.local.faults.clear()
    assert [o["action"] for o in outcome] == ["interrupted"]
    assert tc.state(first) is JobState.STARTING and used(tc, "bob", HIGH) == 4
    second = tc.submit(nnodes=1, priority=LOW, user="alice", quota_subject="alice")
    assert tc.scheduler().tick().admitted == []
    assert tc.state(second) is JobState.QUEUED
    tc.sim.run_for(125)
    tc.recovery.sweep()
    assert tc.scheduler().tick().admitted == []
    assert len(tc.live_tasks(first)) == 4 and used(tc, "bob", HIGH) == 4


def _launch_not_placed(tc: QueueCluster) -> None:
    """The next tick's launch is not placed: another tenant takes every free GPU between the
    tick's snapshot and its StartTask (requeued), then leaves."""
    scheduler, thieves = tc.scheduler(), []
    real_snapshot = scheduler.snapshot

    def racing_snapshot() -> Any:
        nodes = real_snapshot()
        thieves.extend(steal_gpus(tc, node) for node in nodes if tc.sim.node(node).free_gpu_ids)
        return nodes

    scheduler.snapshot = racing_snapshot  # type: ignore[method-assign]
    [launch] = scheduler.tick().launches
    assert launch["action"] == "requeued"
    for thief in thieves:
        aws.client("ecs").stop_task(cluster=tc.local.cluster_name, task=thief)
    tc.sim.run_for(20)


def _preempted_then_launch_fails(tc: QueueCluster, failures: int) -> tuple[str, str]:
    """alice's LOW 4-node job preempted for bob's HIGH 2-node job (suspended, back in the queue);
    bob's launch then fails ``failures`` times in a row (another tenant takes the nodes' GPUs
    between the tick's snapshot and its StartTask: not placed, requeued with the back-off of a
    placement failure; the tenant then leaves). The two jobs."""
    low = start_low(tc, run=3600)
    high = submit_high(tc)
    assert tc.scheduler().tick().preempted == [low]
    runtime.job_control_service().go_suspend(low, 0, 1)
    tc.sim.run_for(30)
    assert tc.state(low) is JobState.SUSPENDED
    for failure in range(1, failures + 1):
        if failure > 1:
            tc.sim.run_for(float(tc.item(high)["not_before"]) - tc.sim.now() + 1)
        _launch_not_placed(tc)
        assert tc.item(high)["resource_failures"] == failure
    return low, high


def test_the_nodes_a_preemptor_freed_wait_for_it_through_its_first_launch_back_off(tc):
    """Given alice's LOW job suspended for bob's HIGH job, whose launch then failed once (a rank not
    placed: back in the queue for a minute's back-off)
    When the scheduler ticks during the back-off
    Then alice's job is not resumed on the nodes bob's job needs (it would be preempted again a
    minute later: a second checkpoint and suspension): bob's job keeps them reserved, starting
    nothing and preempting nothing; after the back-off bob's job starts."""
    low, high = _preempted_then_launch_fails(tc, failures=1)
    tick = tc.scheduler().tick()
    assert tick.admitted == [] and tick.preempted == [] and tc.state(low) is JobState.SUSPENDED
    tc.sim.run_for(float(tc.item(high)["not_before"]) - tc.sim.now() + 1)
    assert tc.scheduler().tick().admitted == [high]
    assert tc.item(low)["suspend_count"] == 1


def test_a_preemptor_whose_launches_keep_failing_reserves_nothing_while_it_backs_off(tc):
    """Given the same, bob's launch failed twice in a row
    When the scheduler ticks during the (two-minute) back-off
    Then alice's job resumes: a job whose launches keep failing does not stall the queue."""
    low, _high = _preempted_then_launch_fails(tc, failures=2)
    assert tc.scheduler().tick().admitted == [low]
