"""Checks started 10 nodes a StartTask (issue 50): with ``health_check_all_nodes``, a node
checked only because every node is (its rank stopped by the stack, no evidence of its own)
waits, its GPUs free, for others of its job; the event that finds 10 waiting starts them in one
call, the attempt's end the rest. The fault's own node is checked at once. Stage logic over
fakes of the ports (tests/recovery/fakes.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from botocore.exceptions import ClientError

from gpu_recovery.constants import CLAIM_LEASE_SECONDS, InstanceState, JobState
from gpu_recovery.domain import started_by
from tests.recovery.fakes import LostResponse, World, world

NODES = [f"node-{i:02d}" for i in range(12)]
FAULTY = "node-04"


@contextlib.contextmanager
def _fault(**settings: object) -> Iterator[tuple[World, list[str]]]:
    """A 12-rank job (one rank a node), every node checked; rank 4's GPU fails (it exits 1 on
    its own), so the stack stops the 11 others (inline: the gang is small)."""
    with world(check_all_nodes_on_fault=True, **settings) as w:
        arns = w.register_job("j", NODES)
        w.service.on_task_state_change(w.task_stopped(arns[NODES.index(FAULTY)], exit_code=1))
        assert sorted(w.ecs.stop_calls) == sorted(a for i, a in enumerate(arns) if NODES[i] != FAULTY)
        yield w, arns


def _stopped_by_us(w: World, arns: list[str]) -> None:
    """The STOPPED event of each rank the stack stopped, in rank order; a delivery that died
    delivered again (Lambda's retry)."""
    for arn in arns:
        if arn not in w.ecs.stop_calls:
            continue
        event = w.task_stopped(arn, exit_code=143, stop_code="UserInitiated",
                               reason="gpu-recovery: suspected GPU fault")
        try:
            w.service.on_task_state_change(event)
        except (LostResponse, ClientError):
            w.service.on_task_state_change(event)


def _checks(w: World) -> dict[str, list[str]]:
    return {n: [t.started_by for t in w.ecs.health_checks_on(n)] for n in NODES}


def test_the_faulty_node_is_checked_at_once_and_the_others_ten_to_a_start_task() -> None:
    """Given a 12-rank job whose rank 4 exits 1 on its own, every node checked
    When the 11 ranks the stack stopped report STOPPED
    Then node-04 was checked in a call of its own, before any other; the first 10 stopped
    nodes in one StartTask, sharing a startedBy that says it names several nodes; the last
    one once every rank had ended; each node checked once."""
    with _fault() as (w, arns):
        assert w.ecs.start_calls == [1] and len(w.ecs.health_checks_on(FAULTY)) == 1
        _stopped_by_us(w, arns)
        assert w.ecs.start_calls == [1, 10, 1]
        checks = _checks(w)
        assert all(len(c) == 1 for c in checks.values()), checks
        grouped = {c[0] for n, c in checks.items() if n not in (FAULTY, NODES[-1])}
        assert len(grouped) == 1 and started_by.names_several_nodes(grouped.pop())
        assert not started_by.names_several_nodes(checks[FAULTY][0])
        assert not started_by.names_several_nodes(checks[NODES[-1]][0])
        for node in NODES:  # every check recorded on its own node's item
            instance = w.repo.instances.get_instance(node)
            assert instance.state is InstanceState.HEALTH_CHECKING and instance.check.task_arn


def test_each_grouped_verdict_lands_on_its_own_node_and_the_job_restarts() -> None:
    """Given the checks started (the faulty node's finds the fault: reboot)
    When each check's STOPPED event arrives
    Then each verdict is its node's: the 11 healthy nodes AVAILABLE, node-04 rebooting, and
    the job waits for the reboot only."""
    with _fault() as (w, arns):
        _stopped_by_us(w, arns)
        for node in NODES:
            [task] = w.ecs.health_checks_on(node)
            w.service.on_health_check_stopped(w.health_check_stopped(task, 1 if node == FAULTY else 0))
        states = {n: w.repo.instances.get_instance(n).state for n in NODES}
        assert states.pop(FAULTY) is InstanceState.REBOOTING
        assert set(states.values()) == {InstanceState.AVAILABLE}
        job = w.repo.faults.counted(w.repo.jobs.get_job("j"))  # the healthy verdicts on the tally's shards
        assert job.state is JobState.PENDING_RESTART and job.tally.all_decided


def test_a_group_whose_answer_was_lost_is_found_node_by_node_and_never_started_twice() -> None:
    """Given the group's StartTask answer lost (its 10 tasks started, none recorded)
    When the claims' leases end and the sweep takes each over
    Then each node's task is found by the call's startedBy and its container instance (one
    DescribeTasks of the call's tasks), recorded, and no node runs a second check."""
    with _fault() as (w, arns):
        w.ecs.failures["start_task"] = ["lose"]  # the next call: the group's
        _stopped_by_us(w, arns)
        lost = [n for n in NODES
                if w.ecs.health_checks_on(n) and not w.repo.instances.get_instance(n).check.task_arn]
        assert len(lost) == 10
        w.advance(CLAIM_LEASE_SECONDS + 1)
        w.service.sweep()
        assert all(len(c) == 1 for c in _checks(w).values()), _checks(w)
        for node in lost:
            [task] = w.ecs.health_checks_on(node)
            assert w.repo.instances.get_instance(node).check.task_arn == task.arn


def test_a_refused_group_is_given_back_and_started_by_the_sweep() -> None:
    """Given the group's StartTask refused (throttled past botocore's retries: nothing started,
    the delivery failed and is retried)
    When the last ranks' stops end the attempt, and the sweep comes a minute later
    Then the ten claims were given back (nothing runs under them): the retried node and the
    last one start at the attempt's end, the nine others by the sweep, each node once."""
    with _fault() as (w, arns):
        w.ecs.failures["start_task"] = ["refuse"]
        _stopped_by_us(w, arns)
        refused = [n for n in NODES if not w.ecs.health_checks_on(n)]
        assert len(refused) == 9 and w.ecs.start_calls == [1, 10, 2]
        states = {w.repo.instances.get_instance(n).state for n in refused}
        assert states == {InstanceState.HEALTH_CHECK_PENDING}
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        assert all(len(c) == 1 for c in _checks(w).values()), _checks(w)


def test_a_node_not_placed_in_a_group_is_retried_alone_the_others_run() -> None:
    """Given one node of the group taken by another scheduler's task meanwhile (ECS places
    nothing there)
    When the group starts
    Then the nine others run; that node's claim is given back, counted as a placement attempt,
    and tried again by the sweep."""
    with _fault() as (w, arns):
        real = w.ecs.start_task

        def nothing_on_node_00(**kwargs: object) -> object:
            result = real(**kwargs)  # type: ignore[arg-type]
            victim = next((arn for arn, task in w.ecs.tasks.items() if task.node == "node-00"
                           and task.started_by == kwargs.get("started_by")), None)
            if victim is not None and len(result.task_arns) > 1:
                del w.ecs.tasks[victim]
                placed = {ci: t for ci, t in result.placed.items() if t != victim}
                return type(result)([t for t in result.task_arns if t != victim],
                                    [{"arn": next(ci for ci, t in result.placed.items() if t == victim),
                                      "reason": "RESOURCE:GPU"}], placed)
            return result

        w.ecs.start_task = nothing_on_node_00  # type: ignore[method-assign]
        _stopped_by_us(w, arns)
        node = w.repo.instances.get_instance("node-00")
        assert node.state is InstanceState.HEALTH_CHECK_PENDING and node.check.attempts == 1
        assert sum(1 for c in _checks(w).values() if c) == 11
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        assert all(len(c) == 1 for c in _checks(w).values()), _checks(w)


def test_a_slot_given_back_does_not_start_a_group_before_it_is_full() -> None:
    """Given five of the stopped nodes waiting for their group
    When node-04's verdict gives its slot back (which kicks the job's waiting checks)
    Then the five keep waiting (a slot given back is no reason for a smaller call); the group
    of ten starts once ten wait, the last node at the attempt's end."""
    with _fault() as (w, arns):
        stopped = [a for a in arns if a in w.ecs.stop_calls]
        _stopped_by_us(w, stopped[:5])
        [sick] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(sick, 1))
        assert w.ecs.start_calls == [1]
        assert len(w.repo.slots.waiting("j", 20)) == 5
        _stopped_by_us(w, stopped[5:])
        assert w.ecs.start_calls == [1, 10, 1]
        assert all(len(c) == 1 for c in _checks(w).values()), _checks(w)


def test_one_sweep_starts_every_group_left_waiting_not_ten_nodes() -> None:
    """Given a 32-rank job, every node checked, whose checks' StartTasks were all refused while
    its ranks stopped and at its attempt's end (throttled past botocore's retries): 31 nodes
    wait for their checks
    When the ECS budget is back and the sweep comes
    Then one sweep starts them all, ten nodes a call (it started each node alone as it reached
    it: 31 StartTasks; its job's kick started ten nodes a minute at most)."""
    nodes = [f"node-{i:02d}" for i in range(32)]
    with world(check_all_nodes_on_fault=True) as w:
        arns = w.register_job("j", nodes)
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
        w.ecs.failures["start_task"] = ["refuse"] * 1000
        _stopped_by_us(w, arns)
        w.ecs.failures["start_task"] = []
        waiting = [n for n in nodes[1:] if not w.ecs.health_checks_on(n)]
        assert len(waiting) == 31
        calls = len(w.ecs.start_calls)
        w.advance(61)
        w.service.sweep()
        assert all(len(w.ecs.health_checks_on(n)) == 1 for n in waiting), \
            [n for n in waiting if not w.ecs.health_checks_on(n)]
        assert w.ecs.start_calls[calls:] == [10, 10, 10, 1]
