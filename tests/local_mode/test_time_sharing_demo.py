"""`make demo`'s time-sharing scenario, end to end, and the benchmark's simulated day.

The scenario runs once (module scope, simulated time, ~15 s wall): the emulator, the
simulated cluster, the local API over HTTP, and alice's rank 0 calling the real
``gpu_recovery_client``. The day simulation is pure (the scheduler's policy code, no
DynamoDB) and runs in well under a second on a small cluster.
"""

from __future__ import annotations

import dataclasses

import pytest

from bench import time_sharing_day as bench
from gpu_recovery.domain.time_sharing import Priority, QuotaBook
from local_mode import time_sharing_scenario as scenario
from tests.fixtures.history import state_changes

LOW, NORMAL, ABOVE, HIGH = (int(p) for p in (Priority.LOW, Priority.NORMAL, Priority.ABOVE_NORMAL,
                                               Priority.HIGH))


# The module's scenario is its fixture, run once per worker that takes a test: one
# xdist group (make test runs --dist loadgroup) runs it once.
pytestmark = pytest.mark.xdist_group("time-sharing-demo")


@pytest.fixture(scope="module")
def outcome() -> scenario.TimeSharingResult:
    from local_mode import world

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(world, "DEFAULT_DYNAMODB", "moto")  # as `make demo` runs it (tests/conftest.py)
        return scenario.run()


def _states(job: dict) -> list[str]:
    return [str(h.get("to")) for h in state_changes(job.get("history") or [])]


def test_the_scenario_ends_as_described(outcome: scenario.TimeSharingResult) -> None:
    assert outcome.problems == []
    assert {name: job["job_state"] for name, job in outcome.jobs.items()} == {
        "alice-pretrain": "COMPLETE", "bob-finetune": "COMPLETE", "bob-sweep": "COMPLETE"}
    assert all(int(job.get("recoveries_used") or 0) == 0 for job in outcome.jobs.values())


def test_alice_is_suspended_once_gracefully_and_resumed_from_her_checkpoint(
        outcome: scenario.TimeSharingResult) -> None:
    """Given alice's LOW job filling the cluster, When bob's HIGH job preempts it, Then her
    rank 0 (the real client over HTTP) is told, checkpoints and calls go_suspend(): the job is
    suspended once, not by force, resumed once with RESUME_COUNT=1 at attempt 2, and the
    resumed attempt starts at the checkpoint and runs only the steps left."""
    job = outcome.jobs["alice-pretrain"]
    assert (job["suspend_count"], job["resume_count"], job["attempt"]) == (1, 1, 2)
    states = _states(job)
    assert states.count("SUSPENDED") == 1
    assert states[-3:] == ["STARTING", "RUNNING", "COMPLETE"]
    reasons = " | ".join(str(h.get("reason")) for h in job["history"])
    assert "preempted by job" in reasons and "rank 0 called go_suspend()" in reasons
    assert "stopped by force" not in reasons
    facts = outcome.facts
    assert facts["forced"] is False
    assert facts["checkpoints"] == 1
    assert facts["resume_counts"] == {1: "0", 2: "1"}
    assert facts["started_from"] == {1: 0, 2: facts["checkpoint_step"]}
    assert 0 < facts["checkpoint_step"] < scenario.PRETRAIN_STEPS
    left = facts["steps_left_seconds"]
    assert facts["resumed_ran_seconds"] == pytest.approx(left, abs=scenario.STEP_SECONDS)


def test_rank_0_is_informed_within_5_s_and_the_gpus_are_freed(outcome: scenario.TimeSharingResult) -> None:
    assert outcome.informed_seconds is not None and 0 <= outcome.informed_seconds <= 5
    assert outcome.informed_seconds <= scenario.STEP_SECONDS  # one poll of the client
    assert outcome.stop_issued_seconds == pytest.approx(outcome.informed_seconds)  # go_suspend() at once
    # every rank STOPPED: the simulated container exits 10 s after its StopTask
    assert outcome.gpus_free_seconds == pytest.approx(outcome.informed_seconds + 10)


def test_quotas_are_never_exceeded_and_bob_waits_on_his(outcome: scenario.TimeSharingResult) -> None:
    facts = outcome.facts
    assert facts["quota_never_exceeded"] is True and facts["quota_checks"] > 10
    assert facts["max_held"] == {"alice LOW": 4, "bob HIGH": 2}
    assert facts["quota_usage_at_end"] == {"alice LOW": 0, "bob HIGH": 0}
    assert "quota: bob holds 2 of 2 node(s) at HIGH" in facts["quota_wait"]
    assert "2 node(s) free" in facts["quota_wait"]
    finetune = outcome.jobs["bob-finetune"]
    assert (finetune["priority"], finetune["priority_requested"]) == (HIGH, "AUTO")


def test_the_timeline_shows_the_rank_0_program_and_the_history(outcome: scenario.TimeSharingResult) -> None:
    text = "\n".join(outcome.timeline)
    assert "rank 0: receive_suspend_command() -> True" in text
    assert "rank 0: checkpoint saved at step" in text
    assert "rank 0: go_suspend() -> job SUSPENDING" in text
    assert "RESUME_COUNT=1" in text
    assert "PUT /v1/quotas" in text
    report = "\n".join(scenario.report(outcome))
    assert "quota never exceeded: yes" in report and "time sharing as described" in report


def test_a_rank_0_that_never_calls_go_suspend_is_stopped_by_force_after_its_grace() -> None:
    result = scenario.run(respond=False, until="suspended", grace_seconds=30, finetune_at=50,
                          duplicate_delivery=False)
    assert result.problems == []
    assert result.facts["forced"] is True
    assert result.informed_seconds is not None and result.informed_seconds <= 5
    # the grace, then the recovery sweep (every minute) stops the ranks, which exit 10 s later
    assert result.stop_issued_seconds is not None and 30 <= result.stop_issued_seconds <= 30 + 60
    assert result.gpus_free_seconds == pytest.approx(result.stop_issued_seconds + 10)
    assert result.jobs["alice-pretrain"]["job_state"] == "SUSPENDED"


# ----------------------------------------------------------------- the simulated day

SMALL = bench.DayConfig(
    nodes=8, hours=6, users=("ana", "ben", "chen"),
    quotas=((HIGH, 4), (ABOVE, 6), (NORMAL, 8), (LOW, 8)),
    arrivals_per_hour=((HIGH, 0.8), (ABOVE, 0.8), (NORMAL, 1.5), (LOW, 2.0)),
    sizes=((1, 0.4), (2, 0.3), (4, 0.3)), median_work_minutes=40, max_work_minutes=180)


@pytest.mark.parametrize("seed", [11, 12])
def test_a_short_day_on_a_small_cluster_keeps_the_invariants(seed: int) -> None:
    """Quota never exceeded (asserted at every tick), every job ends, every suspended job
    resumes, and higher priorities wait less than lower ones on average."""
    result = bench.simulate_day(dataclasses.replace(SMALL, seed=seed))
    summary = bench.day_summary(result)
    assert result.quota_checks == result.ticks > 6 * 60
    assert summary["quota_never_exceeded"] is True
    assert all(job.state == "COMPLETE" for job in result.jobs)
    assert summary["preemptions"] > 0 and summary["suspends"] > 0 and summary["forced_suspends"] > 0
    assert summary["resumes"] == summary["suspends"]
    assert all(job.resumes == job.suspends for job in result.jobs)
    assert summary["demotions"] > 0 and summary["quota_steps"] > 0
    for name, level in (("HIGH", HIGH), ("ABOVE_NORMAL", ABOVE), ("NORMAL", NORMAL), ("LOW", LOW)):
        held = [n for key, n in result.max_held.items() if key.endswith(f" {name}")]
        assert max(held, default=0) <= dict(SMALL.quotas)[level]
    mean = {level: q["mean"] for level, q in summary["wait_minutes"].items()}
    assert mean["HIGH"] < mean["LOW"] and mean["NORMAL"] < mean["LOW"]
    assert 0 < summary["utilisation_useful"] <= summary["utilisation_held"] <= 1


def test_the_day_finds_a_quota_overrun_when_the_policy_ignores_quotas(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-tick check is not vacuous: a planner given no limits lets users over theirs."""
    sim = bench.DaySimulation(dataclasses.replace(SMALL, seed=11))
    monkeypatch.setattr(sim, "_book", lambda: QuotaBook())
    with pytest.raises(bench.QuotaExceeded):
        sim.run()
