"""A queue launch that ECS fails to place, with its own abort's calls broken: no rank of the
aborted attempt is left running.

The campaigns break one call per run: a launch whose StartTask ECS answers with a failure
(time sharing's flow, bob's job: its rank 1 placed nowhere) is aborted and the job queued
again, but the abort's own calls (the requeue, the rank's stop asked, its StopTask, the
ledger's end) ran only after another call was broken, and were never broken themselves. Here
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

LAUNCHER = "queue/launcher.py"
#: the first fault: the queue launch's second StartTask (bob's rank 1), answered with a failure
FIRST_MODE = "ecs_failures"


@cache
def _calls(fault: tuple[int, str] | None) -> list[ApiCall]:
    if fault is None:
        return baselines.baseline("time_sharing", time_sharing.run).calls  # type: ignore[no-any-return]
    with then_breaking(None):
        return time_sharing.run(fault).calls


def _abort_window() -> tuple[tuple[int, str], list[ApiCall]]:
    """The first fault, and the launcher's calls right after it in that run: the abort's
    requeue, its rank's stop (asked, the ECS budget's token, StopTask) and the ledger's end."""
    starts = [c for c in _calls(None) if c.operation == "StartTask" and c.site.startswith(LAUNCHER)]
    first = (starts[-1].index, FIRST_MODE)  # bob's rank 1: the last the flow's launches start
    window = []
    for call in (c for c in _calls(first) if c.index > first[0]):
        if not call.site.startswith(LAUNCHER):
            break
        window.append(call)
    return first, window


@pytest.mark.slow
def test_an_aborted_launch_with_its_own_calls_broken_leaves_no_rank_running() -> None:
    first, window = _abort_window()
    assert any(c.operation == "StopTask" for c in window), f"the abort stopped nothing: {window}"
    assert broken_after(time_sharing.run, first, window) == []
