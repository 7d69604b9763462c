"""The one placement attribute (domain.placement): its value per node, and which nodes are
held spare or reserved. Pure."""

from __future__ import annotations

from gpu_recovery.domain import placement
from gpu_recovery.domain.cordon import ECS_APPLIED, ECS_HELD
from gpu_recovery.domain.relocation import RelocationWait, SpareNode


def _node(node_id: str, free: int = 8, total: int = 8) -> SpareNode:
    return SpareNode(node_id, f"arn:{node_id}", "", free, total)


def test_the_one_constraint_is_documented_with_its_attribute() -> None:
    assert placement.PLACEMENT_CONSTRAINT == {"type": "memberOf",
                                              "expression": "attribute:gpu-recovery.unavailable !exists"}
    assert placement.DEPRECATED_CORDON_ATTRIBUTE == "gpu-recovery.cordoned"


def test_a_cordoned_node_gets_both_attributes_and_a_held_cordon_none() -> None:
    put, delete = placement.attributes_wanted({"ecs": ECS_APPLIED}, None)
    assert put == {"gpu-recovery.unavailable": "cordoned", "gpu-recovery.cordoned": ""} and delete == []
    put, delete = placement.attributes_wanted({"ecs": ECS_HELD}, {"why": "spare"})
    assert put == {} and sorted(delete) == ["gpu-recovery.cordoned", "gpu-recovery.unavailable"]


def test_a_spare_or_reserved_node_says_why_and_a_free_one_has_none() -> None:
    assert placement.attributes_wanted(None, {"why": "spare"}) == (
        {"gpu-recovery.unavailable": "spare"}, ["gpu-recovery.cordoned"])
    assert placement.attribute_value({}, {"why": "reserved", "job": "j"}) == "reserved"
    assert placement.attribute_value({}, None) is None


def test_reservations_come_first_then_spares_topped_up_largest_first() -> None:
    wait = RelocationWait("waiting", 1, since=10.0, until=100.0, from_nodes=("dead",), gpus=(8,))
    free = [_node("a"), _node("b"), _node("c", free=4), _node("d", free=16, total=16), _node("e")]
    wanted = placement.plan_holds(spares_wanted=2, current={}, free=free, waits=[wait])
    # "a": the best fit for the wait; "c" is partly busy (no spare); "d" the largest.
    assert {n: h["why"] for n, h in wanted.items()} == {"a": "reserved", "b": "spare", "d": "spare"}
    assert wanted["a"]["job"] == "waiting" and wanted["d"]["arn"] == "arn:d"


def test_a_spare_keeps_its_hold_while_it_qualifies_and_loses_it_when_busy() -> None:
    current = {"b": {"why": "spare", "job": "", "arn": "arn:b"}}
    wanted = placement.plan_holds(spares_wanted=1, current=current, free=[_node("a"), _node("b")], waits=[])
    assert set(wanted) == {"b"}  # does not hop to "a" (first by id)
    assert placement.hold_changes(current, wanted) == {}
    busy = placement.plan_holds(spares_wanted=1, current=current, free=[_node("a"), _node("b", free=0)],
                                waits=[])
    assert placement.hold_changes(current, busy) == {"a": {"why": "spare", "job": "", "arn": "arn:a"},
                                                     "b": None}


def test_no_pool_and_no_wait_holds_nothing() -> None:
    assert placement.plan_holds(spares_wanted=0, current={}, free=[_node("a")], waits=[]) == {}


# ------------------------------------------------------------------ spares lent (issue 29)

def test_only_a_low_queue_job_may_borrow_a_spare_and_only_with_lending_on() -> None:
    low = {"queue_job": True, "priority": 0, "relocated": False}
    assert placement.may_borrow_spare(lending=True, **low)
    assert not placement.may_borrow_spare(lending=False, **low)
    assert not placement.may_borrow_spare(lending=True, **{**low, "priority": 5})  # BELOW_NORMAL
    assert not placement.may_borrow_spare(lending=True, **{**low, "queue_job": False})  # cannot suspend
    assert not placement.may_borrow_spare(lending=True, **{**low, "relocated": True})  # takes spares outright


def test_a_lent_spare_stays_a_spare_while_in_use_and_the_pool_is_not_refilled() -> None:
    current = {"a": placement.lend({"why": "spare", "job": "", "arn": "arn:a", "at": 5.0}, "low")}
    assert "at" not in current["a"] and placement.lent_of(current) == {"a": "low"}
    free = [_node("b"), _node("c")]  # "a" is busy: not free, but healthy and placeable
    wanted = placement.plan_holds(spares_wanted=1, current=current, free=free, waits=[],
                                  placeable={"a", "b", "c"})
    assert wanted == {"a": {"why": "spare", "job": "", "arn": "arn:a", "lent": "low"}}
    assert placement.hold_changes(current, wanted) == {}
    # Its node no longer healthy (or gone): the hold ends and the pool refills.
    wanted = placement.plan_holds(spares_wanted=1, current=current, free=free, waits=[], placeable={"b", "c"})
    assert {n: h["why"] for n, h in wanted.items()} == {"b": "spare"}
    assert placement.hold_changes(current, wanted)["a"] is None


def test_a_lent_spare_in_use_is_not_reserved_but_once_free_goes_to_the_waiting_relocation() -> None:
    wait = RelocationWait("reloc", 1, since=10.0, until=100.0, from_nodes=("dead",), gpus=(8,))
    current = {"a": {"why": "spare", "job": "", "arn": "arn:a", "lent": "low"}}
    wanted = placement.plan_holds(spares_wanted=1, current=current, free=[], waits=[wait], placeable={"a"})
    assert wanted["a"]["lent"] == "low"  # still in use: the wait waits for its suspension
    wanted = placement.plan_holds(spares_wanted=1, current=current, free=[_node("a")], waits=[wait],
                                  placeable={"a"})
    assert wanted == {"a": {"why": "reserved", "job": "reloc", "arn": "arn:a"}}


def test_a_relocation_takes_back_only_the_lent_spares_it_needs() -> None:
    lent = [_node("s1", free=0), _node("s2", free=0), _node("s3", free=0, total=4)]
    # Free nodes fit one rank of two: one lent spare is taken back, the largest first.
    assert placement.lent_to_reclaim([8, 8], [_node("f")], lent) == ["s1"]
    assert placement.lent_to_reclaim([8, 8], [], lent) == ["s1", "s2"]
    assert placement.lent_to_reclaim([8, 8, 8], [], lent) == []  # the 4-GPU spare is too small
    assert placement.lent_to_reclaim([4], [], lent) == ["s1"]  # one job suspended, the largest spare
    # The free nodes would do: nothing is suspended; too little even with every lent spare: none.
    assert placement.lent_to_reclaim([8], [_node("f")], lent) == []
    assert placement.lent_to_reclaim([8, 8, 8], [], lent[:1]) == []
    assert placement.lent_to_reclaim([8], [], []) == []
