"""The remediation flows never lose a fault either: the fast path (XID 79 reported by the
node agent, reboot without the DCGM diag), relocation (a dead GPU: the node quarantined,
the rank moved to a spare node) and spare first (the same with a spare pool: the rank
moved before the node's verdict, the node still checked and quarantined), each broken at
an AWS call, once, in both fault models (a throttle that does not execute the call, a call
whose response is lost), with failed events redelivered as Lambda's asynchronous
invocation does and the sweep every minute.

Every run must end with the job completed on attempt 2 after one recovery, the faulty node
rebooted exactly once (fast path, without any health check) or quarantined and never
rebooted (relocation and spare first, rank 1 on the spare), one health check per other suspect, nothing
stuck, nothing in a DLQ. ``make test`` breaks the first call of every call site of each
flow (the node agent's report through the heartbeat service included); ``make
test-faults`` breaks every call.
"""

from __future__ import annotations

import os
from functools import cache, partial

import pytest

from local_mode import crash_campaign as campaign

from . import _forked as forked

EVERY_CALL = os.environ.get("GPU_RECOVERY_FAULTS") == "all"
FLOWS = ("fast_path", "relocation", "spare_first")


@cache
def baseline(flow: str) -> campaign.RunResult:
    return campaign.run_recovery(scenario=flow)


def positions(flow: str) -> list[int]:
    result = baseline(flow)
    if EVERY_CALL:
        return [call.index for call in result.calls]
    return campaign.sample_positions(result)


@pytest.mark.parametrize("flow", FLOWS)
def test_the_unbroken_flow_is_exactly_right(flow: str) -> None:
    result = baseline(flow)
    assert campaign.check(result) == []
    if flow == "fast_path":
        assert result.suspects[campaign.FAULTY] == "REBOOT"
        assert result.health_checks[campaign.FAULTY] == 0
        # The node agent's report reached the stack through the heartbeat service.
        assert any(c.operation == "UpdateItem" and "heartbeat" in c.site for c in result.calls)
    else:
        # Spare first: the job left node-b before its verdict (which went to the node only).
        assert result.suspects[campaign.FAULTY] == ("LEFT" if flow == "spare_first" else "REPLACE")
        assert result.final_nodes == [campaign.HEALTHY, campaign.SPARE]


#: each flow's runs (picklable: they run in the fork server's processes)
RUN = {flow: partial(campaign.run_recovery, scenario=flow) for flow in FLOWS}


# Each run is forked from the unbroken run at the call it breaks (tests/crash_consistency/_forked.py).
@pytest.mark.parametrize(("flow", "group", "index", "mode"),
                         [case for flow in FLOWS for case in forked.cases(flow, positions(flow), flow)])
def test_a_fault_at_any_call_still_remediates_exactly_once(flow: str, group: tuple[int, ...], index: int,
                                                           mode: str) -> None:
    result = forked.result(RUN[flow], group, index, mode)
    assert result.fired is not None, "the fault never fired"
    fired = f"{result.fired.service}.{result.fired.operation} at {result.fired.site}"
    assert campaign.check(result) == [], f"{flow}: {mode} at call {index} ({fired})"
