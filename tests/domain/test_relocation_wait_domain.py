"""domain.relocation: the wait of a relocatable job with no healthy free node, and which
freed nodes are reserved for waiting jobs. Pure."""

from __future__ import annotations

from gpu_recovery.domain.relocation import RelocationWait, SpareNode, reserve_for_waits


def _spare(node: str, free: int) -> SpareNode:
    return SpareNode(node, f"arn/{node}", f"i-{node}", free, 8)


def test_the_wait_round_trips_and_belongs_to_one_attempt() -> None:
    wait = RelocationWait.start("j", 3, 1000.0, 600, ["n-b"], [8], "node(s) unusable: n-b replace")
    assert RelocationWait.from_item("j", wait.to_item(), 3) == wait
    assert RelocationWait.from_item("j", wait.to_item(), 4) is None  # an older fault's wait
    assert RelocationWait.from_item("j", None, 3) is None
    assert not wait.expired(1599.0) and wait.expired(1600.0)
    assert wait.timeout_reason() == ("no healthy node freed within 600 s to relocate the ranks on n-b "
                                     "(node(s) unusable: n-b replace)")


def test_the_oldest_wait_is_served_first_and_partly_when_not_all_its_ranks_fit() -> None:
    old = RelocationWait.start("old", 1, 100.0, 600, ["x", "y"], [8, 8], "")
    new = RelocationWait.start("new", 1, 200.0, 600, ["z"], [4], "")
    reserved = reserve_for_waits([new, old], [_spare("s-8", 8), _spare("s-4", 4)])
    # "old" needs two 8-GPU nodes: it keeps the one free so far; "new" takes the 4-GPU node.
    assert reserved == {"s-8": "old", "s-4": "new"}
    assert reserve_for_waits([new, old], [_spare("s-8", 8)]) == {"s-8": "old"}
    assert reserve_for_waits([], [_spare("s-8", 8)]) == {}
