"""The owner's suspend or resume of a job being suspended (``set_hold``) that lands while the
recovery finishes the suspension (every rank stopped): the finish's write is conditioned on
the hold it read, so it never overwrites the owner's word; it reads the job again and
finishes as the owner last said (the recovery's fakes on moto's DynamoDB)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain.time_sharing import SuspendKind
from tests.recovery.fakes import World, world

JobState = C.JobState


def suspended_for_a_preemptor(w: World, *, hold: bool) -> list[str]:
    """A running 2-rank queue job preempted (held by its owner already when ``hold``), its
    rank 0 calling go_suspend(): its ranks are being stopped."""
    arns = w.register_queue_job("j", ["node-a", "node-b"])
    assert w.service.request_suspend("j", 1, kind=SuspendKind.PREEMPTED, reason="preempted by job h",
                                     grace_seconds=60, actor="scheduler", by_job="h")
    if hold:
        assert w.service.suspensions.store.set_hold("j", True, reason="suspend by u", actor="u")
    assert w.service.go_suspend("j", 0, 1).action == "suspending"
    return arns


def owner_lands_before_the_finish(w: World, hold: bool) -> list[bool]:
    """The owner's set_hold(``hold``) commits after the finish read the job, before its write."""
    store = w.service.suspensions.store
    real = store.finish
    landed: list[bool] = []

    def owner_first(*args: Any, **kwargs: Any) -> bool:
        if not landed:
            landed.append(store.set_hold("j", hold, reason=f"owner: hold {hold}", actor="u"))
        return real(*args, **kwargs)

    store.finish = owner_first  # type: ignore[method-assign]
    return landed


@pytest.mark.parametrize("held_before", [False, True], ids=["suspend", "resume"])
def test_the_owners_word_that_lands_before_the_finish_is_what_the_job_ends_with(held_before: bool) -> None:
    """``suspend``: a preempted job the owner suspends as its ranks stop is held, not queued.
    ``resume``: a held job the owner resumes as its ranks stop is queued, not held."""
    with world() as w:
        arns = suspended_for_a_preemptor(w, hold=held_before)
        landed = owner_lands_before_the_finish(w, not held_before)
        w.stopped_by_the_stack(arns)
        assert landed == [True]
        item = w.repo.jobs.get_job_item("j")
        assert item["job_state"] == JobState.SUSPENDED.value
        assert item["held"] is (not held_before)
        assert (C.QUEUE_SK in item) is held_before
        assert int(item["suspend_count"]) == 1
