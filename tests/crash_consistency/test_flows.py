"""Every flow never loses a fault: each broken at its AWS calls, once each, in both fault
models (a throttle that does not execute the call, a call whose response is lost), with
failed events redelivered as Lambda's asynchronous invocation does and the sweeps every
minute; the backstop invariant is checked after every event.

The flows (``local_mode.campaigns``): a GPU reset instead of a reboot, the fast path, a dead
GPU (quarantine, the job failed and e-mailed), an application error (restarted, and failed and
e-mailed), relocation (at once, spare first, after waiting for a free node), a job HELD by the
breaker until the operator's reset or until the breaker closes by itself, a gang above the
inline fan-out (3 ranks, its inline limit 2: through the gang queue; every node checked, the
two the stack stopped in one StartTask), an application error whose
third exit is coupled to the first two and checked once their checks find nothing (issue 50), two
independent faults a second apart (both caught before the job runs on either again), a node lost
from heartbeats (its agent silent, its ECS agent disconnected), a wedged node (its host still
reporting, its ECS agent disconnected: SUSPECT, then the stack's own check after its reconnect
passes it), a preemption (suspend, go_suspend(), resume) and a node lost in a preemption's grace
(the victim failed by the lost-node decision, its charge released, the preemptor admitted). The
GPU fault with reboot is ``test_fault_injection.py``'s.

Without ``GPU_RECOVERY_FAULTS=all`` (``make test-slow``) the first call of every call site
of each flow is broken; with it (``make test-campaigns``, which ``.ci/run`` runs) every call.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from gpu_recovery.domain import started_by
from local_mode.campaigns import recovery
from local_mode.campaigns.catalog import RUNS as ALL_RUNS
from local_mode.campaigns.runner import positions_of

from . import _baselines as baselines
from . import _forked as forked

EVERY_CALL = os.environ.get("GPU_RECOVERY_FAULTS") == "all"

#: each flow's run but the GPU fault with reboot (test_fault_injection.py's)
RUNS: dict[str, Any] = {flow: run for flow, run in ALL_RUNS.items() if flow != "gpu_fault"}


def baseline(flow: str) -> Any:
    return baselines.baseline(flow, RUNS[flow])


def positions(flow: str) -> list[int]:
    return positions_of(baseline(flow).calls, every_call=EVERY_CALL)


@pytest.mark.parametrize("flow", sorted(RUNS))
def test_the_unbroken_flow_is_exactly_right(flow: str) -> None:
    result = baseline(flow)
    assert result.problems() == []
    if flow in recovery.FLOWS:
        if flow == "fast_path":
            assert result.suspects[recovery.FAULTY] == "REBOOT"
            assert result.health_checks[recovery.FAULTY] == 0
            # The node agent's report reached the stack through the heartbeat service.
            assert any(c.operation == "UpdateItem" and "heartbeat" in c.site for c in result.calls)
        elif flow in recovery.RELOCATING:
            # Spare first: the job left node-b before its verdict (which went to the node only).
            assert result.suspects[recovery.FAULTY] == ("LEFT" if flow == "spare_first" else "REPLACE")
        elif flow == "large":
            sites = {c.site for c in result.calls}
            assert any(s.startswith("recovery/gang.py:_stop_batch") for s in sites)
            assert any(s.startswith("recovery/gang.py:_start_call") for s in sites)
            assert any(c.operation == "SendMessageBatch" for c in result.calls)
            # Every node checked; the two the stack stopped in one StartTask (issue 50).
            assert result.suspects == {n: "REBOOT" if n == recovery.FAULTY else "HEALTHY"
                                       for n in result.health_checks}
            peers = {sb for n, sb in result.facts["check_started_by"].items() if n != recovery.FAULTY}
            assert len(peers) == 1 and started_by.names_several_nodes(peers.pop())
        elif flow in ("app_error", "app_error_fails"):
            assert set(result.suspects.values()) == {"HEALTHY"}
        elif flow == "coupled_app_error":  # issue 50: the third exit coupled, checked last
            assert result.facts["coupled"] == [recovery.COUPLED_NODE]
            assert set(result.suspects.values()) == {"HEALTHY"}
        elif flow == "two_faults":  # issue 50: both faults checked and rebooted, nothing coupled
            assert result.suspects == {recovery.FAULTY: "REBOOT", recovery.SECOND_FAULTY: "REBOOT"}
            assert result.facts["coupled"] == [] and result.facts["placed_on_faulty"] == []
        elif flow == "gpu_reset":
            # The reset task's calls are the flow's (each is broken in turn), no reboot.
            assert any(c.operation == "StartTask" and "gpu_resets" in c.site for c in result.calls)
            assert result.reboots[recovery.FAULTY] == 0 and result.facts["gpu_resets"] == 1
    elif flow == "node_wedged":
        # Every AWS call of the lost node's check is the flow's, so each is broken in turn: the
        # mark, the sweep's look while its agent is away, the unmark, the check's StartTask.
        sites = {(c.operation, c.site) for c in result.calls}
        for call in [("PutAttributes", "recovery/lost_node_checks.py:mark_quietly"),
                     ("DescribeContainerInstances", "recovery/lost_node_checks.py:sweep"),
                     ("DeleteAttributes", "recovery/reboots.py:unmark_quietly"),  # no reboot here: the mark
                     ("StartTask", "recovery/validations.py:start_task")]:
            assert call in sites, call
        assert result.checks == [0]


# Each run is forked from the unbroken run at the call it breaks (tests/crash_consistency/_forked.py).
baselines.prefetch(RUNS)
CASES = [case for flow in sorted(RUNS)
         for case in forked.cases(flow, positions(flow), flow, calls=baseline(flow).calls)]


@pytest.mark.parametrize(("flow", "group", "index", "mode"), CASES)
def test_a_fault_at_any_call_of_any_flow_still_ends_right(flow: str, group: tuple[int, ...], index: int,
                                                          mode: str) -> None:
    result = forked.result(RUNS[flow], group, index, mode)
    assert result.fired is not None, "the fault never fired"
    fired = f"{result.fired.service}.{result.fired.operation} at {result.fired.site}"
    assert result.problems() == [], f"{flow}: {mode} at call {index} ({fired})"
