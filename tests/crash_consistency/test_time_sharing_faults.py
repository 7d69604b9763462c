"""Time sharing never loses or doubles work: a preemption (scheduler tick, suspend request,
the victim's rank 0 told through the control channel, go_suspend(), the ranks stopped,
SUSPENDED, the preemptor launched with its quota charge, the victim resumed) broken at an
AWS call, once, in both fault models (a throttle that does not execute the call, a call
whose response is lost), with failed events redelivered as Lambda's asynchronous
invocation does, the scheduler and the sweep every minute, and the rank-0 program retrying
at its next poll.

Every run must end with both jobs complete, the victim suspended and resumed exactly once,
the preemptor started once, every rank started once per attempt, no recovery spent, both
users' quota usage back to zero, nothing stuck, nothing in a DLQ. ``make test`` breaks the
first call of every call site of the flow; ``make test-faults`` breaks every call.
"""

from __future__ import annotations

import os
from functools import cache

import pytest

from local_mode import time_sharing_campaign as campaign

from . import _forked as forked

EVERY_CALL = os.environ.get("GPU_RECOVERY_FAULTS") == "all"


@cache
def baseline() -> campaign.RunResult:
    return campaign.run()


def positions() -> list[int]:
    result = baseline()
    return [c.index for c in result.calls] if EVERY_CALL else campaign.sample_positions(result)


def test_the_unbroken_preemption_is_exactly_right() -> None:
    result = baseline()
    assert campaign.check(result) == []
    low = result.jobs["low"]
    assert low["suspend"]["kind"] == "preempted" and low["suspend"]["stop_reason"].endswith("go_suspend()")
    # The flow's own call sites are all in the run being broken.
    sites = {c.site for c in result.calls}
    for site in ("recovery/suspension.py:request", "recovery/suspension.py:finish", "queue/control.py:_job",
                 "queue/time_sharing.py:_release", "queue/launcher.py:launch"):
        assert site in sites, site


# Each run is forked from the unbroken run at the call it breaks (tests/crash_consistency/_forked.py).
@pytest.mark.parametrize(("group", "index", "mode"), forked.cases("time_sharing", positions()))
def test_a_fault_at_any_call_still_preempts_and_resumes_exactly_once(group: tuple[int, ...], index: int,
                                                                     mode: str) -> None:
    result = forked.result(campaign.run, group, index, mode)
    assert result.fired is not None, "the fault never fired"
    fired = f"{result.fired.service}.{result.fired.operation}"
    site = next((c.site for c in baseline().calls if c.index == index), "?")
    assert campaign.check(result) == [], f"{mode} at call {index} ({fired} at {site})"
