"""No healthy node free: a relocatable job waits for one instead of failing (issue 19),
with fakes of the ports. The wait is written once per fault, retried by the sweep, keeps
the node that frees for the job, and fails the job with its reason at its deadline."""

from __future__ import annotations

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from tests.recovery.fakes import FakeEcs, World, throttle_once, world

FAULTY, PEER, OTHER = "node-b", "node-a", "node-c"
RELOCATABLE = {C.TAG_RELOCATABLE: "true"}


def _dead_gpu(w: World, arns: list[str], *, redeliver: bool = False) -> None:
    """Rank 1 exits 1, rank 0 is stopped by us, node-b's DCGM diag says replace (exit 2)."""
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
    [task] = w.ecs.health_checks_on(FAULTY)
    verdict = w.health_check_stopped(task, 2)
    w.service.on_health_check_stopped(verdict)
    if redeliver:
        w.service.on_health_check_stopped(verdict)


def _full_cluster(w: World) -> tuple[list[str], list[str]]:
    """The relocatable job on node-a/node-b, another job busy on node-c: nothing free."""
    other = w.register_job("k", [OTHER])
    return w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE), other


def _waits(w: World, job_id: str) -> list[str]:
    item = w.repo.jobs.get_job_item(job_id) or {}
    reasons = [str(h.get("reason", "")) for h in item.get("history", [])]
    return [r for r in reasons if r.startswith("waiting")]


def test_with_no_free_node_the_job_waits_and_moves_to_the_node_that_frees() -> None:
    """Given a full cluster, When node-b's GPU is dead (replace), Then the relocatable job
    waits in PENDING_RESTART (charged once, not failed); When job k ends on node-c, Then
    the next sweep restarts rank 1 there (attempt 2), and its budget is still charged once."""
    with world(relocation_wait_seconds=1800) as w:
        arns, other = _full_cluster(w)
        _dead_gpu(w, arns)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_RESTART and job.relocation_wait is not None
        assert job.relocation_wait.from_nodes == (FAULTY,) and job.relocation_wait.seconds == 1800
        assert job.recoveries_used == 1
        assert _waits(w, "j") == [f"waiting up to 1800 s for a healthy node to free up to relocate the "
                                  f"ranks on {FAULTY} (node(s) unusable: {FAULTY} replace)"]
        for _ in range(3):  # still nothing free: the sweep keeps it waiting, charges nothing
            w.advance(61)
            w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_RESTART and job.recoveries_used == 1
        assert not [n for n in w.notifier.sent if n.kind is C.NotificationKind.FAILED]

        w.service.on_task_state_change(w.task_stopped(other[0], exit_code=0))  # k completes
        assert w.repo.jobs.get_job("k").state is JobState.COMPLETE
        w.advance(61)
        w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2
        assert job.recoveries_used == 1
        moves = w.repo.faults.placement("j", 2)
        assert {a: m["node"] for a, m in moves.items()} == {FAULTY: OTHER}
        started = sorted(t.node for t in w.ecs.tasks.values()
                         if t.last_status == "RUNNING" and t.group != C.HEALTH_CHECK_GROUP)
        assert started == [PEER, OTHER]
        [relocation] = (w.repo.jobs.get_job_item("j") or {})["relocations"]
        assert "after waiting" in relocation["reason"]


def test_a_waiting_jobs_minute_whose_cluster_listing_fails_once_still_takes_the_node_that_freed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the job waiting for a free node, When job k ends on node-c and the next sweep's
    cluster listing is throttled once, Then the snapshot (reads only) is taken again at once
    and rank 1 moves to node-c in that sweep, instead of the minute being lost while node-c
    stands free for any other scheduler (soak seed 7210 at 6 % of calls failing)."""
    with world(relocation_wait_seconds=1800) as w:
        arns, other = _full_cluster(w)
        _dead_gpu(w, arns)
        w.service.on_task_state_change(w.task_stopped(other[0], exit_code=0))  # k completes
        listed = w.ecs.cluster_listings  # the sweep's first listing (its refresh) goes through
        failed = throttle_once(monkeypatch, FakeEcs, "container_instances", "ListContainerInstances",
                               lambda: w.ecs.cluster_listings > listed)
        w.advance(61)
        w.service.sweep()
        assert failed, "the premise: the sweep's cluster listing failed"
        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2
        assert {a: m["node"] for a, m in w.repo.faults.placement("j", 2).items()} == {FAULTY: OTHER}


def test_the_wait_ends_at_its_deadline_with_its_reason_and_operators_are_told() -> None:
    with world(relocation_wait_seconds=300) as w:
        arns, _ = _full_cluster(w)
        _dead_gpu(w, arns)
        w.advance(240)
        w.service.sweep()
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        w.advance(120)
        w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED
        assert job.last_error.startswith(
            f"no healthy node freed within 300 s to relocate the ranks on {FAULTY}")
        [failed] = [n for n in w.notifier.sent if n.kind is C.NotificationKind.FAILED]
        assert "no healthy node freed within 300 s" in failed.body


def test_a_redelivered_verdict_and_later_sweeps_neither_extend_nor_repeat_the_wait() -> None:
    """Given the verdict event delivered twice and the restart tried again by events and
    sweeps, Then the wait is written once (one history entry, the first deadline kept)."""
    with world(relocation_wait_seconds=600) as w:
        arns, _ = _full_cluster(w)
        _dead_gpu(w, arns, redeliver=True)
        first = w.repo.jobs.get_job("j").relocation_wait
        assert first is not None
        for _ in range(4):
            w.advance(61)
            w.service.restarts.try_restart("j")
            w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.relocation_wait == first and len(_waits(w, "j")) == 1
        assert job.state is JobState.PENDING_RESTART and job.recoveries_used == 1
        w.advance(400)
        w.service.sweep()
        assert w.repo.jobs.get_job("j").state is JobState.FAILED  # 600 s from the first write


def test_a_freed_node_goes_to_the_job_that_waited_longest() -> None:
    """Given two relocatable jobs waiting (j first, then m), When one node frees, Then it is
    reserved for j: m, tried first, keeps waiting; j moves there."""
    with world(relocation_wait_seconds=1800) as w:
        arns, other = _full_cluster(w)
        _dead_gpu(w, arns)
        w.advance(30)
        m = w.register_job("m", ["node-d", "node-e"], tags=RELOCATABLE)
        w.service.on_task_state_change(w.task_stopped(m[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            m[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [task] = w.ecs.health_checks_on("node-e")
        w.service.on_health_check_stopped(w.health_check_stopped(task, 2))
        assert w.repo.jobs.get_job("m").relocation_wait is not None
        w.service.on_task_state_change(w.task_stopped(other[0], exit_code=0))  # node-c frees
        assert w.service.restarts.try_restart("m").action == "waiting"
        assert w.repo.jobs.get_job("m").state is JobState.PENDING_RESTART
        assert w.service.restarts.try_restart("j").action in ("restarted", "restarting")
        assert {a: m["node"] for a, m in w.repo.faults.placement("j", 2).items()} == {FAULTY: OTHER}


def test_zero_wait_fails_at_once_as_before() -> None:
    with world(relocation_wait_seconds=0) as w:
        arns, _ = _full_cluster(w)
        _dead_gpu(w, arns)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED and job.last_error.startswith("no healthy free node to relocate")
