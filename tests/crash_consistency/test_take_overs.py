"""The calls a take-over makes, broken in turn: a recovery's own recovery still ends right.

The campaigns break one call per run, so the calls that only a recovery makes (a dead
claim's take-over, its lookup by startedBy, the record of the task it finds or the start
of the one it does not) ran only after another call was broken, and were never broken
themselves. Here the first fault makes the recovery take over (a health check's StartTask
whose answer is lost: the sweep takes its claim over once the lease ends; a gang restart's
StartTask throttled: the batch is delivered again and the ranks' launch leases taken over),
and every call around the take-over's ListTasks is then broken in every mode its operation
takes (``runner.then_breaking``; each run forked at that call from the run that breaks only
the first: ``runner.broken_after``). Each run owes what every campaign run owes, and no task
started twice (``invariants.started_twice``).
"""

from __future__ import annotations

from functools import cache

import pytest

from local_mode.campaigns.catalog import RUNS
from local_mode.campaigns.recovery import run_recovery
from local_mode.campaigns.runner import broken_after, then_breaking
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE, ApiCall

from . import _baselines as baselines

#: (flow, the module whose first StartTask is broken, how): each makes the recovery take over
CASES = [
    ("dead_gpu", "recovery/health_checks.py", LOST_RESPONSE),
    ("app_error", "recovery/gang.py", THROTTLE),
]
#: the calls broken: this many before the take-over's ListTasks and after it (its claims or
#: lease, the lookup, then the record, or the StartTask and the registration)
BEFORE, AFTER = 2, 4


def _module(call: ApiCall) -> str:
    return call.site.partition(":")[0]


@cache
def _calls(flow: str, fault: tuple[int, str] | None) -> list[ApiCall]:
    """The run's calls with their sites (unbroken: None)."""
    if fault is None:
        return baselines.baseline(flow, RUNS[flow]).calls  # type: ignore[no-any-return]
    with then_breaking(None):
        return RUNS[flow](fault).calls


def _take_over_window(flow: str, module: str, mode: str) -> tuple[tuple[int, str], list[ApiCall]]:
    """The first fault (the module's first StartTask, in ``mode``) and the calls around the
    take-over's lookup that its recovery makes."""
    start = next(c for c in _calls(flow, None) if c.operation == "StartTask" and _module(c) == module)
    first = (start.index, mode)
    calls = _calls(flow, first)
    lookups = [c for c in calls[start.index:] if c.operation == "ListTasks" and _module(c) == module]
    assert lookups, f"{flow}: no take-over looked its task up after {first}"
    lookup = lookups[0]
    return first, calls[lookup.index - 1 - BEFORE:lookup.index + AFTER]


@pytest.mark.slow
@pytest.mark.parametrize(("flow", "module", "mode"), CASES)
def test_a_take_over_with_its_own_calls_broken_still_ends_right(flow: str, module: str, mode: str) -> None:
    first, window = _take_over_window(flow, module, mode)
    assert any(c.operation == "UpdateItem" for c in window), "the take-over's write is not in the window"
    assert broken_after(RUNS[flow], first, window, warm_up=run_recovery) == []
