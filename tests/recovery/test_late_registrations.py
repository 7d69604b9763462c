"""A restarted rank registered late (its start's own registration failed; its task found by its
tags, or by its ``startedBy`` once the lease runs out) is dated from its task's start, not
from when the registration landed: the goodput ledger's restart ends when the gang started.

Found by a 1 %-of-calls-failing run (``relocation_wait``, seed 4): the ledger counted 75 s of
training as restart time (productive 165 s against the truth's 240 s), the time the late
registration took.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_recovery.domain.models import Rank
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.repository.registrations import RegistrationRepository
from local_mode.remediation_scenarios import MIN, world
from tests.remediation.steps import application_error_on_node_b


def _failing_registrations(monkeypatch: pytest.MonkeyPatch, failures: int) -> dict[str, Any]:
    """The first ``failures`` registrations of rank 1's restarted task fail."""
    state = {"left": failures}
    put = RegistrationRepository.put_rank_registration

    def failing_put(self: RegistrationRepository, rank: Rank) -> bool:
        if rank.rank == 1 and rank.attempt == 2 and state["left"] > 0:
            state["left"] -= 1
            raise RuntimeError("rank 1's registration fails")
        return put(self, rank)

    monkeypatch.setattr(RegistrationRepository, "put_rank_registration", failing_put)
    return state


@pytest.fixture
def registered_by_its_tags_late(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The gang's registration of rank 1 fails, then its RUNNING event's tag look-up's twice:
    the look-up's next try, a minute or more on, registers it (from the task ECS describes)."""
    yield _failing_registrations(monkeypatch, 3)


@pytest.fixture
def found_by_its_started_by(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The gang's registration of rank 1 fails, and its RUNNING event's tag look-up registers
    nothing: the gang's next try, once the lease of the one that failed runs out, finds the task
    by its ``startedBy`` and registers it."""
    monkeypatch.setattr(RankOperations, "_rank_of_grouped_task", lambda *_: None)
    yield _failing_registrations(monkeypatch, 1)


@pytest.mark.parametrize("late", ["registered_by_its_tags_late", "found_by_its_started_by"])
def test_a_restarted_rank_registered_late_dates_the_gang_from_its_tasks_start(
        late: str, request: pytest.FixtureRequest) -> None:
    """Given a 2-node job restarted after an application error, When rank 1's registration
    lands late (either way), Then the job runs attempt 2 on both nodes, and the goodput
    ledger's restart ends when its tasks started (within the seconds ECS takes to run them),
    not when rank 1's registration landed."""
    failing = request.getfixturevalue(late)
    with world() as w:
        placed = application_error_on_node_b(w, "late")
        w.ecs.run_for(15 * MIN)
        job = w.job("late")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2), [h["to"] for h in job["history"]]
        assert failing["left"] == 0, "the premise: the registrations failed"
        started = max(p.time for p in w.ecs.placements[placed:] if p.training)
        [running] = [h for h in job["history"] if h["to"] == "RUNNING" and h.get("from") == "STARTING"]
        assert running["at"] >= started + 30, "the premise: the gang was confirmed late"
        assert started <= float(running["gp"]["running_at"]) <= started + 10, (started, running)
