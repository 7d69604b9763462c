"""``checkpoint_saved(step)``: rank 0's checkpoints reach the job item through the real local
API (the control handler behind its TOKEN authorizer), cheaply, and never block or break
training when the API is slow or down."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from gpu_recovery import clock
from tests.control.world import ControlWorld
from tests.fixtures.clock import ManualClock

CHECKPOINT = "/v1/control/checkpoint"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_rank_0_reports_a_checkpoint_in_the_background(world: ControlWorld) -> None:
    """Given a RUNNING job, When rank 0 calls checkpoint_saved(120), Then the call returns at
    once, one POST is sent, and the job item holds step 120 of attempt 1 at the API's time;
    rank 1's call sends nothing."""
    job = world.start()
    rank0, rank1 = world.client(job, 0), world.client(job, 1)
    assert rank0.checkpoint_saved(120) is True
    assert rank0.flush_checkpoints(timeout=10)
    assert rank1.checkpoint_saved(120) is False
    assert world.api.count("POST", CHECKPOINT) == 1
    checkpoint = world.item(job)["checkpoint"]
    assert int(checkpoint["step"]) == 120 and int(checkpoint["attempt"]) == 1
    assert abs(float(checkpoint["at"]) - clock.now()) < 60  # the stack's clock, not the client's


def test_reports_are_rate_limited_and_the_latest_step_wins(world: ControlWorld) -> None:
    """Given rank 0 (reporting inline, as the simulation does, on a manual clock), When it saves at steps
    60, 61, 62 within a second and 63 six seconds later, Then two requests are sent: 60 at
    once, then the latest step (63) once the interval passed."""
    job = world.start()
    manual = ManualClock()
    rank0 = world.client(job, 0, clock=manual, report_in_background=False)
    rank0.checkpoint_saved(60)
    for step in (61, 62):
        manual.advance(0.5)
        rank0.checkpoint_saved(step)
    assert world.api.count("POST", CHECKPOINT) == 1
    manual.advance(6)
    rank0.checkpoint_saved(63)
    assert world.api.count("POST", CHECKPOINT) == 2
    assert int(world.item(job)["checkpoint"]["step"]) == 63


def test_a_late_smaller_step_and_another_ranks_report_are_not_kept(world: ControlWorld) -> None:
    """Given step 200 recorded, When a delayed report of step 100 arrives, Then it is answered
    recorded=false and the item keeps 200; rank 1's token is refused with 409."""
    job = world.start()
    env0, env1 = world.rank_env(job, 0), world.rank_env(job, 1)
    status, body = world.http("POST", f"/prod{CHECKPOINT}?attempt=1&step=200",
                              headers=bearer(env0["GPU_RECOVERY_CONTROL_TOKEN"]))
    assert (status, body["recorded"]) == (200, True)
    status, body = world.http("POST", f"/prod{CHECKPOINT}?attempt=1&step=100",
                              headers=bearer(env0["GPU_RECOVERY_CONTROL_TOKEN"]))
    assert (status, body["recorded"]) == (200, False)
    assert int(world.item(job)["checkpoint"]["step"]) == 200
    status, body = world.http("POST", f"/prod{CHECKPOINT}?attempt=1&step=300",
                              headers=bearer(env1["GPU_RECOVERY_CONTROL_TOKEN"]))
    assert status == 409 and body["error"] == "not_rank_0"
    status, body = world.http("POST", f"/prod{CHECKPOINT}?attempt=7&step=300",
                              headers=bearer(env0["GPU_RECOVERY_CONTROL_TOKEN"]))
    assert status == 409 and body["error"] == "stale_attempt"
    status, _ = world.http("POST", f"/prod{CHECKPOINT}?attempt=1&step=-3",
                           headers=bearer(env0["GPU_RECOVERY_CONTROL_TOKEN"]))
    assert status == 400


class _SlowBrokenOpener:
    """An API that takes 1 s and then fails (a network error)."""

    def __init__(self) -> None:
        self.calls = 0

    def open(self, request: Any, timeout: float) -> Any:
        self.calls += 1
        time.sleep(1.0)
        raise OSError("connection reset by peer")


def test_a_slow_or_failing_api_never_blocks_or_breaks_training(world: ControlWorld,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Given an API that answers after 1 s with an error, When rank 0 reports a checkpoint,
    Then the call returns within 50 ms, nothing is raised, and the failure is logged once."""
    job = world.start()
    opener = _SlowBrokenOpener()
    rank0 = world.client(job, 0, opener=opener)
    with caplog.at_level(logging.WARNING, logger="gpu_recovery_client"):
        started = time.monotonic()
        assert rank0.checkpoint_saved(10) is True
        assert time.monotonic() - started < 0.05
        assert rank0.flush_checkpoints(timeout=5)
    assert opener.calls == 1 and rank0.checkpoints_reported == 0
    assert sum("not reported" in r.getMessage() for r in caplog.records) == 1
    assert "checkpoint" not in world.item(job)
