"""A queue launch that ECS fails to place, with its own abort's calls broken: no rank of the
aborted attempt is left running.

The campaigns break one call per run: a launch whose StartTask ECS answers with a failure
(time sharing's flow, bob's job: its rank 1 placed nowhere) is aborted and the job queued
again, but the abort's own calls (the rank's launch lease released, the requeue with its stop
intent, the look for a rank started and not registered, the rank's stop asked, its StopTask, the
stop intent's end) ran only after another call was broken, and were never broken themselves. Here
the first fault aborts the launch and each of those calls is then broken in every mode its
operation takes (``runner.then_breaking``): each run owes what every time-sharing run owes,
among it that every task of an earlier attempt was stopped by the stack
(``time_sharing.RunResult.left_running``).
"""

from __future__ import annotations

from functools import cache

import pytest

from local_mode.campaigns import time_sharing
from local_mode.campaigns.runner import broken_after, then_breaking
from local_mode.sim.broken_calls import ApiCall

from . import _baselines as baselines

#: every start of a queue launch's rank: the start fan-out's (the one launcher)
START_SITE = "recovery/gang.py:_start_call"
#: the abort's calls: the launch's end (``recovery.queue_launches``) and its stop fan-out
ABORT_SITES = ("recovery/queue_launches.py", "recovery/gang.py:release_launch", "recovery/ranks.py",
               "recovery/gang.py:_stop_batch", "recovery/gang.py:stop")
#: the first fault: the queue launch's second StartTask (bob's rank 1), answered with a failure
FIRST_MODE = "ecs_failures"


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
    first = (starts[-1].index, FIRST_MODE)  # bob's rank 1: the last the flow's launches start
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
    assert broken_after(time_sharing.run, first, window) == []
