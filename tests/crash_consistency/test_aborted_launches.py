"""A queue launch that ECS fails to place, with its own abort's calls broken: no rank of the
aborted attempt is left running.

The campaigns break one call per run: a launch whose StartTask ECS answers with a failure
(time sharing's flow, its last launch: alice's job resumed once bob's completed, its rank 1
placed nowhere) is aborted and the job queued again, but the abort's own calls (the rank's
launch lease released, the requeue with its stop intent, the look for a rank started and not
registered, the rank's stop asked, its StopTask, the stop intent's end) ran only after another
call was broken, and were never broken themselves. Here
the first fault aborts the launch and each of those calls is then broken in every mode its
operation takes (``runner.then_breaking``; each run forked at that call from the run that
breaks only the first: ``runner.broken_after``): each run owes what every time-sharing run owes,
among it that every task of an earlier attempt was stopped by the stack
(``time_sharing.RunResult.left_running``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from typing import Any

import pytest

from gpu_recovery import clock
from gpu_recovery.constants import LAUNCH_LEASE_SECONDS
from gpu_recovery.domain.launch_plan import StartCall
from gpu_recovery.recovery.queue_launches import QueueLaunches
from gpu_recovery.recovery.ranks import group_started_by
from local_mode.campaigns import time_sharing
from local_mode.campaigns.recovery import run_recovery
from local_mode.campaigns.runner import broken_after, then_breaking
from local_mode.sim.broken_calls import ApiCall
from local_mode.sim.bus import EventBus
from local_mode.sim.ecs import SimulatedEcs

from . import _baselines as baselines

#: every start of a queue launch's rank: the start fan-out's (the one launcher)
START_SITE = "recovery/gang.py:_start_call"
#: the abort's calls: the launch's end (``recovery.queue_launches``) and its stop fan-out
ABORT_SITES = ("recovery/queue_launches.py", "recovery/gang.py:_start_batch", "recovery/ranks.py",
               "recovery/gang.py:_stop_batch", "recovery/gang.py:stop", "recovery/gang.py:_launch_settled",
               "recovery/gang.py:end_aborted_launch")
#: the first fault: the last launch's last StartTask (alice's resume, rank 1), answered with a failure
FIRST_MODE = "ecs_failures"


#: the end of an aborted launch's stop: its open leases read, a task of one looked up and stopped,
#: the lease given back, the intent ended
END_SITES = ("recovery/gang.py:_launch_settled", "recovery/gang.py:end_aborted_launch",
             "recovery/gang.py:_aborted_launch_stopped", "recovery/gang.py:stop_due")


@contextmanager
def _a_start_dies_unregistered_after_the_abort() -> Iterator[None]:
    """The first abort of a launch races a start of its rank 1 made by another invocation (a gang
    worker's batch, the sweep's resend): that start won rank 1's lease and read the job STARTING
    before the abort committed, makes its StartTask after it, and dies before registering the rank
    (its task runs, on no item; its events lost, so that no RUNNING event registers it either; it
    trains until stopped, as a real job's rank). Its own calls may be broken too: a lease not won
    starts nothing, a StartTask broken leaves the start dead all the same."""
    abort, put_events, made = QueueLaunches.abort, EventBus.put_events, SimulatedEcs.__init__
    raced: list[bool] = []
    lost: set[str] = set()
    sims: list[SimulatedEcs] = []

    def making(sim: SimulatedEcs, *args: Any, **kwargs: Any) -> None:
        made(sim, *args, **kwargs)
        sims.append(sim)

    def losing(bus: EventBus, event: dict[str, Any]) -> Any:
        if str((event.get("detail") or {}).get("taskArn")) in lost:
            return []
        return put_events(bus, event)

    def racing_abort(self: QueueLaunches, job: Any, kind: Any, reason: str) -> str:
        if raced:
            return abort(self, job, kind, reason)
        raced.append(True)
        gang = self.gang
        assert gang.launches is not None
        [rank1] = [t for t in gang.launches.read(job, 1, 2).planned if t.rank == 1]
        started_by = group_started_by(job.job_id, job.attempt, StartCall((1,), (rank1.node,)))
        now = clock.now()
        won = False
        with suppress(Exception):
            won = gang.fanouts.claim_rank_launch(rank1, job.attempt, now + LAUNCH_LEASE_SECONDS, now,
                                                 started_by)
        outcome = abort(self, job, kind, reason)
        if won:
            with suppress(Exception):  # the start dies here as well
                lost.update(gang.ecs.start_task(
                    task_definition=rank1.task_definition_arn,
                    container_instance_arn=rank1.container_instance_arn, overrides=rank1.overrides,
                    tags=rank1.tags, started_by=started_by, group=rank1.group or None).task_arns)
            sim = sims[-1]
            for task_arn in lost:  # re-planned once RUNNING: it trains on until stopped
                sim.schedule(sim.now() + 60, lambda arn=task_arn: sim.plan_task(arn, None), "trains on")
        return outcome

    QueueLaunches.abort = racing_abort  # type: ignore[method-assign]
    EventBus.put_events = losing  # type: ignore[method-assign]
    SimulatedEcs.__init__ = making  # type: ignore[method-assign]
    try:
        yield
    finally:
        QueueLaunches.abort = abort  # type: ignore[method-assign]
        EventBus.put_events = put_events  # type: ignore[method-assign]
        SimulatedEcs.__init__ = made  # type: ignore[method-assign]


@cache
def _raced_calls(fault: tuple[int, str]) -> list[ApiCall]:
    with _a_start_dies_unregistered_after_the_abort(), then_breaking(None):
        return time_sharing.run(fault).calls


def _raced_run(fault: tuple[int, str] | None) -> Any:
    with _a_start_dies_unregistered_after_the_abort():
        return time_sharing.run(fault)


@cache
def _calls(fault: tuple[int, str] | None) -> list[ApiCall]:
    if fault is None:
        return baselines.baseline("time_sharing", time_sharing.run).calls  # type: ignore[no-any-return]
    with then_breaking(None):
        return time_sharing.run(fault).calls


def _abort_window() -> tuple[tuple[int, str], list[ApiCall]]:
    """The first fault, and the abort's calls right after it in that run: its requeue, its
    rank's stop (asked, StopTask) and its stop intent's end."""
    starts = [c for c in _calls(None) if c.operation == "StartTask" and c.site.startswith(START_SITE)]
    first = (starts[-1].index, FIRST_MODE)  # alice's resume launch's rank 1: the last
    window = []
    for call in (c for c in _calls(first) if c.index > first[0]):
        if not call.site.startswith(ABORT_SITES):
            break
        window.append(call)
    return first, window


@pytest.mark.slow
def test_an_aborted_launch_with_its_own_calls_broken_leaves_no_rank_running() -> None:
    first, window = _abort_window()
    assert any(c.operation == "StopTask" for c in window), f"the abort stopped nothing: {window}"
    assert broken_after(time_sharing.run, first, window, warm_up=run_recovery) == []


@pytest.mark.slow
def test_a_rank_a_dead_start_left_unregistered_after_the_abort_is_stopped_even_with_the_ends_calls_broken(
        ) -> None:
    """The abort's stop waits for the lease of the dead start to run out, finds its task by the
    startedBy the lease recorded and stops it before ending; each call of that end broken in every
    mode leaves no rank of the aborted attempt running either."""
    first, _ = _abort_window()
    result = _raced_run(first)
    assert result.problems() == []
    ended = [c for c in _raced_calls(first) if c.index > first[0] and c.site.startswith(END_SITES)]
    assert any(c.operation == "ListTasks" for c in ended), f"no task looked up: {ended}"
    assert broken_after(_raced_run, first, ended, warm_up=run_recovery) == []
