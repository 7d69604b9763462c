"""The fan-out of a large gang is crash-consistent: a 64-rank recovery (stopped and
restarted in batches by the gang worker, through its queue) broken at an AWS call of the
fan-out, once, as a throttle (not executed) or a lost response (executed, the caller never
hears back), still ends with the job recovered and completed exactly once.

``make test`` breaks two of the fan-out's calls (a stop batch's StopTask as a lost
response, a start batch's StartTask as a throttle); ``make test-faults``
(``GPU_RECOVERY_FAULTS=all``) breaks the first call of every call site of the whole flow.
"""

from __future__ import annotations

import os
from functools import cache, partial
from typing import Any

import pytest

from local_mode import crash_campaign as campaign
from local_mode.faults import FAULT_MODES, LOST_RESPONSE, THROTTLE

from . import _forked as forked

EVERY_SITE = os.environ.get("GPU_RECOVERY_FAULTS") == "all"


@cache
def baseline() -> campaign.RunResult:
    return campaign.run_recovery(scenario="large")


RUN = partial(campaign.run_recovery, scenario="large")  # picklable: it runs in the fork server's processes
DEFAULT = (("recovery/gang.py:_stop_batch", "StopTask", LOST_RESPONSE),
           ("recovery/gang.py:_start_call", "StartTask", THROTTLE))
#: make test's runs all go to one worker: the baseline and one driver forking both runs (two
#: workers would each make the 64-rank baseline, as the cases need it to find their calls)
GROUP = pytest.mark.xdist_group("large-fan-out")


def _first(site: str, operation: str) -> int:
    return next(c.index for c in baseline().calls if site in c.site and c.operation == operation)


def _faults(site: str, operation: str) -> tuple[tuple[int, str], ...]:
    """The runs made together with this case's: make test's two, or the case's group."""
    if site != "*":
        return tuple((_first(s, op), mode) for s, op, mode in DEFAULT)
    group = next(g for g in forked.groups(campaign.sample_positions(baseline())) if int(operation) in g)
    return tuple((n, mode) for n in group for mode in FAULT_MODES)


def _cases() -> list[Any]:
    if EVERY_SITE:
        return [pytest.param("*", str(i), mode,
                             marks=pytest.mark.xdist_group(forked.group_name("large", group)))
                for group in forked.groups(campaign.sample_positions(baseline()))
                for i in group for mode in FAULT_MODES]
    return [pytest.param(*case, marks=GROUP) for case in DEFAULT]


@GROUP
def test_the_unbroken_large_recovery_goes_through_the_fan_out() -> None:
    result = baseline()
    assert campaign.check(result) == []
    assert result.suspects == {campaign.FAULTY: "REBOOT"}
    sites = {c.site for c in result.calls}
    assert any(s.startswith("recovery/gang.py:_stop_batch") for s in sites)
    assert any(s.startswith("recovery/gang.py:_start_call") for s in sites)
    assert any(c.operation == "SendMessageBatch" for c in result.calls)


# Each run is forked from the unbroken run at the call it breaks (tests/crash_consistency/_forked.py).
@pytest.mark.parametrize(("site", "operation", "mode"), _cases())
def test_a_fault_in_the_fan_out_still_recovers_the_large_job_exactly_once(site: str, operation: str,
                                                                           mode: str) -> None:
    index = int(operation) if site == "*" else _first(site, operation)
    result = forked.outcome(forked.broken(RUN, _faults(site, operation)), index, mode)
    assert result.fired is not None, "the fault never fired"
    fired = f"{result.fired.service}.{result.fired.operation} at {result.fired.site}"
    assert campaign.check(result) == [], f"{mode} at call {index} ({fired})"
