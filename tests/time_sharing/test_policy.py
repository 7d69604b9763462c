"""The pure time-sharing policy: quotas, AUTO, victims, demotion, and the tick planner."""

from __future__ import annotations

import pytest

from gpu_recovery.domain.time_sharing import (
    Preemptor,
    Priority,
    QuotaBook,
    QuotaEntry,
    RunningGang,
    choose_victims,
    demotion_due,
    may_preempt,
    parse_priority,
    resolve_auto_priority,
)
from gpu_recovery.queue.admission import Node
from gpu_recovery.queue.planner import QueuedJob, StepKind, TickPlanner

LOW, NORMAL, ABOVE, HIGH = (int(Priority.LOW), int(Priority.NORMAL), int(Priority.ABOVE_NORMAL),
                            int(Priority.HIGH))


def full(*names: str, gpus: int = 8) -> dict[str, int]:
    return {n: 0 for n in names}


def cap(*names: str, gpus: int = 8) -> dict[str, int]:
    return {n: gpus for n in names}


def gang(job: str, user: str, priority: int, started: float, *nodes: str, gpus: int = 8,
         preempted_for: str = "") -> RunningGang:
    return RunningGang(job, user, priority, started, {n: gpus for n in nodes}, preempted_for)


# ------------------------------------------------------------------------ victims
def test_same_user_same_priority_never_preempts():
    """Given alice's NORMAL job filling the cluster
    When another NORMAL job of alice's is blocked
    Then nothing is chosen (and a rule says so); bob's NORMAL job cannot either (not lower)."""
    running = [gang("a1", "alice", NORMAL, 100, "n1", "n2")]
    for user in ("alice", "bob"):
        p = Preemptor("a2", user, NORMAL, 2, 8)
        assert choose_victims(p, full("n1", "n2"), cap("n1", "n2"), running) is None
    assert not may_preempt(Preemptor("x", "alice", NORMAL, 1, 8), running[0])
    assert may_preempt(Preemptor("x", "alice", HIGH, 1, 8), running[0])


def test_victims_are_strictly_lower_priority_whole_gangs():
    """Given a LOW 2-node gang and a HIGH 2-node gang on a 4-node cluster
    When a HIGH 2-node job is blocked
    Then the LOW gang (both its ranks) is the victim, never the HIGH one."""
    running = [gang("low", "bob", LOW, 100, "n1", "n2"), gang("high", "carol", HIGH, 50, "n3", "n4")]
    choice = choose_victims(Preemptor("p", "alice", HIGH, 2, 8), full("n1", "n2", "n3", "n4"),
                            cap("n1", "n2", "n3", "n4"), running)
    assert choice is not None and choice.victims == ("low",) and choice.nodes_freed == 2


def test_fewest_nodes_freed_first_then_lowest_priority_then_most_recent():
    """Given a 4-node LOW gang, a 1-node BELOW_NORMAL gang and two 1-node LOW gangs
    When a HIGH 1-node job is blocked
    Then one 1-node gang is chosen (not the 4-node one, which frees 3 nodes more than needed);
    among them the LOW ones before BELOW_NORMAL, and of those the most recently started."""
    nodes = [f"n{i}" for i in range(7)]
    running = [gang("big-low", "bob", LOW, 300, "n0", "n1", "n2", "n3"),
               gang("one-below", "bob", int(Priority.BELOW_NORMAL), 400, "n4"),
               gang("one-low-old", "bob", LOW, 100, "n5"),
               gang("one-low-new", "bob", LOW, 200, "n6")]
    choice = choose_victims(Preemptor("p", "alice", HIGH, 1, 8), full(*nodes), cap(*nodes), running)
    assert choice is not None and choice.victims == ("one-low-new",) and choice.nodes_freed == 1


def test_victims_only_where_they_make_the_job_fit():
    """Given two LOW 1-node gangs on 8-GPU nodes holding 4 GPUs each, next to 4 free GPUs
    When a HIGH 1x8 job is blocked
    Then one gang whose node then has 8 free GPUs is enough."""
    running = [gang("a", "bob", LOW, 100, "n1", gpus=4), gang("b", "bob", LOW, 200, "n2", gpus=4)]
    choice = choose_victims(Preemptor("p", "alice", HIGH, 1, 8), {"n1": 4, "n2": 4}, cap("n1", "n2"),
                            running)
    assert choice is not None and choice.victims == ("b",)


def test_no_victims_when_nothing_lower_would_make_room():
    """Given a LOW gang on one of two full nodes and a HIGH gang on the other
    When a 2-node HIGH job is blocked
    Then suspending the LOW gang alone would not make it fit: nobody is suspended."""
    running = [gang("low", "bob", LOW, 100, "n1"), gang("high", "carol", HIGH, 50, "n2")]
    assert choose_victims(Preemptor("p", "alice", HIGH, 2, 8), full("n1", "n2"), cap("n1", "n2"),
                          running) is None


def test_jobs_already_suspending_for_it_count_first():
    """Given a LOW gang already being suspended for job p
    When p is offered again while it still cannot start
    Then no further victim is chosen: p waits for that one."""
    running = [gang("low", "bob", LOW, 100, "n1", "n2", preempted_for="p"),
               gang("other", "bob", LOW, 200, "n3", "n4")]
    choice = choose_victims(Preemptor("p", "alice", HIGH, 2, 8), full("n1", "n2", "n3", "n4"),
                            cap("n1", "n2", "n3", "n4"), running)
    assert choice is not None and choice.victims == () and choice.waiting_for == ("low",)


def test_a_gang_suspending_for_another_job_is_not_chosen_again():
    running = [gang("low", "bob", LOW, 100, "n1", preempted_for="other")]
    assert choose_victims(Preemptor("p", "alice", HIGH, 1, 8), full("n1"), cap("n1"), running) is None


# ------------------------------------------------------------------------- quotas
def test_quota_book_explicit_limit_default_and_unlimited():
    stored = {("alice", HIGH): QuotaEntry(4, 3)}
    book = QuotaBook({NORMAL: 8}, lambda s, p: stored.get((s, p)))
    assert book.refusal("alice", HIGH, 1) == ""
    assert "holds 3 of 4 node(s) at HIGH" in book.refusal("alice", HIGH, 2)
    assert book.limit("alice", NORMAL) == 8 and book.room("alice", NORMAL) == 8
    assert book.limit("alice", LOW) is None and book.refusal("alice", LOW, 10_000) == ""
    assert "at most 4 node(s) at HIGH" in book.never_fits("alice", HIGH, 5)
    book.charge("alice", HIGH, 1)
    assert book.refusal("alice", HIGH, 1) != ""


def test_auto_takes_the_highest_allowed_level_with_room():
    """Given alice with HIGH 2 (2 in use), ABOVE_NORMAL 4 (0 in use), NORMAL unlimited
    When she submits a 2-node job with priority AUTO, VERY_HIGH not allowed to her
    Then it runs at ABOVE_NORMAL; with no finite quota with room, NORMAL."""
    stored = {("alice", HIGH): QuotaEntry(2, 2), ("alice", ABOVE): QuotaEntry(4, 0),
              ("alice", int(Priority.VERY_HIGH)): QuotaEntry(10, 0)}
    book = QuotaBook({}, lambda s, p: stored.get((s, p)))
    allowed = [p for p in map(int, Priority) if p < int(Priority.VERY_HIGH)]
    level, why = resolve_auto_priority(book, "alice", 2, allowed)
    assert level == ABOVE and "ABOVE_NORMAL" in why
    assert resolve_auto_priority(book, "alice", 5, allowed)[0] == NORMAL
    assert resolve_auto_priority(QuotaBook(), "bob", 1, allowed)[0] == NORMAL


def test_demotion_only_above_normal_after_the_threshold():
    assert demotion_due(ABOVE, 0.0, 1800.0, 1800)
    assert not demotion_due(ABOVE, 0.0, 1799.0, 1800)
    assert not demotion_due(HIGH, 0.0, 10_000.0, 1800)
    assert not demotion_due(ABOVE, 0.0, 10_000.0, 0)
    assert not demotion_due(ABOVE, None, 10_000.0, 1800)


@pytest.mark.parametrize("raw,value", [("high", 30), ("LOW", 0), (20, 20), ("40", 40)])
def test_parse_priority(raw, value):
    assert parse_priority(raw) == value


@pytest.mark.parametrize("raw", ["AUTO", "urgent", 7, True, "-1"])
def test_parse_priority_rejects(raw):
    with pytest.raises(ValueError):
        parse_priority(raw)


# ------------------------------------------------------------------------ planner
def planner(free: dict[str, int], running: list[RunningGang], quotas: QuotaBook | None = None
            ) -> TickPlanner:
    nodes = {n: Node(n, f, 8) for n, f in free.items()}
    return TickPlanner(nodes, quotas or QuotaBook(), lambda below: running)


def test_planner_refuses_over_quota_without_reserving_or_preempting():
    """Given bob over his HIGH quota and a LOW gang on the only node
    When bob's HIGH job is offered
    Then it waits for quota (no victim, no reservation) and a later job may still start."""
    book = QuotaBook({HIGH: 1}, lambda s, p: QuotaEntry(None, 1) if (s, p) == ("bob", HIGH) else None)
    plan = planner({"n1": 0, "n2": 8}, [gang("low", "carol", LOW, 100, "n1")], book)
    step = plan.offer(QueuedJob("b", "bob", HIGH, 1, 8))
    assert step.kind is StepKind.QUOTA and not plan.admitter.reserved
    assert plan.offer(QueuedJob("c", "carol", NORMAL, 1, 8)).kind is StepKind.ADMIT


def test_planner_preempts_once_and_never_twice_for_the_same_room():
    """Given one LOW gang on a full 2-node cluster
    When two HIGH 2-node jobs are offered in the same tick
    Then the first preempts the gang; the second preempts nothing (those nodes are the first's)."""
    plan = planner({"n1": 0, "n2": 0}, [gang("low", "carol", LOW, 100, "n1", "n2")])
    first = plan.offer(QueuedJob("h1", "alice", HIGH, 2, 8))
    assert first.kind is StepKind.PREEMPT and first.victims == ("low",)
    second = plan.offer(QueuedJob("h2", "bob", HIGH, 2, 8))
    assert second.kind is not StepKind.PREEMPT and second.victims == ()


def test_planner_charges_the_quota_of_each_admission_in_the_tick():
    book = QuotaBook({LOW: 2})
    plan = planner({"n1": 8, "n2": 8, "n3": 8}, [], book)
    assert plan.offer(QueuedJob("a", "alice", LOW, 2, 8)).kind is StepKind.ADMIT
    assert plan.offer(QueuedJob("b", "alice", LOW, 1, 8)).kind is StepKind.QUOTA
    assert plan.offer(QueuedJob("c", "bob", LOW, 1, 8)).kind is StepKind.ADMIT


def test_a_job_held_through_its_back_off_reserves_its_nodes_without_taking_or_preempting():
    """Given three free 8-GPU nodes and a 2x8 job backing off (held), then two 1x8 jobs
    When the planner holds the first and offers the others
    Then the held job's two nodes are reserved (none of their GPUs taken, no quota charged, no
    victim sought): one 1x8 job starts on the third node, the other is blocked; a held job over
    its quota reserves nothing."""
    nodes = {n: Node(n, 8, 8) for n in ("n1", "n2", "n3")}
    book = QuotaBook({NORMAL: 2})
    victims_sought: list[object] = []
    planner = TickPlanner(nodes, book, lambda priority: victims_sought.append(priority) or [],
                          preemption=True)
    held = planner.hold(QueuedJob("held", "alice", NORMAL, 2, 8))
    assert sorted(held) == ["n1", "n2"] and planner.admitter.free == {"n1": 8, "n2": 8, "n3": 8}
    assert victims_sought == []
    assert book.refusal("alice", NORMAL, 2) == ""  # nothing charged
    assert planner.offer(QueuedJob("next", "bob", NORMAL, 1, 8)).nodes == ("n3",)
    assert planner.offer(QueuedJob("last", "bob", NORMAL, 1, 8)).kind is StepKind.BLOCKED
    over = TickPlanner(nodes, QuotaBook({NORMAL: 1}))
    assert over.hold(QueuedJob("held", "alice", NORMAL, 2, 8)) == ()
    assert over.offer(QueuedJob("next", "bob", NORMAL, 1, 8)).kind is StepKind.ADMIT


def test_a_held_job_looks_for_no_victim_where_a_lower_gang_holds_its_nodes():
    """Given two busy nodes held by a LOW gang and a HIGH 2x8 job backing off (held)
    When the planner holds it
    Then the two nodes are reserved for it and no victim is sought (it starts nothing)."""
    victims_sought: list[int] = []

    def running_below(priority: int) -> list[RunningGang]:
        victims_sought.append(priority)
        return [gang("low", "carol", LOW, 0.0, "n1", "n2")]

    busy = TickPlanner({n: Node(n, 0, 8) for n in ("n1", "n2")}, QuotaBook(), running_below,
                       preemption=True)
    assert sorted(busy.hold(QueuedJob("held", "alice", HIGH, 2, 8))) == ["n1", "n2"]
    assert victims_sought == []
