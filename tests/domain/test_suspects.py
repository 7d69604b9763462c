"""Which exits of a fault are checked (domain/suspects.py, issue 50)."""

from __future__ import annotations

import pytest

from gpu_recovery.domain.suspects import FIRST_CHECKED_EXITS, coupled, first_exits


def test_the_first_exits_keep_the_two_earliest_whatever_the_order_they_are_added_in() -> None:
    known: tuple[float, ...] = ()
    for exited_at in (105.0, 100.0, 103.0, 101.0):
        known = first_exits(known, exited_at)
    assert known == (100.0, 101.0)
    assert FIRST_CHECKED_EXITS == 2


@pytest.mark.parametrize(("exited_at", "known", "own", "expected"), [
    (104.0, (100.0, 103.0), False, True),    # after the first two: it died of the fault
    (102.5, (100.0, 103.0), False, True),    # between them, within the margin: the handled order stands
    (102.0, (100.0, 103.0), False, True),    # exactly the margin before the second: still coupled
    (101.9, (100.0, 103.0), False, False),   # one of the two earliest beyond the margin: a second fault
    (99.0, (100.0, 103.0), False, False),    # earlier than every suspect: its event came late
    (100.0, (100.0, 103.0), False, False),   # a tie with the earliest counts as before it
    (104.0, (100.0,), False, False),         # fewer than two exits known
    (104.0, (100.0, 103.0), True, False),    # its node has evidence of its own
    (None, (100.0, 103.0), False, False),    # no stop time: a suspect
])
def test_a_later_exit_without_evidence_of_its_own_is_coupled(
        exited_at: float | None, known: tuple[float, ...], own: bool, expected: bool) -> None:
    assert coupled(exited_at, known, own_evidence=own) is expected


def test_a_lost_write_of_the_first_exits_only_makes_more_suspects() -> None:
    """Given the suspects' stop times (99, 103) but only (103,) written (99's write lost)
    When an exit at 102 is judged
    Then it is a suspect (checked), never coupled wrongly: what is missing only widens."""
    assert not coupled(102.0, (103.0,), own_evidence=False)
    assert coupled(102.5, (99.0, 103.0), own_evidence=False)


def test_a_second_fault_handled_after_a_peer_is_still_a_suspect() -> None:
    """Given node-b's GPU failing at 100, node-d's at 101 (an independent fault), node-a's rank
    exiting at 103 of the NCCL error, and node-d's event handled last (its delivery died)
    When node-d's exit is judged after node-b's and node-a's
    Then it is a suspect: one of the two earliest exits, by more than the margin."""
    assert not coupled(101.0, first_exits(first_exits((), 100.0), 103.0), own_evidence=False)
    assert not coupled(101.0, first_exits(first_exits((), 103.0), 100.0), own_evidence=False)
