"""The one placement attribute (domain.placement): its value per node, and which nodes are
held spare or reserved. Pure."""

from __future__ import annotations

from gpu_recovery.domain import placement
from gpu_recovery.domain.cordon import ECS_APPLIED, ECS_HELD
from gpu_recovery.domain.relocation import RelocationWait, SpareNode


def _node(node_id: str, free: int = 8, total: int = 8) -> SpareNode:
    return SpareNode(node_id, f"arn:{node_id}", "", free, total)


def test_the_one_constraint_is_documented_with_its_attribute() -> None:
    assert placement.PLACEMENT_EXPRESSION == "attribute:gpu-recovery.unavailable !exists"
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


# ------------------------------------------------------------------ issue 41: placement you can trust
def test_a_recovering_jobs_nodes_are_reserved_for_it_busy_or_free_before_anything_else() -> None:
    """Its nodes (busy: its ranks stopping; free: their GPUs released) are reserved for the
    job first; they are never a spare nor a waiting relocation's, and a lent spare stays lent."""
    wait = RelocationWait("waiting", 1, since=10.0, until=100.0, from_nodes=("dead",), gpus=(8,))
    current = {"lent": {"why": "spare", "job": "", "arn": "arn:lent", "lent": "low-job"}}
    wanted = placement.plan_holds(spares_wanted=1, current=current, free=[_node("a"), _node("c")],
                                  waits=[wait], placeable={"lent"},
                                  recovering={"a": "job-1", "b": "job-1", "lent": "job-2"})
    assert wanted["a"] == {"why": "reserved", "job": "job-1", "arn": "arn:a"}
    assert wanted["b"]["why"] == "reserved" and wanted["b"]["job"] == "job-1"  # busy: no ARN known here
    assert wanted["c"] == {"why": "reserved", "job": "waiting", "arn": "arn:c"}
    assert wanted["lent"]["why"] == "spare" and wanted["lent"]["lent"] == "low-job"


def test_a_short_pool_marks_busy_nodes_as_the_next_spares_without_taking_usable_gpus() -> None:
    """No wholly free node: the pool is refilled by marking busy nodes, the wholly busy ones
    first (a partly used node's free GPUs could serve a job now), the largest first; a mark
    does not hop; a node that frees keeps its spare hold, its busy mark gone."""
    busy = [_node("p", free=4), _node("x", free=0), _node("y", free=0, total=4), _node("z", free=0)]
    wanted = placement.plan_holds(spares_wanted=2, current={}, free=[_node("p", free=4)], waits=[], busy=busy)
    assert {n: h.get(placement.NEXT) for n, h in wanted.items()} == {"x": "busy", "z": "busy"}
    assert placement.next_spares(1, busy, {"z": wanted["z"]}) == ["z"]  # kept, not "x" by id
    freed = placement.plan_holds(spares_wanted=2, current=wanted, free=[_node("x")], waits=[],
                                 busy=[b for b in busy if b.node_id != "x"])
    assert freed["x"] == {"why": "spare", "job": "", "arn": "arn:x"} and freed["z"][placement.NEXT] == "busy"
    assert placement.hold_changes(wanted, freed) == {"x": freed["x"]}  # its busy mark gone: synced again
    full = placement.plan_holds(spares_wanted=2, current=freed, free=[_node("x"), _node("w")], waits=[],
                                busy=[b for b in busy if b.node_id != "x"])
    assert sorted(full) == ["w", "x"]  # free spares preferred: the busy mark released


def test_a_node_whose_recorded_ranks_hold_more_than_ecs_has_allocated_had_a_stop_not_handled() -> None:
    assert placement.unhandled_stop(free_gpus=8, total_gpus=8, recorded_gpus=8)  # its rank's GPUs free
    assert placement.unhandled_stop(free_gpus=1, total_gpus=8, recorded_gpus=8)  # one of 8 ranks stopped
    assert not placement.unhandled_stop(free_gpus=0, total_gpus=8, recorded_gpus=8)
    assert not placement.unhandled_stop(free_gpus=4, total_gpus=8, recorded_gpus=4)
    assert not placement.unhandled_stop(free_gpus=8, total_gpus=8, recorded_gpus=0)  # nothing recorded


def test_a_waiting_relocation_short_of_free_nodes_reserves_busy_ones_before_the_pool() -> None:
    wait = RelocationWait("waiting", 1, since=10.0, until=100.0, from_nodes=("dead",), gpus=(8,))
    busy = [_node("p", free=4), _node("x", free=0), _node("z", free=0)]
    wanted = placement.plan_holds(spares_wanted=1, current={}, free=[_node("p", free=4)], waits=[wait],
                                  busy=busy)
    assert wanted["x"] == {"why": "reserved", "job": "waiting", "arn": "arn:x", "next": "busy"}
    assert wanted["z"]["why"] == "spare" and "p" not in wanted  # the pool after the wait
