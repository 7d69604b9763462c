"""Pure admission rules: gang per node, eligibility, head-of-line reservation, determinism."""

from __future__ import annotations

import random

import pytest

from gpu_recovery.constants import InstanceState, queue_order
from gpu_recovery.queue.admission import (
    Admitter,
    Candidate,
    FailureKind,
    Node,
    Verdict,
    admit,
    backoff_seconds,
    classify_failure,
    holds_in_backoff,
    node_ineligibility,
)


def nodes(**free: int) -> list[Node]:
    return [Node(name, gpus, 8) for name, gpus in free.items()]


def by_job(decisions):
    return {d.job_id: d for d in decisions}


def test_priority_then_fifo_order_of_the_queue_index():
    """Given jobs of several priorities and submit times
    When they are sorted by the queue index key
    Then higher priority comes first and equal priority is first come first served."""
    jobs = [("low-early", 0, 1.0), ("high-late", 50, 9.0), ("normal-2", 20, 3.0), ("normal-1", 20, 2.0)]
    ordered = sorted(jobs, key=lambda j: queue_order(j[1], j[2], j[0]))
    assert [j[0] for j in ordered] == ["high-late", "normal-1", "normal-2", "low-early"]


def test_admits_in_queue_order_until_capacity_runs_out():
    """Given two free 8-GPU nodes and three 1x8 jobs in queue order
    When admission runs
    Then the first two are admitted and the third is blocked."""
    decisions = by_job(admit([Candidate("a", 1, 8), Candidate("b", 1, 8), Candidate("c", 1, 8)],
                             nodes(n1=8, n2=8)))
    assert decisions["a"].verdict is Verdict.ADMITTED
    assert decisions["b"].verdict is Verdict.ADMITTED
    assert "c" not in decisions or decisions["c"].verdict is not Verdict.ADMITTED


def test_sixteen_free_gpus_as_4_4_4_4_do_not_admit_a_2x8_job():
    """Given 16 free GPUs spread 4+4+4+4 over four nodes
    When a 2x8 job is offered
    Then it is not admitted: the total is not enough, each rank needs its own node."""
    [decision] = admit([Candidate("big", 2, 8)], nodes(a=4, b=4, c=4, d=4))
    assert decision.verdict is Verdict.BLOCKED
    assert decision.nodes and len(decision.nodes) == 2  # reserved, not placed


def test_gang_is_all_or_nothing_and_ranks_get_distinct_nodes():
    """Given one node with 16 free GPUs and one with 8
    When a 2x8 job is offered
    Then it gets two distinct nodes (never two ranks on one node)."""
    [decision] = admit([Candidate("j", 2, 8)], [Node("big", 16, 16), Node("small", 8, 8)])
    assert decision.verdict is Verdict.ADMITTED
    assert sorted(decision.nodes) == ["big", "small"]
    [alone] = admit([Candidate("j", 2, 8)], [Node("big", 16, 16)])
    assert alone.verdict is not Verdict.ADMITTED


def test_gpus_given_earlier_in_the_tick_are_subtracted():
    """Given a node with 8 free GPUs
    When two 1x4 jobs and then a 1x1 job are offered
    Then both 1x4 jobs share the node and the 1x1 job finds it full."""
    decisions = admit([Candidate("a", 1, 4), Candidate("b", 1, 4), Candidate("c", 1, 1)], nodes(n=8))
    assert [d.verdict for d in decisions] == [Verdict.ADMITTED, Verdict.ADMITTED]  # then exhausted


@pytest.mark.parametrize(
    ("status", "connected", "state", "expected"),
    [
        ("ACTIVE", True, None, ""),
        ("ACTIVE", True, InstanceState.AVAILABLE, ""),
        ("DRAINING", True, None, "ecs status DRAINING"),
        ("ACTIVE", False, None, "agent disconnected"),
        ("ACTIVE", True, InstanceState.REBOOTING, "instance REBOOTING"),
        ("ACTIVE", True, InstanceState.QUARANTINED, "instance QUARANTINED"),
        ("ACTIVE", True, InstanceState.SUSPECT, "instance SUSPECT"),
        ("ACTIVE", True, InstanceState.HEALTH_CHECK_PENDING, "instance HEALTH_CHECK_PENDING"),
        ("ACTIVE", True, InstanceState.HEALTH_CHECKING, "instance HEALTH_CHECKING"),
    ],
)
def test_node_eligibility(status, connected, state, expected):
    """Given a node's ECS status, agent connection and instance-table state
    When eligibility is decided
    Then only ACTIVE, connected, AVAILABLE (or unknown) nodes may take ranks."""
    assert node_ineligibility(ecs_status=status, agent_connected=connected, instance_state=state) == expected


def test_ineligible_nodes_are_never_used_even_when_free():
    """Given a rebooting node with 8 free GPUs and an eligible node with 8
    When a 2x8 job and a 1x8 job are offered
    Then the 2x8 job is not admitted and the 1x8 job uses only the eligible node."""
    pool = [Node("rebooting", 8, 8, eligible=False, why_ineligible="instance REBOOTING"), Node("ok", 8, 8)]
    decisions = by_job(admit([Candidate("two", 2, 8), Candidate("one", 1, 8)], pool))
    assert decisions["two"].verdict is Verdict.TOO_LARGE
    assert decisions["one"].nodes == ("ok",)


def test_blocked_head_reserves_nodes_so_a_later_job_cannot_jump_ahead():
    """Given nodes A (8 free), B (4 free) and C (0 free), all 8-GPU nodes
    When a 2x8 head job (does not fit) is followed by a 1x4 job
    Then the head reserves A and B (most free GPUs) and the 1x4 job is not admitted."""
    decisions = by_job(admit([Candidate("head", 2, 8), Candidate("small", 1, 4)], nodes(A=8, B=4, C=0)))
    assert decisions["head"].verdict is Verdict.BLOCKED
    assert decisions["head"].nodes == ("A", "B")
    assert "small" not in decisions  # nothing unreserved has a free GPU: scan stopped


def test_later_job_backfills_nodes_the_head_could_never_use():
    """Given two 8-GPU nodes (one busy) and a 4-GPU node that is free
    When a 2x8 head job is blocked and a 1x4 job follows
    Then the 1x4 job starts on the 4-GPU node: the head could never use it."""
    pool = [Node("A", 8, 8), Node("B", 0, 8), Node("small", 4, 4)]
    decisions = by_job(admit([Candidate("head", 2, 8), Candidate("tiny", 1, 4)], pool))
    assert decisions["head"].verdict is Verdict.BLOCKED
    assert decisions["tiny"].verdict is Verdict.ADMITTED
    assert decisions["tiny"].nodes == ("small",)


def test_later_job_backfills_beyond_the_heads_reservation():
    """Given four 8-GPU nodes with 4, 4, 2 and 0 free GPUs
    When a 2x8 head is blocked (reserves the two 4-free nodes) and a 1x2 job follows
    Then the 1x2 job may use the 2-free node, which is outside the head's reservation."""
    decisions = by_job(admit([Candidate("head", 2, 8), Candidate("x", 1, 2)], nodes(a=4, b=4, c=2, d=0)))
    assert decisions["head"].nodes == ("a", "b")
    assert decisions["x"].nodes == ("c",)


def test_a_job_too_large_for_the_cluster_does_not_stall_the_queue():
    """Given a cluster of two 8-GPU nodes
    When a 4x8 job (can never fit) is followed by a 1x8 job
    Then the big job reserves nothing and the 1x8 job starts."""
    decisions = by_job(admit([Candidate("huge", 4, 8), Candidate("ok", 1, 8)], nodes(a=8, b=8)))
    assert decisions["huge"].verdict is Verdict.TOO_LARGE
    assert decisions["ok"].verdict is Verdict.ADMITTED


def test_best_fit_prefers_the_fullest_node_that_fits_ties_by_id():
    """Given nodes with 8, 2, 4 and 4 free GPUs
    When a 1x3 job is offered
    Then it takes a node with 4 free (fewest that fit), the smaller id first."""
    [d] = admit([Candidate("j", 1, 3)], nodes(n8=8, n2=2, n4b=4, n4a=4))
    assert d.nodes == ("n4a",)


def test_admission_is_deterministic_whatever_the_node_order():
    """Given the same nodes in random orders
    When the same queue is admitted
    Then the decisions are identical."""
    pool = [Node(f"n{i:02d}", random.Random(i).choice([0, 2, 4, 8]), 8) for i in range(20)]
    queue = [Candidate(f"j{i}", 1 + i % 3, [2, 4, 8][i % 3]) for i in range(12)]
    expected = admit(queue, pool)
    for seed in range(5):
        shuffled = list(pool)
        random.Random(seed).shuffle(shuffled)
        assert admit(queue, shuffled) == expected


def test_exhausted_when_no_unreserved_node_has_a_free_gpu():
    """Given one node with 8 free GPUs
    When a 1x8 job takes it
    Then the admitter reports exhausted (the scan can stop reading)."""
    admitter = Admitter({"n": Node("n", 8, 8)})
    assert not admitter.exhausted
    admitter.offer(Candidate("j", 1, 8))
    assert admitter.exhausted


@pytest.mark.parametrize(
    ("kwargs", "kind"),
    [
        ({"placement_reasons": ["RESOURCE:GPU"]}, FailureKind.INSUFFICIENT_RESOURCES),
        ({"placement_reasons": ["RESOURCE:CPU", "RESOURCE:MEMORY"]}, FailureKind.INSUFFICIENT_RESOURCES),
        ({"placement_reasons": ["AGENT"]}, FailureKind.INSUFFICIENT_RESOURCES),
        ({"placement_reasons": ["ATTRIBUTE"]}, FailureKind.USER_ERROR),
        ({"error_code": "ClientException", "error_message": "Unable to describe task definition."},
         FailureKind.USER_ERROR),
        ({"error_code": "ClientException", "error_message": "TaskDefinition is inactive"},
         FailureKind.USER_ERROR),
        ({"error_code": "InvalidParameterException", "error_message": "Container instance not found"},
         FailureKind.INSUFFICIENT_RESOURCES),
        ({"error_code": "ThrottlingException", "error_message": "Rate exceeded"}, FailureKind.UNKNOWN),
        ({"stop_code": "TaskFailedToStart",
          "stopped_reason": "CannotPullContainerError: pull image manifest has been retried"},
         FailureKind.USER_ERROR),
        ({"exit_code": 1, "gpu_fault": True}, FailureKind.GPU_FAULT),
        ({"node_lost": True}, FailureKind.NODE_LOST),
        ({"exit_code": 2, "stop_code": "EssentialContainerExited"}, FailureKind.RUNTIME_ERROR),
        ({}, FailureKind.UNKNOWN),
    ],
)
def test_classify_failure(kwargs, kind):
    """Given what ECS said about a failed start or a stopped task
    When it is classified
    Then only lack of resources is INSUFFICIENT_RESOURCES (the one retried kind)."""
    assert classify_failure(**kwargs) is kind


def test_backoff_doubles_from_60_seconds_to_10_minutes():
    """Given consecutive INSUFFICIENT_RESOURCES failures
    When the backoff is computed
    Then it is 60, 120, 240, 480 and then capped at 600 seconds."""
    assert [backoff_seconds(n) for n in range(1, 7)] == [60, 120, 240, 480, 600, 600]


def test_a_low_borrower_takes_a_lendable_spare_wholly_and_only_when_nothing_else_fits() -> None:
    """lend_spares: a LOW job may borrow a marked, wholly free spare (the whole node); other
    nodes first; a job that may not borrow never gets it; a partly used spare is not lent."""
    cluster = {"a": Node("a", 8, 8), "s": Node("s", 8, 8, spare=True, lendable=True),
               "p": Node("p", 4, 8, spare=True, lendable=True)}
    admitter = Admitter(cluster)
    assert admitter.offer(Candidate("normal", 1, 8, priority=10)).nodes == ("a",)
    assert admitter.offer(Candidate("normal2", 1, 4, priority=10)).verdict is Verdict.BLOCKED
    admitter = Admitter(cluster)
    assert admitter.offer(Candidate("low", 1, 4, borrows_spares=True)).nodes == ("a",)  # not a spare first
    taken = admitter.offer(Candidate("low2", 1, 2, borrows_spares=True))
    assert taken.nodes == ("a",)  # "a" still has 4 GPUs: best fit, no spare
    lent = admitter.offer(Candidate("low3", 1, 4, borrows_spares=True))
    assert lent.nodes == ("s",) and admitter.free["s"] == 0  # the whole spare, one job
    # "a" has 2 left, "s" is lent, "p" is a spare partly in use: not lent.
    assert admitter.offer(Candidate("low4", 1, 4, borrows_spares=True)).verdict is not Verdict.ADMITTED
    unmarked = Admitter({"s": Node("s", 8, 8, spare=True)})  # a spare no scheduler sees marked
    assert unmarked.offer(Candidate("low", 1, 8, borrows_spares=True)).verdict is not Verdict.ADMITTED


def test_only_a_jobs_first_back_off_in_a_row_holds_its_nodes():
    """A queued job keeps its nodes through its first back-off after a failed launch, not its later
    ones; an unreadable failure count holds nothing."""
    assert holds_in_backoff({}) and holds_in_backoff({"resource_failures": 1})
    assert not holds_in_backoff({"resource_failures": 2})
    assert not holds_in_backoff({"resource_failures": "many"})
