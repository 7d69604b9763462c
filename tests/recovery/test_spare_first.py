"""Spare first (issue 19), with fakes of the ports: a relocatable job whose node is
suspect moves to a healthy free node as soon as its old ranks ended, without waiting for
the DCGM verdict; the node's check goes on for the node alone. Exactly one restart per
fault whatever the order of events; no free node (or no budget): the verdicts decide, as
before."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.domain.relocation import SparePool
from gpu_recovery.domain.states import InstanceState, SuspectVerdict
from tests.recovery.fakes import World, ci_arn, world

FAULTY, PEER, SPARE = "node-b", "node-a", "node-c"
RELOCATABLE = {C.TAG_RELOCATABLE: "true"}
HEALTHY, REPLACE = 0, 2


def _spare_world(**settings: Any) -> Any:
    return world(spare_nodes=SparePool(1), **settings)


def _rank_1_dies(w: World, arns: list[str]) -> None:
    """Rank 1 exits 1 on node-b (a suspected GPU fault), rank 0 is stopped by us."""
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))


def _running_training(w: World) -> list[str]:
    return sorted(t.node for t in w.ecs.tasks.values()
                  if t.last_status == "RUNNING" and t.group != C.HEALTH_CHECK_GROUP)


def _node_verdict(w: World, exit_code: int) -> Any:
    """The STOPPED event of node-b's check (returned, to deliver it again)."""
    [task] = [t for t in w.ecs.health_checks_on(FAULTY) if t.last_status == "RUNNING"]
    event = w.health_check_stopped(task, exit_code)
    w.service.on_health_check_stopped(event)
    return event


def _suspect(w: World, attempt: int = 1) -> Any:
    return w.repo.faults.get_suspect("j", attempt, FAULTY)


def test_the_job_moves_to_the_spare_before_the_verdict_and_the_node_is_still_quarantined() -> None:
    with _spare_world() as w:
        w.ecs.spare_nodes.append(SPARE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        _rank_1_dies(w, arns)

        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2
        assert (job.recoveries_used, job.app_restarts_used) == (1, 0)
        assert {a: m["node"] for a, m in w.repo.faults.placement("j", 2).items()} == {FAULTY: SPARE}
        assert _running_training(w) == [PEER, SPARE]
        assert _suspect(w).verdict is SuspectVerdict.LEFT
        node = w.repo.instances.get_instance(FAULTY)
        assert node.state is InstanceState.HEALTH_CHECKING
        assert not node.hc_jobs and node.left_jobs == [("j", 1)]
        assert len(w.ecs.health_checks_on(FAULTY)) == 1  # its diag runs all the same

        _node_verdict(w, REPLACE)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.QUARANTINED
        assert w.ecs.drained == [ci_arn(FAULTY)]
        record = w.repo.instances.get_instance_item(FAULTY)
        assert record["fault_history"][-1]["job_id"] == "j"  # the job's evidence went to the node
        assert record["fault_history"][-1]["evidence"]["exit_code"] == 1
        faulty = w.repo.instances.get_instance(FAULTY).container_inst_id
        after = w.repo.tables.db.get("jobs", {C.JOB_PK: C.suspect_item_key("j", 1, faulty)})
        assert after["after_leaving"]["node_state"] == "QUARANTINED"
        job = w.repo.jobs.get_job("j")
        assert (job.state, job.attempt, job.recoveries_used) == (JobState.RUNNING, 2, 1)
        assert not [n for n in w.notifier.sent if n.kind is C.NotificationKind.FAILED]


def test_a_healthy_verdict_after_the_move_charges_nothing_more_and_the_node_returns() -> None:
    """The diag later finds node-b healthy (the exit was the application's): the job keeps
    running on the spare, charged the one infrastructure recovery of the move (not an
    application restart); node-b is AVAILABLE again, for the pool."""
    with _spare_world() as w:
        w.ecs.spare_nodes.append(SPARE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        _rank_1_dies(w, arns)
        _node_verdict(w, HEALTHY)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.AVAILABLE
        job = w.repo.jobs.get_job("j")
        assert (job.state, job.attempt, job.recoveries_used, job.app_restarts_used) == \
            (JobState.RUNNING, 2, 1, 0)
        assert not [n for n in w.notifier.sent if n.kind in (C.NotificationKind.FAILED,
                                                             C.NotificationKind.APPLICATION_ERROR)]


def test_duplicate_and_stale_deliveries_restart_the_job_once() -> None:
    """Every stop event delivered again, the move asked again with the job as read before
    it, the verdict delivered twice: one move, one attempt, one charge."""
    with _spare_world() as w:
        w.ecs.spare_nodes.append(SPARE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        stale = w.repo.jobs.get_job("j")
        _rank_1_dies(w, arns)
        _rank_1_dies(w, arns)  # redelivered
        for _ in range(2):  # the sweep, or a late delivery, with the job as read before the move
            assert w.service.restarts.spare_first(stale).action in ("ignored", "duplicate", "waiting")
        w.advance(61)
        w.service.sweep()
        w.service.on_health_check_stopped(_node_verdict(w, REPLACE))  # and again
        job = w.repo.jobs.get_job("j")
        assert (job.state, job.attempt, job.recoveries_used) == (JobState.RUNNING, 2, 1)
        assert len(w.ecs.health_checks_on(FAULTY)) == 1
        starts = [t for t in w.ecs.tasks.values() if t.group != C.HEALTH_CHECK_GROUP]
        assert len(starts) == 4  # the two ranks of attempt 1, the two of attempt 2


def test_a_verdict_that_lands_first_wins_and_the_job_takes_todays_path() -> None:
    """The verdict is committed between the move's read and its write: the move's
    transaction fails on the tally, and the job relocates once, by the verdict's path."""
    with _spare_world() as w:
        w.ecs.spare_nodes.append(SPARE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        w.ecs.spare_nodes.remove(SPARE)  # nothing free when the ranks end: it waits
        _rank_1_dies(w, arns)
        waiting = w.repo.jobs.get_job("j")
        assert waiting.state is JobState.PENDING_HEALTHCHECK and _suspect(w).pending
        w.ecs.spare_nodes.append(SPARE)
        _node_verdict(w, REPLACE)  # lands first (the verdict relocates the job onto the spare)
        node = w.repo.instances.get_instance(FAULTY).container_inst_id
        assert not w.repo.restarts.leave_suspects_before_verdict(waiting, [node], reason="late",
                                                                 deadline_at=0.0)
        assert w.service.restarts.spare_first(waiting).action != "restarting"
        job = w.repo.jobs.get_job("j")
        assert (job.attempt, job.recoveries_used) == (2, 1)
        assert _suspect(w).verdict is SuspectVerdict.REPLACE
        assert _running_training(w) == [PEER, SPARE]


def test_with_the_spare_taken_by_another_relocation_the_job_waits_for_its_verdict() -> None:
    """Two relocatable jobs lose a node at once and one node is free: the first takes it;
    the second finds none and waits for its verdict (today's path), then for a node."""
    with _spare_world(relocation_wait_seconds=1800) as w:
        w.ecs.spare_nodes.append(SPARE)
        first = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        second = w.register_job("k", ["node-d", "node-e"], tags=RELOCATABLE)
        _rank_1_dies(w, first)
        assert w.repo.jobs.get_job("j").attempt == 2  # on the spare
        w.service.on_task_state_change(w.task_stopped(second[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            second[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        k = w.repo.jobs.get_job("k")
        assert k.state is JobState.PENDING_HEALTHCHECK and k.attempt == 1 and k.recoveries_used == 0
        assert w.repo.faults.get_suspect("k", 1, "node-e").pending
        [task] = w.ecs.health_checks_on("node-e")
        w.service.on_health_check_stopped(w.health_check_stopped(task, REPLACE))
        k = w.repo.jobs.get_job("k")
        assert k.state is JobState.PENDING_RESTART and k.relocation_wait is not None  # waits, not failed
        assert k.recoveries_used == 1


def test_no_infrastructure_recovery_left_waits_for_the_verdict() -> None:
    with _spare_world(max_recovery_attempts=0) as w:
        w.ecs.spare_nodes.append(SPARE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        _rank_1_dies(w, arns)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK and _suspect(w).pending


def test_without_a_spare_pool_the_job_waits_for_the_verdict_as_before() -> None:
    with world() as w:
        w.ecs.spare_nodes.append(SPARE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        _rank_1_dies(w, arns)
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
        _node_verdict(w, REPLACE)
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and _suspect(w).verdict is SuspectVerdict.REPLACE


def test_a_move_that_died_after_leaving_the_node_is_finished_by_the_sweep() -> None:
    """The leave is committed, the relocation's claim refused: the job is PENDING_RESTART
    with a deadline, and the next sweep relocates it onto the spare (once)."""
    with _spare_world() as w:
        w.ecs.spare_nodes.append(SPARE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        w.repo.fail_once("restarts.claim", "refuse")  # type: ignore[attr-defined]
        with pytest.raises(TimeoutError):  # the event's delivery dies; the sweep goes on
            _rank_1_dies(w, arns)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_RESTART and job.recoveries_used == 1
        assert _suspect(w).verdict is SuspectVerdict.LEFT
        w.advance(61)
        w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and job.recoveries_used == 1
        assert _running_training(w) == [PEER, SPARE]
