"""One fault, one diagnosis (issue 50, ``domain.suspects``), end to end under the emulator: a
24-rank gang on 26 nodes, one GPU fault, its NCCL peers exiting 1 within seconds, before the
stack's stops reach them (EventBridge's delivery of the stops is late here, as it is when
many events arrive at once). The stack checks the first exits and the nodes with evidence of
their own, not every rank that followed."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from gpu_recovery import constants as C
from local_mode.remediation_scenarios import MIN, world

RANKS = 24
FAULTY = "node-07"


def _late_task_stops(seconds: float) -> Any:
    """Every training task's STOPPED event reaches the stack ``seconds`` late (not the
    health checks'), so a cascade's peers exit on their own before they are stopped."""
    def delay(event: dict[str, Any]) -> float:
        detail = event.get("detail") or {}
        return seconds if event.get("detail-type") == "ECS Task State Change" and \
            detail.get("lastStatus") == "STOPPED" and \
            not str(detail.get("group", "")).startswith(C.HEALTH_CHECK_GROUP) else 0.0
    return delay


def _gang(w: Any) -> list[str]:
    nodes = [f"node-{i:02d}" for i in range(RANKS + 2)]
    for node in nodes:
        w.ecs.add_node(node)
    w.ecs.start_job("big", w.training_task_definition, nodes[:RANKS])
    return nodes


def _nccl_delays(seed: int) -> Any:
    rng = random.Random(seed)
    return lambda: rng.uniform(2.0, 6.0)  # each peer's NCCL error, seconds after the fault


def test_a_single_gpu_fault_in_a_24_rank_gang_runs_at_most_two_checks_without_the_node_agent() -> None:
    """Given 24 ranks, node-07's GPU failing (DCGM: reboot) and its 23 peers exiting 1 two to
    six seconds later, every STOPPED event delivered 10 s late
    When the stack recovers the job
    Then it runs at most two DCGM checks (the faulty node's and the first peer's), reboots
    node-07 once and no other node, and the job runs again on attempt 2."""
    with world() as w:
        nodes = _gang(w)
        w.ecs.delivery_delay = _late_task_stops(10.0)
        w.ecs.inject_gpu_fault(FAULTY, after=MIN, health="reboot_fixable", nccl_cascade=True,
                               cascade_delay_seconds=_nccl_delays(1))  # type: ignore[arg-type]
        w.ecs.run_for(2 * MIN)
        w.ecs.delivery_delay = None
        w.ecs.run_for(20 * MIN)
        assert w.ecs.counters["health_checks_started"] <= 2, w.ecs.counters
        assert w.ecs.node(FAULTY).reboots == 1
        assert all(w.ecs.node(n).reboots == 0 for n in nodes if n != FAULTY)
        job = w.job("big")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2), job.get("history")
        assert not w.bus.dead_letters


def test_with_the_node_agent_the_node_that_reported_the_xid_is_checked_and_at_most_one_more() -> None:
    """Given the same gang, node-07's driver logging XID 142 (the catalog asks the diag for
    it), which its node agent reports before the ranks crash
    When the stack recovers the job
    Then node-07 is checked (its evidence) with at most one peer, and rebooted."""
    with world() as w:
        _gang(w)
        w.ecs.delivery_delay = _late_task_stops(10.0)
        w.ecs.inject_xid(FAULTY, 142, after=MIN, health="reboot_fixable", nccl_cascade=True)
        w.ecs.run_for(2 * MIN)
        w.ecs.delivery_delay = None
        w.ecs.run_for(20 * MIN)
        assert w.ecs.counters["health_checks_started"] <= 2, w.ecs.counters
        assert w.ecs.node(FAULTY).reboots == 1
        assert (w.job("big")["job_state"], w.job("big")["attempt"]) == ("RUNNING", 2)


PAIR = ("node-a", "node-b", "node-d")  # node-b's GPU fails, node-d's a second later


def _two_faults_held(w: Any) -> Any:
    """The 3-rank gang on PAIR: node-b's GPU fails (node-a's NCCL exit 3 s later), node-d's a
    second after node-b's; the three STOPPED events held back (returned) until delivered."""
    for node in PAIR:
        w.ecs.add_node(node)
    w.ecs.start_job("pair", w.training_task_definition, list(PAIR))
    held = w.hold_training_stops()
    w.ecs.inject_gpu_fault("node-b", after=MIN, health="reboot_fixable", nccl_cascade=True,
                           cascade_delay_seconds=3)
    w.ecs.inject_gpu_fault("node-d", after=MIN + 1, health="reboot_fixable")
    w.ecs.run_until_true(lambda: len(held.events) == len(PAIR), max_seconds=5 * MIN)
    return held


@pytest.mark.parametrize("order", list(itertools.permutations(PAIR)), ids="-".join)
def test_two_faults_a_second_apart_are_both_caught_in_every_order_their_stops_are_handled(
        order: tuple[str, ...]) -> None:
    """Given a 3-rank gang, node-b's GPU failing, node-d's a second later (an independent
    fault; both: reboot), node-a's rank exiting 3 s after node-b's (the NCCL error), and the
    three STOPPED events held back, then handled in ``order`` (as when a delivery dies and
    Lambda retries it after the others)
    When the stack recovers the job
    Then node-b and node-d are both checked and rebooted before the job's attempt 2 starts on
    them, node-a is not rebooted, and at most three checks ran (two when the faults' own
    exits are handled first)."""
    with world() as w:
        held = _two_faults_held(w)
        held.deliver(order)
        w.ecs.run_until_true(lambda: w.job("pair").get("job_state") == "RUNNING"
                             and int(w.job("pair").get("attempt") or 0) == 2, max_seconds=20 * MIN)
        assert (w.ecs.node("node-b").reboots, w.ecs.node("node-d").reboots) == (1, 1)
        assert w.ecs.node("node-a").reboots == 0
        bad = [p for p in w.ecs.placements if p.training and p.health != "healthy"]
        assert bad == [], bad
        checks = w.ecs.counters["health_checks_started"]
        assert checks <= (2 if set(order[:2]) == {"node-b", "node-d"} else 3), w.ecs.counters


def test_a_fault_whose_stop_arrives_after_another_node_s_verdict_moved_the_job_on_is_checked() -> None:
    """Given node-b's GPU failing and node-d's a second later (both: reboot), node-d's STOPPED
    event arriving only after node-b's REBOOT verdict moved the job to PENDING_RESTART (its
    deliveries died until then)
    When it is handled
    Then node-d is named a suspect and checked (rebooted) before attempt 2 starts: the late
    exit's own fault is never left unchecked because the job was already past its checks."""
    with world() as w:
        held = _two_faults_held(w)
        late = held.events.pop("node-d")
        held.deliver(["node-b", "node-a"])
        w.ecs.run_until_true(lambda: w.job("pair").get("job_state") == "PENDING_RESTART",
                             max_seconds=10 * MIN)
        checked = sorted({p.node for p in w.ecs.placements if not p.training})
        assert "node-d" not in checked, "the premise: node-d not a suspect yet"
        held.events["node-d"] = late
        held.deliver(["node-d"])
        w.ecs.run_until_true(lambda: w.job("pair").get("job_state") == "RUNNING"
                             and int(w.job("pair").get("attempt") or 0) == 2, max_seconds=20 * MIN)
        assert (w.ecs.node("node-b").reboots, w.ecs.node("node-d").reboots) == (1, 1)
        bad = [p for p in w.ecs.placements if p.training and p.health != "healthy"]
        assert bad == [], bad
