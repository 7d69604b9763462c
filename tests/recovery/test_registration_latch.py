"""A rank's registration (``RankOperations.register_rank``) writes the rank, then arrives at its
attempt's registered latch with its node. A redelivered event finds the rank written and stops
there, so the arrival is tried once more at once when a call fails: lost, the latch would miss
the rank and its node for good, and a fault of that rank would reserve every node of its job
but its own (found by soak seed 6934 at 6 %: the repaired node, unreserved when its cordon was
lifted, was taken by another scheduler and the job's restart failed waiting for it)."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from gpu_recovery.domain.states import JobState
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.registrations import RegistrationRepository
from tests.recovery.fakes import LostResponse, throttled, world


def _break_once(monkeypatch: pytest.MonkeyPatch, owner: type, name: str, how: str) -> dict[str, int]:
    """The first call of ``owner.name`` for rank 1 throttled (nothing written) or its answer
    lost (written)."""
    real = getattr(owner, name)
    left = {"calls": 1}

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        rank = args[3] if name == "arrive" else args[0].rank
        if rank != 1 or not left["calls"]:
            return real(self, *args, **kwargs)
        left["calls"] -= 1
        if how == "throttle":
            raise throttled(name)
        real(self, *args, **kwargs)
        raise LostResponse(f"{name}: response lost (injected)")

    monkeypatch.setattr(owner, name, broken)
    return left


@pytest.mark.parametrize(("owner", "name"), [(RegistrationRepository, "put_rank_registration"),
                                             (LatchRepository, "arrive")])
@pytest.mark.parametrize("how", ["throttle", "lose"])
def test_a_registration_whose_write_fails_once_still_arrives_with_its_node(
        monkeypatch: pytest.MonkeyPatch, owner: type, name: str, how: str) -> None:
    """Given a two-node job, When rank 1's registration has its rank put or its latch arrival
    throttled or its answer lost (and its RUNNING event is delivered again, as EventBridge does
    after a failed delivery), Then the latch has rank 1 and node-b; and a fault of rank 1
    reserves node-b for the job with node-a."""
    with world(max_app_restarts=1) as w:
        left = _break_once(monkeypatch, owner, name, how)
        with suppress(ClientError, BotoCoreError):
            w.register_job("j", ["node-a", "node-b"])
        assert left["calls"] == 0, "the premise: the call failed"
        arns = sorted(w.ecs.tasks, key=lambda arn: w.ecs.tasks[arn].node)
        w.service.on_task_state_change(w.task_running(arns[1], "node-b", w.now[0]))
        assert w.repo.latches.registered("j", 1, 2) == {0, 1}
        assert w.repo.latches.job_nodes("j", 1, 2) == {"node-a", "node-b"}
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert {n: w.ecs.attribute_values.get(n, {}).get(UNAVAILABLE_ATTRIBUTE)
                for n in ("node-a", "node-b")} == {"node-a": "reserved", "node-b": "reserved"}


@pytest.mark.parametrize("exit_code", [1, 3])
def test_a_rank_whose_arrival_failed_twice_still_has_its_node_reserved_by_its_fault(
        monkeypatch: pytest.MonkeyPatch, exit_code: int) -> None:
    """Given a two-node job whose rank 1's registered arrival failed at both tries (the latch
    lacks rank 1 and node-b for good), When rank 1 fails (exit 1: its node a suspect; exit 3:
    an application error, restarted on the same nodes), Then node-b is reserved for the job
    with node-a, by the fault (which names the failing rank's node) and by the holds' refresh
    after it; and the job's nodes, read from its latch, count those its ranks ended on."""
    with world(max_app_restarts=1) as w:
        left = _break_once(monkeypatch, LatchRepository, "arrive", "throttle")
        left["calls"] = 2
        with suppress(ClientError, BotoCoreError):
            w.register_job("j", ["node-a", "node-b"])
        assert left["calls"] == 0, "the premise: both tries failed"
        assert w.repo.latches.registered("j", 1, 2) == {0}
        arns = sorted(w.ecs.tasks, key=lambda arn: w.ecs.tasks[arn].node)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=exit_code))
        reserved = {"node-a": "reserved", "node-b": "reserved"}
        assert {n: w.ecs.attribute_values.get(n, {}).get(UNAVAILABLE_ATTRIBUTE)
                for n in ("node-a", "node-b")} == reserved
        # What the holds' refresh rebuilds them from, had the fault's reservation failed too:
        assert w.repo.latches.job_nodes("j", 1, 2) == {"node-a", "node-b"}
        w.advance(61)
        w.service.sweep()
        assert w.repo.jobs.get_job("j").state is not JobState.RUNNING  # node-a's rank not ended yet
        assert {n: w.ecs.attribute_values.get(n, {}).get(UNAVAILABLE_ATTRIBUTE)
                for n in ("node-a", "node-b")} == reserved
