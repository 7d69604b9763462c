"""The reactions table (recovery/reactions.py): one handler per kind of event, declared once."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.states import JobState
from gpu_recovery.recovery.reactions import (
    FaultSeen,
    JobLeftNode,
    Reactions,
    ReservationsReleased,
    on,
    reserved_first,
)


def test_an_event_reaches_the_handler_its_kind_is_declared_with_and_its_answer_comes_back() -> None:
    """Given a table that reacts to a job leaving a node
    When that event is emitted
    Then its handler gets the event and the emitter gets the handler's answer."""
    seen: list[str] = []
    reactions = Reactions()
    reactions.declare([on(JobLeftNode, lambda e: seen.append(e.node) or "repaired")])
    assert reactions.emit(JobLeftNode("node-a")) == "repaired"
    assert seen == ["node-a"]


def test_an_event_nothing_reacts_to_answers_none() -> None:
    """Given a table without the event's kind (a stage built alone, in a unit test)
    When the event is emitted
    Then nothing runs and the answer is None; ``handles`` says so beforehand."""
    reactions = Reactions()
    reactions.declare([on(JobLeftNode, lambda e: "repaired")])
    assert not reactions.handles(ReservationsReleased)
    assert reactions.emit(ReservationsReleased("job-1")) is None
    assert reactions.handles(JobLeftNode)


def test_the_table_is_declared_once() -> None:
    """Given a declared table
    When a second one is declared
    Then it is refused: the composition root owns the only table."""
    reactions = Reactions()
    reactions.declare([on(JobLeftNode, lambda e: None)])
    with pytest.raises(RuntimeError, match="declared once"):
        reactions.declare([on(ReservationsReleased, lambda e: None)])


def test_the_service_declares_a_handler_for_every_event_a_stage_emits() -> None:
    """Given the recovery service built over fakes of its ports
    When its table is read
    Then every kind of event in recovery/reactions.py has its handler (an event no stage
    reacts to would be lost silently)."""
    import dataclasses
    import inspect

    from gpu_recovery.recovery import reactions as module
    from gpu_recovery.recovery.service import RecoveryService

    kinds = {obj for _, obj in inspect.getmembers(module, inspect.isclass)
             if dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__ and obj is not Reactions}
    declared = {kind for kind, _ in RecoveryService._reactions(object.__new__(RecoveryService))}
    assert kinds == declared


@pytest.mark.parametrize(("raised", "reserved"), [
    (None, True),
    (RateLimited(2.0), True),  # the ECS budget paced a large job's puts: the holds are committed
    (ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "PutAttributes"),
     False),
])
def test_a_stop_waits_only_for_a_reservation_that_failed(raised: Exception | None, reserved: bool) -> None:
    """Given a fault's reservation (``FaultSeen``) that succeeds, is paced by the ECS budget, or
    fails (a throttled put), When ``reserved_first`` asks for it, Then only the failure holds
    the stop back for the sweep; a table without the reaction (a unit test's) holds nothing."""
    def reserve(event: FaultSeen) -> str:
        if raised is not None:
            raise raised
        return "holds_changed"

    reactions = Reactions()
    reactions.declare([on(FaultSeen, reserve)])
    job = Job(job_id="job-1", state=JobState.PENDING_HEALTHCHECK, world_size=2)
    assert reserved_first(reactions, job, "node-a") is reserved
    assert reserved_first(Reactions(), job) is True
