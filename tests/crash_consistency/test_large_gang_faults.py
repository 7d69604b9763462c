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
from functools import cache

import pytest

from local_mode import crash_campaign as campaign
from local_mode.faults import FAULT_MODES, LOST_RESPONSE, THROTTLE

EVERY_SITE = os.environ.get("GPU_RECOVERY_FAULTS") == "all"


@cache
def baseline() -> campaign.RunResult:
    return campaign.run_recovery(scenario="large")


def _first(site: str, operation: str) -> int:
    return next(c.index for c in baseline().calls if site in c.site and c.operation == operation)


def _cases() -> list[tuple[str, str, str]]:
    if EVERY_SITE:
        return [("*", str(i), mode) for i in campaign.sample_positions(baseline()) for mode in FAULT_MODES]
    return [("recovery/gang.py:_stop_batch", "StopTask", LOST_RESPONSE),
            ("recovery/gang.py:_start_call", "StartTask", THROTTLE)]


def test_the_unbroken_large_recovery_goes_through_the_fan_out() -> None:
    result = baseline()
    assert campaign.check(result) == []
    assert result.suspects == {campaign.FAULTY: "REBOOT"}
    sites = {c.site for c in result.calls}
    assert any(s.startswith("recovery/gang.py:_stop_batch") for s in sites)
    assert any(s.startswith("recovery/gang.py:_start_call") for s in sites)
    assert any(c.operation == "SendMessageBatch" for c in result.calls)


@pytest.mark.parametrize(("site", "operation", "mode"), _cases())
def test_a_fault_in_the_fan_out_still_recovers_the_large_job_exactly_once(site: str, operation: str,
                                                                           mode: str) -> None:
    index = int(operation) if site == "*" else _first(site, operation)
    result = campaign.run_recovery((index, mode), scenario="large")
    assert result.fired is not None, "the fault never fired"
    fired = f"{result.fired.service}.{result.fired.operation} at {result.fired.site}"
    assert campaign.check(result) == [], f"{mode} at call {index} ({fired})"
