"""Blast-radius breaker: a share (or count) of the cluster's GPU nodes per window, then stop."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.breaker.breaker import CLOSED, TRIPPED, BreakerPolicy

T = 1_734_220_000.0
POLICY = BreakerPolicy()


def act(state, node: str, at: float, *, nodes: int = 16, policy: BreakerPolicy = POLICY,
        action: str = "reboot"):
    return breaker.record_action(state, node=node, action=action, now=at, cluster_gpu_nodes=nodes,
                                 policy=policy, job_id="j", reason="xid-79")


def test_four_of_sixteen_nodes_in_ten_minutes_trip_it_and_nothing_more_is_rebooted() -> None:
    """The issue's demo: 16 GPU nodes, 20 % -> 3 nodes per 10 min. Given faults on 4 nodes
    within 10 min, Then 3 reboots go ahead, the 4th trips the breaker (notify once) and waits
    in the backlog; a 5th node is refused without a second notification."""
    state = breaker.new_state()
    allowed, notified = [], 0
    for n in range(5):
        result = act(state, f"node-{n}", T + 60 * n)
        state = result.state
        allowed.append(result.allowed)
        notified += result.tripped_now
    assert allowed == [True, True, True, False, False]
    assert notified == 1
    assert state["state"] == TRIPPED and state["trips"] == 1
    assert [b["node"] for b in state["backlog"]] == ["node-3", "node-4"]
    assert ("4 of 16 GPU nodes would be acted on within 600 s (limit 3: 20% of the cluster)"
            in state["trip_reason"])


def test_it_never_closes_by_itself() -> None:
    state = breaker.new_state()
    for n in range(4):
        state = act(state, f"node-{n}", T + n).state
    later = act(state, "node-9", T + 7 * 86400)
    assert not later.allowed and later.state["state"] == TRIPPED


def test_the_window_slides() -> None:
    state = breaker.new_state()
    for n in range(3):
        state = act(state, f"node-{n}", T + n).state
    assert act(state, "node-3", T + 300).allowed is False
    assert act(state, "node-3", T + 601).allowed is True  # node-0..2 left the window


def test_acting_again_on_a_node_in_the_window_does_not_widen_the_blast_radius() -> None:
    """A redelivered event, or a reboot escalated to a replacement, on the same node."""
    state = breaker.new_state()
    for n in range(3):
        state = act(state, f"node-{n}", T + n).state
    again = act(state, "node-1", T + 10, action="replace")
    assert again.allowed and again.nodes_in_window == 3
    assert breaker.status(again.state, now=T + 10, cluster_gpu_nodes=16).nodes_in_window == 3


def test_absolute_cap_and_small_clusters() -> None:
    capped = BreakerPolicy(max_nodes=2)
    assert capped.allowed_nodes(100) == 2 and POLICY.allowed_nodes(100) == 20
    assert POLICY.allowed_nodes(4) == 1  # floor(0.8) -> at least one node may be fixed
    assert BreakerPolicy(min_allowed=0).allowed_nodes(4) == 0
    state = breaker.new_state()
    assert act(state, "a", T, nodes=100, policy=capped).allowed
    state = act(state, "a", T, nodes=100, policy=capped).state
    state = act(state, "b", T, nodes=100, policy=capped).state
    assert act(state, "c", T, nodes=100, policy=capped).tripped_now


def test_disabled_breaker_allows_everything() -> None:
    policy = BreakerPolicy(enabled=False)
    state = breaker.new_state()
    for n in range(10):
        result = act(state, f"n{n}", T, nodes=10, policy=policy)
        assert result.allowed
        state = result.state


def test_reset_resumes_or_drops_the_backlog() -> None:
    state = breaker.new_state()
    for n in range(6):
        state = act(state, f"node-{n}", T + n).state
    resumed = breaker.reset(state, now=T + 3600, resume_backlog=True, by="alice")
    assert resumed.state["state"] == CLOSED and resumed.state["backlog"] == []
    assert [b["node"] for b in resumed.released] == ["node-3", "node-4", "node-5"]
    assert resumed.state["window"] == [] and resumed.state["last_reset_by"] == "alice"
    dropped = breaker.reset(state, now=T + 3600, resume_backlog=False)
    assert dropped.released == () and len(dropped.dropped) == 3
    stale = breaker.reset(state, now=T + 3600, resume_backlog=True, max_backlog_age_seconds=60)
    assert stale.released == () and len(stale.dropped) == 3  # NVSentinel #450: no stale replays
    assert act(resumed.state, "node-7", T + 3601).allowed


def test_a_released_backlog_comes_back_a_windows_allowance_at_a_time() -> None:
    """After a reset, released entries are admitted only while the window has room (16
    nodes: 3 per 10 min); a refusal neither trips the breaker nor changes its state; a node
    already in the window is free; the window slides; a tripped breaker holds them all."""
    state = breaker.new_state()
    for n in range(8):
        state = act(state, f"node-{n}", T + n).state
    reset = breaker.reset(state, now=T + 60, resume_backlog=True)
    state = reset.state
    admitted = []
    for entry in reset.released:
        decided = breaker.admit_release(state, node=entry["node"], action="reboot", now=T + 70,
                                        cluster_gpu_nodes=16)
        if decided.allowed:
            state = decided.state
            admitted.append(entry["node"])
        else:
            assert decided.state == breaker.normalize(state) and not decided.tripped_now
    assert admitted == ["node-3", "node-4", "node-5"] and state["state"] == CLOSED
    again = breaker.admit_release(state, node="node-4", action="reboot", now=T + 80, cluster_gpu_nodes=16)
    assert again.allowed and again.nodes_in_window == 3
    later = breaker.admit_release(state, node="node-6", action="reboot", now=T + 70 + 600,
                                  cluster_gpu_nodes=16)
    assert later.allowed
    tripped = act(act(act(act(breaker.new_state(), "a", T).state, "b", T).state, "c", T).state, "d", T).state
    held = breaker.admit_release(tripped, node="node-6", action="reboot", now=T + 1, cluster_gpu_nodes=16)
    assert not held.allowed and "waits for the next reset" in held.reason
    off = breaker.admit_release(tripped, node="x", action="reboot", now=T, cluster_gpu_nodes=16,
                                policy=BreakerPolicy(enabled=False))
    assert off.allowed


def test_released_entries_count_in_the_backlog_metric() -> None:
    stored = {**breaker.new_state(), "released": {"node-1": {"node": "node-1"}, "node-2": {"node": "node-2"}}}
    status = breaker.status(stored, now=T, cluster_gpu_nodes=16)
    assert status.metrics()["BreakerBacklog"] == 2.0 and status.to_dict()["released"] == 2


def test_backlog_keeps_one_entry_per_node_and_action() -> None:
    state = breaker.new_state()
    for n in range(4):
        state = act(state, f"node-{n}", T + n).state
    again = act(state, "node-3", T + 5)
    assert not again.allowed and len(again.state["backlog"]) == 1


def test_status_metrics_and_stored_item() -> None:
    state = breaker.new_state()
    for n in range(2):
        state = act(state, f"node-{n}", T + n).state
    stored = {k: (str(v) if k == "version" else v) for k, v in state.items()}  # as DynamoDB returns
    status = breaker.status(stored, now=T + 5, cluster_gpu_nodes=16)
    assert (status.state, status.nodes_in_window, status.limit) == (CLOSED, 2, 3)
    assert status.utilization == pytest.approx(2 / 3)
    assert status.metrics() == {"BreakerTripped": 0.0, "BreakerUtilization": pytest.approx(2 / 3),
                                "BreakerBacklog": 0.0}
    assert breaker.normalize(None) == breaker.new_state()
    assert status.to_dict()["limit"] == 3


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_share"):
        BreakerPolicy(max_share=0)
    with pytest.raises(ValueError, match="max_nodes"):
        BreakerPolicy(max_nodes=0)


# --- properties ----------------------------------------------------------------------------

requests = st.lists(st.tuples(st.integers(0, 19), st.integers(0, 1800)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(requests, st.integers(1, 40), st.sampled_from([0.1, 0.2, 0.5]), st.sampled_from([None, 1, 3]))
def test_no_window_ever_sees_more_nodes_acted_on_than_the_limit(reqs, nodes, share, cap) -> None:
    """For any sequence of requests (node, time): within every sliding window, the distinct
    nodes actually acted on never exceed the limit; the breaker notifies at most once; every
    refused request is in the backlog; the version only grows."""
    policy = BreakerPolicy(max_share=share, max_nodes=cap, window_seconds=600)
    limit = policy.allowed_nodes(nodes)
    state = breaker.new_state()
    acted: list[tuple[float, int]] = []
    refused: set[int] = set()
    notified = 0
    for node, offset in sorted(reqs, key=lambda r: r[1]):
        at = T + offset
        result = breaker.record_action(state, node=f"n{node}", action="reboot", now=at,
                                       cluster_gpu_nodes=nodes, policy=policy)
        assert result.state["version"] >= state["version"]
        state = result.state
        notified += result.tripped_now
        if result.allowed:
            acted.append((at, node))
        else:
            refused.add(node)
    for start, _ in acted:
        in_window = {n for at, n in acted if start - 600 < at <= start}
        assert len(in_window) <= limit
    assert notified <= 1
    assert notified == (1 if refused else 0)
    assert {b["node"] for b in state["backlog"]} == {f"n{n}" for n in refused}


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 500), st.floats(min_value=0.01, max_value=1.0),
       st.one_of(st.none(), st.integers(1, 50)))
def test_limit_is_the_share_or_the_cap_and_never_below_the_minimum(nodes, share, cap) -> None:
    policy = BreakerPolicy(max_share=share, max_nodes=cap)
    limit = policy.allowed_nodes(nodes)
    assert limit >= policy.min_allowed
    assert limit <= max(policy.min_allowed, int(share * nodes + 1e-9))
    if cap is not None:
        assert limit <= max(cap, policy.min_allowed)


# ------------------------------------------------------------------ closing by itself
A = breaker.AutoClose
BACK = breaker.ActedOnNode(breaker.InstanceState.AVAILABLE)
WINDOW = POLICY.window_seconds


def _storm() -> dict:
    """16 nodes: node-0..2 rebooted, node-3 trips it at T + 180 (kept in the backlog)."""
    state = breaker.new_state()
    for n in range(4):
        state = act(state, f"node-{n}", T + 60 * n).state
    return state


def _assess(state, at: float, views=None, policy: BreakerPolicy = POLICY):
    views = {f"node-{n}": BACK for n in range(3)} if views is None else views
    return breaker.assess_auto_close(state, now=at, policy=policy, nodes_now=views, cluster_gpu_nodes=16)


def test_a_trip_remembers_the_nodes_it_had_acted_on_and_a_reset_forgets_them() -> None:
    state = _storm()
    assert state["tripped_nodes"] == ["node-0", "node-1", "node-2"] and state["tripped_at"] == T + 180
    assert breaker.acted_on_nodes(breaker.normalize(state)) == ("node-0", "node-1", "node-2")
    assert breaker.reset(state, now=T + 900, resume_backlog=True).state["tripped_nodes"] == []


def test_it_closes_a_window_after_the_trip_once_every_node_it_acted_on_is_back_healthy() -> None:
    state = _storm()
    answer = _assess(state, T + 180 + WINDOW)
    assert answer.verdict is A.CLOSE and answer.standing == "open, waiting to close by itself"
    assert "nodes node-0, node-1, node-2 back healthy" in answer.reason


def test_it_waits_for_its_window_since_the_trip_even_with_every_node_back() -> None:
    answer = _assess(_storm(), T + 180 + WINDOW - 1)
    assert answer.verdict is A.WAIT and "has not passed since the trip" in answer.reason


def test_it_waits_for_a_node_still_rebooting_or_uncordoning() -> None:
    for view in (breaker.ActedOnNode(breaker.InstanceState.REBOOTING),
                 breaker.ActedOnNode(breaker.InstanceState.HEALTH_CHECKING),
                 breaker.ActedOnNode(breaker.InstanceState.AVAILABLE, cordoned=True)):
        answer = _assess(_storm(), T + 180 + WINDOW, {"node-0": BACK, "node-1": view, "node-2": BACK})
        assert answer.verdict is A.WAIT and answer.reason.startswith("not back yet: node-1"), answer


def test_a_node_not_back_within_its_windows_leaves_it_to_an_operator() -> None:
    late = T + 180 + POLICY.auto_close_windows * WINDOW
    answer = _assess(_storm(), late, {"node-0": BACK, "node-1": breaker.ActedOnNode(
        breaker.InstanceState.REBOOTING), "node-2": BACK})
    assert answer.verdict is A.OPERATOR and answer.standing == "open until an operator resets it"
    assert "node-1 did not come back within 3 windows of the trip" in answer.reason


@pytest.mark.parametrize("view, says", [
    (breaker.ActedOnNode(breaker.InstanceState.AVAILABLE, failed_again=True), "node-1 failed again"),
    (breaker.ActedOnNode(breaker.InstanceState.SUSPECT), "node-1 is SUSPECT after its remediation"),
    (breaker.ActedOnNode(breaker.InstanceState.QUARANTINED), "node-1 is QUARANTINED"),
    (None, "node-1 is gone (no item)"),
])
def test_a_node_that_failed_again_leaves_it_to_an_operator_at_once(view, says) -> None:
    views = {"node-0": BACK, "node-2": BACK, **({"node-1": view} if view else {})}
    answer = _assess(_storm(), T + 200, views)  # even before its window passed
    assert answer.verdict is A.OPERATOR and says in answer.reason


@pytest.mark.parametrize("view", [breaker.ActedOnNode(breaker.InstanceState.QUARANTINED), None])
def test_a_node_it_took_out_of_service_is_done_once_out_not_a_failure(view) -> None:
    """A dead GPU's node quarantined (or terminated) as decided is never back healthy, and
    need not be: the soak's seed 4 (four nodes in ten minutes, one a replace) kept its
    breaker open for an operator until this."""
    state = breaker.new_state()
    for n in range(4):
        state = act(state, f"node-{n}", T + 60 * n, action="replace" if n == 1 else "reboot").state
    views = {"node-0": BACK, "node-2": BACK, **({"node-1": view} if view else {})}
    answer = _assess(state, T + 180 + WINDOW, views)
    assert answer.verdict is A.CLOSE, answer
    assert "node-0, node-2 back healthy (node-1 taken out of service as decided)" in answer.reason
    # a node quarantined after a reboot is another matter: the reboot did not fix it
    assert _assess(_storm(), T + 180 + WINDOW, {**views, "node-1": breaker.ActedOnNode(
        breaker.InstanceState.QUARANTINED)}).verdict is A.OPERATOR


def test_a_new_action_held_back_for_a_node_it_acted_on_is_a_failure_again() -> None:
    state = act(_storm(), "node-1", T + 400).state  # node-1 faults again while tripped
    answer = _assess(state, T + 180 + WINDOW)
    assert answer.verdict is A.OPERATOR and "node-1 failed again" in answer.reason


def test_it_waits_while_more_new_nodes_than_the_limit_need_an_action_within_a_window() -> None:
    state = _storm()
    for n, at in ((4, T + 700), (5, T + 710), (6, T + 720)):
        state = act(state, f"node-{n}", at).state
    # node-3 (the trip) left the last window; node-4..6 are 3 new nodes: the limit, not past it
    assert _assess(state, T + 180 + WINDOW).verdict is A.CLOSE
    state = act(state, "node-7", T + 730).state  # a 4th new node within the window: the storm goes on
    answer = _assess(state, T + 180 + WINDOW)
    assert answer.verdict is A.WAIT and "4 new nodes needed an action within the last window" in answer.reason
    assert _assess(state, T + 730 + WINDOW).verdict is A.CLOSE  # it calmed down


def test_auto_close_off_or_a_recorded_decision_or_a_closed_breaker() -> None:
    state = _storm()
    off = _assess(state, T + 180 + WINDOW, policy=BreakerPolicy(auto_close=False))
    assert off.verdict is A.OFF and off.standing == "open until an operator resets it"
    recorded = breaker.needs_operator(state, now=T + 300, reason="node-1 failed again")
    assert recorded["version"] == state["version"] + 1
    again = _assess(recorded, T + 180 + WINDOW)
    assert again.verdict is A.OPERATOR and again.reason == "node-1 failed again"
    closed = _assess(breaker.new_state(), T)
    assert closed.verdict is A.NOT_TRIPPED and closed.standing == "closed"
    with pytest.raises(ValueError, match="auto_close_windows"):
        BreakerPolicy(auto_close_windows=0)


def test_an_item_from_before_auto_close_uses_its_window_as_the_nodes_it_acted_on() -> None:
    state = {k: v for k, v in _storm().items() if k != "tripped_nodes"}
    assert breaker.acted_on_nodes(state) == ("node-0", "node-1", "node-2")
