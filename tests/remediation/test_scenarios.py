"""The remediation scenarios of ``make demo`` (one per catalog class), under the emulator
with AWS-shaped events delivered at least once: each must end exactly as described."""

from __future__ import annotations

from functools import cache

import pytest

from gpu_recovery import constants as C
from local_mode import remediation_scenarios as scenarios

# Each scenario runs once per process and every test of it reads that run (the scenarios
# are deterministic); one xdist group keeps them on one worker (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("remediation-scenarios")


@cache
def outcome(name: str) -> scenarios.ScenarioResult:
    return scenarios.SCENARIOS[name]()


#: the slow tier's scenarios, covered in make test by their stage and handler tests (the
#: flapping node: tests/handlers/test_recovery_loop.py, tests/domain/test_escalation.py; the
#: breaker's three, ~20 s each: tests/recovery/breaker/ and tests/domain/breaker/ with fakes,
#: and the crash campaigns' held flows)
SLOW = ("flapping", "breaker", "breaker_autoclose", "breaker_refault")


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [])
                                  for name in scenarios.SCENARIOS])
def test_scenario_ends_as_described(name: str) -> None:
    result = outcome(name)
    assert result.problems == [], "\n".join([*result.problems, *result.timeline[-60:]])


def test_the_fast_path_skips_the_diag_and_its_evidence_reaches_job_node_and_mail() -> None:
    """Given XID 79 reported by the node agent and the rank's exit, Then the reboot starts
    at the exit (no DCGM run), and the XID is in the job's fault record, the node's fault
    history and the 'recovered' e-mail."""
    result = outcome("fast_path")
    assert result.jobs["llama-fp"]["attempt"] == 2
    node_b = next(item for name, item in result.nodes.items() if name == "node-b")
    record = result.fault_record("llama-fp", 1)
    assert [x["xid"] for x in record["evidence"]["xids"]] == [79]
    assert record["plan"]["decision"]["skip_health_check"] is True
    assert [x["xid"] for x in node_b["fault_history"][0]["xids"]] == [79]
    mail = next(n for n in result.notifications
                if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "recovered")
    assert "XIDs: 79 on GPU-" in mail["message"] and "no DCGM diag" in mail["message"]
    assert result.facts["fault_to_running_seconds"] < 240  # diag (120 s) skipped: reboot + restart


# Slow tier (CI runs it: make test-slow): the breaker's scenario (~15 s); tests/recovery/breaker/
# and tests/domain/breaker/ cover it with fakes in make test.
@pytest.mark.slow
def test_a_tripped_breaker_holds_every_later_node_action_and_the_jobs_there_wait() -> None:
    """Given the breaker tripped on the 4th of 16 nodes, Then the 5th node is not rebooted
    either (kept in the backlog), and the trip was told once, saying which job waits on the
    held node; the jobs on both held nodes (not relocatable) wait HELD, uncharged, with one
    e-mail each; nothing is placed on a held node and no job fails; after the reset they
    restart on their own nodes (scenario's problems: test_scenario_ends_as_described)."""
    result = outcome("breaker")
    assert result.facts["backlog"] == ["node-07", "node-09"]
    assert result.kinds().count("breaker_tripped") == 1
    assert "4 of 16 GPU nodes" in result.facts["trip_reason"]
    assert result.facts["held_jobs"] == {"job-3": ("HELD", 0), "job-4": ("HELD", 0)}
    assert result.facts["placed_on_held_nodes"] == []
    assert result.kinds().count("job_held") == 2
    assert not [j for j, item in result.jobs.items() if item["job_state"] == "FAILED"]
    [trip] = [n for n in result.notifications
              if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "breaker_tripped"]
    assert "(jobs on it: job-3 (waits HELD until the breaker closes" in trip["message"]


# Slow tier (CI runs it: make test-slow): the breaker's scenario (~15 s); tests/recovery/breaker/
# and tests/domain/breaker/ cover it with fakes in make test.
@pytest.mark.slow
def test_after_a_storm_whose_nodes_came_back_the_breaker_closes_by_itself_and_later_faults_are_fixed(
        ) -> None:
    """Given the storm's 3 rebooted nodes back healthy and nobody resetting the breaker, Then
    a window after the trip it closes by itself with one e-mail, releases node-07's reboot
    (job-3 restarts), and a fault long after is rebooted at once (job-5 recovers, never
    HELD); no job fails (scenario's problems: test_scenario_ends_as_described)."""
    result = outcome("breaker_autoclose")
    assert result.kinds().count("breaker_closed") == 1 and result.kinds().count("job_held") == 1
    assert "breaker_needs_operator" not in result.kinds()
    assert 600 <= result.facts["closed_at"] - result.facts["tripped_at"] < 600 + 3 * 60
    assert result.facts["rebooted"] == ["node-01", "node-03", "node-05", "node-07", "node-11"]
    assert [h["to"] for h in result.jobs["job-5"]["history"]].count("HELD") == 0
    [mail] = [n for n in result.notifications
              if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "breaker_closed"]
    assert "1 held-back action(s) released at the window's rate" in mail["message"]


# Slow tier (CI runs it: make test-slow): the breaker's scenario (~15 s); tests/recovery/breaker/
# and tests/domain/breaker/ cover it with fakes in make test.
@pytest.mark.slow
def test_when_a_rebooted_node_faults_again_the_breaker_stays_open_and_says_so() -> None:
    result = outcome("breaker_refault")
    assert result.kinds().count("breaker_needs_operator") == 1 and "breaker_closed" not in result.kinds()
    assert "failed again after its remediation" in result.facts["needs_operator"]
    assert result.facts["show"] == "open until an operator resets it"


def test_observe_mode_changes_nothing_on_aws() -> None:
    result = outcome("observe")
    assert (result.counters["reboots"], result.counters["stop_requests"],
            result.counters["health_checks_started"]) == (0, 0, 0)
    assert result.kinds().count("observed") == 1
