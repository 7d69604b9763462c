"""The reactions table (recovery/reactions.py): one handler per kind of event, declared once."""

from __future__ import annotations

import pytest

from gpu_recovery.recovery.reactions import JobLeftNode, Reactions, ReservationsReleased, on


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
