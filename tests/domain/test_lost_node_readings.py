"""A lost node's ECS agent read disconnected (domain.heartbeat_policy): when a reading counts,
when two confirm it, and when the host counts as alive behind it."""

from __future__ import annotations

from gpu_recovery.domain.heartbeat_policy import (
    disconnect_confirm_seconds,
    disconnect_confirmed,
    first_disconnected_reading,
    host_reporting,
)


def test_the_second_reading_comes_at_least_three_minutes_and_a_node_silence_after_the_first() -> None:
    """Given the stale threshold, Then the readings are at least that far apart, never under 180 s."""
    assert disconnect_confirm_seconds(60) == 180 and disconnect_confirm_seconds(600) == 600
    assert not disconnect_confirmed(1000.0, 1179.0, 180) and disconnect_confirmed(1000.0, 1180.0, 180)


def test_only_a_reading_of_the_current_lost_spell_counts() -> None:
    """Given readings stored on a job's lost ranks, Then one older than its rank's node_lost_at
    (an earlier spell) or malformed is ignored, and the earliest of the others is the first."""
    assert first_disconnected_reading([]) is None
    assert first_disconnected_reading([(900.0, 950.0), (None, 950.0), ("x", 950.0)]) is None
    assert first_disconnected_reading([(900.0, 950.0), (1200.0, 950.0), (1100.0, 1000.0)]) == 1100.0


def test_a_host_that_reported_at_or_since_the_first_reading_is_alive() -> None:
    """Given the first disconnected reading at 1000 and a 180 s stale threshold, Then the host
    is alive if its node agent reported after 820 (even if silent since): only a host silent
    through both readings is unreachable."""
    assert host_reporting(1100.0, 1000.0, 180) and host_reporting(820.0, 1000.0, 180)
    assert not host_reporting(819.0, 1000.0, 180) and not host_reporting(None, 1000.0, 180)
