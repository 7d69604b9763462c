"""Issue 49: a lost verdict never becomes a quarantine or a failed job.

The ``lost_verdict`` flow (``local_mode.campaigns.recovery``): rank 1 exits 1, its node's DCGM
diag passes, and every delivery of the check's STOPPED event fails (dead-lettered). The sweep
reads the verdict from the stopped task and its log line (the sweep's role may read it):
the job restarts for its application's error and completes, no healthy node is quarantined
or rebooted, the job is not failed for a health check timeout. Its crash campaign (each call
broken in turn) is ``test_flows.py``'s; here it runs with 1 % of every AWS call failing at
random, for a few seeds.
"""

from __future__ import annotations

import pytest

from local_mode.campaigns import recovery

pytestmark = pytest.mark.slow


def _healthy_nodes_untouched(result: recovery.RunResult) -> None:
    assert result.problems() == [], result.problems()
    assert set(result.instance_states.values()) == {"AVAILABLE"}
    assert sum(result.reboots.values()) == 0
    assert ("health_check_timeout", recovery.JOB_ID) not in result.mails


def test_the_checks_event_lost_the_sweep_reads_its_verdict() -> None:
    result = recovery.run("lost_verdict")
    _healthy_nodes_untouched(result)
    assert result.suspects == {recovery.FAULTY: "HEALTHY"}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_with_one_percent_of_calls_failing_no_healthy_node_is_condemned(seed: int) -> None:
    _healthy_nodes_untouched(recovery.run_lost_verdict_with_failing_calls(seed))
