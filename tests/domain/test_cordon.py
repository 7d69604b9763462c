"""The cordon limit (pure): its own, higher limit than the breaker's; idempotent per node;
never closes by itself."""

from __future__ import annotations

import pytest

from gpu_recovery.domain import cordon
from gpu_recovery.domain.cordon import CordonPolicy


def test_half_of_the_nodes_within_five_minutes_then_it_trips_and_stays_tripped() -> None:
    state = None
    for i, node in enumerate(["a", "b", "c", "d"]):
        decided = cordon.admit(state, node=node, now=100.0 + i, cluster_gpu_nodes=8)
        assert decided.allowed and decided.limit == 4
        state = decided.state
    again = cordon.admit(state, node="b", now=110.0, cluster_gpu_nodes=8)
    assert again.allowed and not again.tripped_now  # a node already cordoned: no new one
    fifth = cordon.admit(state, node="e", now=110.0, cluster_gpu_nodes=8)
    assert not fifth.allowed and fifth.tripped_now and "5 of 8" in fifth.reason
    later = cordon.admit(fifth.state, node="f", now=100.0 + 3600, cluster_gpu_nodes=8)
    assert not later.allowed and not later.tripped_now  # no self-reset, one trip only
    closed = cordon.reset(later.state)
    assert cordon.admit(closed, node="f", now=100.0 + 3600, cluster_gpu_nodes=8).allowed


def test_the_window_slides() -> None:
    policy = CordonPolicy(max_share=0.5, window_seconds=300)
    state = cordon.admit(None, node="a", now=0.0, cluster_gpu_nodes=2, policy=policy).state
    assert not cordon.admit(state, node="b", now=299.0, cluster_gpu_nodes=2, policy=policy).allowed
    assert cordon.admit(state, node="b", now=301.0, cluster_gpu_nodes=2, policy=policy).allowed


def test_the_placement_constraint_users_add() -> None:
    assert cordon.parse_sync_entry(cordon.sync_entry("node-1#x", 12.5)) == ("node-1#x", 12.5)
    assert cordon.parse_sync_entry("garbage") is None
    with pytest.raises(ValueError):
        CordonPolicy(max_share=0)
