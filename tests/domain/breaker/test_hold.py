"""A job held by the breaker (domain.breaker.hold) and the tally's held count: pure."""

from __future__ import annotations

import pytest

from gpu_recovery.domain.breaker.hold import (
    BreakerHold,
    HoldAction,
    NodeStanding,
    NodeView,
    backlog_nodes,
    holdable,
    judge_hold,
    standing,
)
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.state_machine import can_transition
from gpu_recovery.domain.states import (
    RECOVERING_JOB_STATES,
    InstanceState,
    JobOutcome,
    JobState,
    SuspectVerdict,
)

S = InstanceState
HELD_NODE = NodeView(S.SUSPECT, cordoned=True, held_action="reboot")
HOLD = BreakerHold.start("j", 1, 1000.0, 3600, ["n-2", "n-1"], spend="infrastructure", why="breaker tripped")


@pytest.mark.parametrize(("view", "in_backlog", "want"), [
    (NodeView(S.AVAILABLE), False, NodeStanding.BACK),
    (NodeView(S.AVAILABLE, cordoned=True), False, NodeStanding.IN_PROGRESS),
    (NodeView(S.REBOOTING), False, NodeStanding.IN_PROGRESS),
    (NodeView(S.HEALTH_CHECKING), False, NodeStanding.IN_PROGRESS),
    (HELD_NODE, True, NodeStanding.HELD),
    (HELD_NODE, False, NodeStanding.DROPPED),
    (NodeView(S.SUSPECT, held_action="replace"), True, NodeStanding.LOST),
    (NodeView(S.SUSPECT), False, NodeStanding.LOST),
    (NodeView(S.QUARANTINED), False, NodeStanding.LOST),
    (NodeView(None), False, NodeStanding.LOST),
])
def test_where_a_node_stands_for_a_held_job(view: NodeView, in_backlog: bool, want: NodeStanding) -> None:
    assert standing(view, in_backlog=in_backlog) is want


def test_a_job_may_wait_only_for_held_reboots_and_nodes_on_their_way_back() -> None:
    backlog = frozenset({"n-1"})
    assert holdable({"n-1": HELD_NODE, "n-2": NodeView(S.REBOOTING)}, backlog=backlog)
    assert not holdable({"n-1": HELD_NODE, "n-2": NodeView(S.QUARANTINED)}, backlog=backlog)
    assert not holdable({"n-1": NodeView(S.SUSPECT, held_action="replace")}, backlog=backlog)


def test_the_hold_waits_then_resumes_once_every_node_is_back() -> None:
    backlog = frozenset({"n-1", "n-2"})
    waiting = judge_hold(HOLD, {"n-1": HELD_NODE, "n-2": NodeView(S.REBOOTING)}, backlog=backlog, now=2000)
    assert waiting.action is HoldAction.WAIT and waiting.reason.startswith("held: waiting up to 3600 s")
    back = judge_hold(HOLD, {"n-1": NodeView(S.AVAILABLE), "n-2": NodeView(S.AVAILABLE)}, backlog=frozenset(),
                      now=2000)
    assert back.action is HoldAction.RESUME


def test_the_hold_fails_at_once_when_the_backlog_is_dropped_or_a_node_is_lost() -> None:
    dropped = judge_hold(HOLD, {"n-1": HELD_NODE, "n-2": HELD_NODE}, backlog=frozenset({"n-2"}), now=2000,
                         reset_by="oncall")
    assert dropped.action is HoldAction.FAIL
    assert dropped.reason.startswith("the blast-radius breaker's backlog was dropped by oncall")
    assert "nothing will reboot n-1" in dropped.reason
    lost = judge_hold(HOLD, {"n-1": NodeView(S.QUARANTINED), "n-2": HELD_NODE}, backlog=frozenset({"n-2"}),
                      now=2000)
    assert lost.action is HoldAction.FAIL and lost.reason.startswith("n-1, whose reboot the blast-radius")
    assert "is QUARANTINED now" in lost.reason


def test_the_hold_fails_at_its_deadline_unless_every_node_is_back() -> None:
    held = {"n-1": HELD_NODE, "n-2": HELD_NODE}
    backlog = frozenset({"n-1", "n-2"})
    assert judge_hold(HOLD, held, backlog=backlog, now=4599).action is HoldAction.WAIT
    late = judge_hold(HOLD, held, backlog=backlog, now=4600)
    assert late.action is HoldAction.FAIL
    assert late.reason.startswith("held 3600 s (held_job_deadline_seconds)")
    assert "reboot of n-1, n-2" in late.reason


def test_a_hold_round_trips_through_its_item_and_belongs_to_one_attempt() -> None:
    item = HOLD.to_item()
    assert BreakerHold.from_item("j", item, 1) == HOLD
    assert BreakerHold.from_item("j", item, 2) is None
    assert BreakerHold.from_item("j", {"attempt": 1, "spend": "infrastructure"}, 1) is None  # budget only
    assert BreakerHold.from_item("j", {**item, "resumed_at": 3000}, 1).resumed_at == 3000  # type: ignore[union-attr]


def test_the_backlog_counts_held_and_released_entries() -> None:
    item = {"backlog": [{"node": "n-1"}], "released": {"n-2": {"node": "n-2"}}}
    assert backlog_nodes(item) == frozenset({"n-1", "n-2"}) and backlog_nodes(None) == frozenset()


def test_a_held_reboot_holds_a_job_that_cannot_move_and_relocates_one_that_can() -> None:
    tally = FaultTally(attempt=1, total=2).with_verdict(SuspectVerdict.BLOCKED, held=True)
    assert (tally.fatal, tally.held) == (1, 1)
    assert tally.outcome(relocatable=False) is JobOutcome.HOLD
    assert tally.outcome(relocatable=True) is JobOutcome.RELOCATE
    # A node lost for good beside it: the job cannot wait for that one.
    worse = tally.with_verdict(SuspectVerdict.REPLACE)
    assert worse.outcome(relocatable=False) is JobOutcome.FAIL_NODE_FAULT
    # Observe mode's BLOCKED is not a hold.
    observed = FaultTally(attempt=1).with_verdict(SuspectVerdict.BLOCKED)
    assert observed.outcome(relocatable=False) is JobOutcome.FAIL_NODE_FAULT
    assert FaultTally.from_item(tally.to_item()) == tally


def test_held_is_a_recovering_state_with_its_own_ways_out() -> None:
    assert JobState.HELD in RECOVERING_JOB_STATES and not JobState.HELD.is_terminal
    assert can_transition(JobState.PENDING_RESTART, JobState.HELD)
    assert can_transition(JobState.HELD, JobState.PENDING_RESTART)
    assert can_transition(JobState.HELD, JobState.FAILED)
    assert not can_transition(JobState.HELD, JobState.STARTING)
    assert not can_transition(JobState.PENDING_HEALTHCHECK, JobState.HELD)
