"""Diagnosis by evidence, in order (issue 50, domain/suspects.py): an NCCL cascade's later
exits are coupled to the fault, their nodes checked only when the first checks find
nothing. Stage logic over fakes of the ports; the emulator's 24-rank gang is in
tests/remediation/test_one_fault_one_check.py."""

from __future__ import annotations

import contextlib
from typing import Any

from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import fault_suspects
from tests.recovery.fakes import World, world

NODES = ["node-0", "node-1", "node-2", "node-3", "node-4", "node-5"]
FAULTY = "node-4"


def _exits(w: World, arns: list[str], order: list[int], times: dict[int, int]) -> list[EcsTaskDetail]:
    """Each rank's STOPPED event (exit 1, on its own) stamped at its own stop time, returned
    in ``order`` (the order EventBridge happens to deliver them in). The events' stamps are
    whole seconds, as in the AWS-shaped fixture."""
    start = w.now[0]
    events: dict[int, EcsTaskDetail] = {}
    for rank in sorted(times, key=lambda r: times[r]):
        w.now[0] = start + times[rank]
        events[rank] = w.task_stopped(arns[rank], exit_code=1)
    w.now[0] = start + max(times.values()) + 1
    return [events[rank] for rank in order]


def _checked(w: World) -> set[str]:
    return {node for node in NODES if w.ecs.health_checks_on(node)}


def test_a_cascade_checks_the_first_two_exits_by_their_own_time_whatever_the_delivery_order() -> None:
    """Given a 6-rank job whose rank 4's GPU fails at t and whose five peers exit 1 three to
    five seconds later (NCCL), the peer of t+3 s delivered first and the faulty one second
    When every exit is handled
    Then the first two exits handled (the t+3 s peer and the faulty node) are checked,
    the others are coupled (no check, no fence), and once the faulty node's check finds the
    fault the job moves on without a check of the others."""
    with world() as w:
        arns = w.register_job("j", NODES)
        times = {4: 0, 0: 3, 1: 4, 2: 5, 3: 6, 5: 7}
        outcomes = [w.service.on_task_state_change(e) for e in _exits(w, arns, [0, 4, 1, 2, 3, 5], times)]
        assert [o.action for o in outcomes] == ["health_check_requested"] * 2 + ["coupled_exit"] * 4
        assert _checked(w) == {"node-0", FAULTY}
        for node in ("node-1", "node-2", "node-3", "node-5"):
            assert not w.repo.instances.get_instance(node).fenced
        job = w.repo.jobs.get_job("j")
        assert job.tally.total == 2 and job.tally.exits[1] - job.tally.exits[0] == 3
        [sick] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(sick, 1))  # reboot
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        [healthy] = w.ecs.health_checks_on("node-0")
        w.service.on_health_check_stopped(w.health_check_stopped(healthy, 0))
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        assert _checked(w) == {"node-0", FAULTY}  # the coupled nodes never checked


def test_a_redelivered_coupled_exit_repeats_its_arrival_and_names_no_suspect() -> None:
    with world() as w:
        arns = w.register_job("j", NODES)
        events = _exits(w, arns, [4, 0, 1, 2, 3, 5], {4: 0, 0: 3, 1: 4, 2: 5, 3: 6, 5: 7})
        for event in events:
            w.service.on_task_state_change(event)
        assert w.repo.jobs.get_rank("j", 1).coupled
        again = w.service.on_task_state_change(events[2])  # rank 1's, delivered again
        assert again.action == "coupled_exit"
        assert set(w.repo.faults.labels(w.repo.jobs.get_job("j"))) == {"node-0", FAULTY}


def test_when_the_first_checks_find_nothing_every_coupled_node_is_checked() -> None:
    """Given every rank exits 1 within seconds and every node is healthy (the application's
    own error)
    When the first two checks answer healthy
    Then the four coupled nodes are named suspects, fenced and checked too (the total raised
    to six), and only once they answer healthy is the job settled as an application error."""
    with world() as w:
        arns = w.register_job("j", NODES)
        times = {r: r for r in range(len(NODES))}
        for event in _exits(w, arns, list(range(len(NODES))), times):
            w.service.on_task_state_change(event)
        assert _checked(w) == {"node-0", "node-1"}
        for node in ("node-0", "node-1"):
            [task] = w.ecs.health_checks_on(node)
            w.service.on_health_check_stopped(w.health_check_stopped(task, 0))
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK
        assert job.tally.escalated and job.tally.total == 6
        assert _checked(w) == set(NODES)
        for node in ("node-2", "node-3", "node-4", "node-5"):
            assert w.repo.instances.get_instance(node).state in (InstanceState.HEALTH_CHECKING,
                                                                 InstanceState.HEALTH_CHECK_PENDING)
        for node in ("node-2", "node-3", "node-4", "node-5"):
            [task] = w.ecs.health_checks_on(node)
            assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
            w.service.on_health_check_stopped(w.health_check_stopped(task, 0))
        job = w.repo.jobs.get_job("j")
        # This job has no application-error restart left: it fails as one, every node checked.
        assert job.state is JobState.FAILED and job.last_error.startswith("application error")


def test_a_coupled_node_the_escalation_finds_faulty_is_caught() -> None:
    """Given the faulty node's rank hung in NCCL and exited after two healthy peers (its own
    exit third, no evidence of its own), When the first two checks find nothing, Then its node
    is checked with the others and its fault found: the job does not restart on it."""
    with world() as w:
        arns = w.register_job("j", NODES)
        times = {0: 0, 1: 1, FAULT_RANK: 2, 2: 3, 3: 4, 5: 5}
        for event in _exits(w, arns, [0, 1, FAULT_RANK, 2, 3, 5], times):
            w.service.on_task_state_change(event)
        for node in ("node-0", "node-1"):
            [task] = w.ecs.health_checks_on(node)
            w.service.on_health_check_stopped(w.health_check_stopped(task, 0))
        [sick] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(sick, 1))
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART


FAULT_RANK = NODES.index(FAULTY)


def test_every_exit_is_checked_with_health_check_all_nodes() -> None:
    with world(check_all_nodes_on_fault=True) as w:
        arns = w.register_job("j", NODES)
        for event in _exits(w, arns, [4, 0, 1, 2, 3, 5], {4: 0, 0: 3, 1: 4, 2: 5, 3: 6, 5: 7}):
            w.service.on_task_state_change(event)
        assert _checked(w) == set(NODES)


def test_an_exit_judged_a_suspect_by_a_delivery_that_died_stays_one() -> None:
    """Given rank 1's exit (t+4 s) judged a suspect (its node's item opened, the second exit
    handled) by a delivery whose write of its stop was throttled, and rank 0's exit (t+3 s)
    handled before its retry
    When rank 1's stop is delivered again (by then a third exit, after the earliest)
    Then it is still a suspect, counted as one: the node its item names is checked and the
    fault's total counts it (a coupled judgement now would leave an item no count holds)."""
    with world() as w:
        arns = w.register_job("j", NODES)
        events = _exits(w, arns, [4, 1, 0, 2, 3, 5], {4: 0, 0: 3, 1: 4, 2: 5, 3: 6, 5: 7})
        w.service.on_task_state_change(events[0])
        w.repo.fail_once("rank_events.record_stop", "refuse")
        with contextlib.suppress(TimeoutError):  # the delivery dies: Lambda retries it later
            w.service.on_task_state_change(events[1])
        # Rank 0 (t+3 s): two suspects known, after the earliest: coupled.
        assert w.service.on_task_state_change(events[2]).action == "coupled_exit"
        assert w.service.on_task_state_change(events[1]).action == "health_check_requested"
        for event in events[3:]:
            assert w.service.on_task_state_change(event).action == "coupled_exit"
        job = w.repo.jobs.get_job("j")
        assert job.tally.total == 2
        assert set(w.repo.faults.labels(job)) == {FAULTY, "node-1"}


def test_coupled_nodes_beyond_the_inline_ones_are_checked_by_the_sweeps_pages(monkeypatch: Any) -> None:
    """Given an application error of six ranks (two checked at once, four coupled) and room
    for one inline check when the first checks find nothing
    When the escalation names the four coupled nodes
    Then one is checked at once and the three others' items are due, so the next sweep asks
    for their checks (in parallel, not one call's worth a minute)."""
    monkeypatch.setattr(fault_suspects, "COUPLED_CHECKS_INLINE", 1)
    with world() as w:
        arns = w.register_job("j", NODES)
        for event in _exits(w, arns, list(range(len(NODES))), {r: r for r in range(len(NODES))}):
            w.service.on_task_state_change(event)
        for node in ("node-0", "node-1"):
            [task] = w.ecs.health_checks_on(node)
            w.service.on_health_check_stopped(w.health_check_stopped(task, 0))
        assert w.repo.jobs.get_job("j").tally.total == 6
        assert _checked(w) == {"node-0", "node-1", "node-2"}
        w.advance(1)
        w.service.sweep()
        assert _checked(w) == set(NODES)


def test_with_health_check_all_nodes_a_stop_handled_after_the_first_reboot_verdict_is_checked_too() -> None:
    """Given health_check_all_nodes, rank 4's GPU failing and its check answering "reboot"
    (the job waits for the reboot: PENDING_RESTART) before the other ranks' stops are handled
    (at 8,192 tasks the stops take longer than the diag)
    When the later stops are handled
    Then their nodes are checked too, counted among the fault's suspects, and the job's
    restart waits for their verdicts."""
    with world(check_all_nodes_on_fault=True) as w:
        arns = w.register_job("j", NODES)
        events = _exits(w, arns, [4, 0, 1, 2, 3, 5], {4: 0, 0: 3, 1: 4, 2: 5, 3: 6, 5: 7})
        w.service.on_task_state_change(events[0])
        [sick] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(sick, 1))  # reboot
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        for event in events[1:]:
            w.service.on_task_state_change(event)
        assert _checked(w) == set(NODES)
        job = w.repo.jobs.get_job("j")
        assert job.tally.total == len(NODES) and not job.tally.all_decided
