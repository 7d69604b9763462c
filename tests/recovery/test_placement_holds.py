"""Spare and reserved holds with fakes of the ports (recovery.placement): the hold is an
intent committed first, its attribute put idempotently and confirmed after, finished by
the sweep when a call fails; a relocation's claim releases it; a released hold's attribute
goes. Each test fails without the behaviour it names."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain.relocation import SparePool
from gpu_recovery.recovery.reactions import RESERVE_FIRST_SECONDS
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.instances import Instances
from gpu_recovery.repository.jobs_and_ranks import JobsAndRanks
from gpu_recovery.repository.rank_events import RankEventRepository
from gpu_recovery.repository.registrations import RegistrationRepository
from tests.recovery.fakes import LostResponse, World, throttle_once, world


def _value(w: World, node: str) -> str | None:
    return w.ecs.unavailable(node)


def test_the_sweep_marks_the_spares_and_a_refused_put_is_finished_by_the_next_sweep() -> None:
    """Given spare_nodes=1 and two free nodes, When PutAttributes is throttled throughout
    the first sweep (its refresh's sync and its worklist pass), Then the hold is already
    committed (the queue and relocation see it) with its worklist member; the next sweep
    puts gpu-recovery.unavailable=spare and confirms."""
    with world(spare_nodes=SparePool(1)) as w:
        w.ecs.spare_nodes = ["n-1", "n-2"]
        # the refresh's batched sync, then the worklist pass's one node a call (tried twice)
        w.ecs.failures["put_attributes_many"] = ["refuse"]
        w.ecs.failures["put_attributes"] = ["refuse", "refuse"]
        w.service.sweep()
        read = w.repo.cordons.worklist()
        assert {n: h["why"] for n, h in read.holds.items()} == {"n-1": "spare"}
        assert list(read.pending) == ["n-1"] and _value(w, "n-1") is None
        w.advance(60)
        w.service.sweep()
        assert _value(w, "n-1") == "spare" and _value(w, "n-2") is None
        assert w.repo.cordons.worklist().pending == {}
        calls = len(w.ecs.attribute_calls) + len(w.ecs.hold_calls)
        w.advance(60)
        w.service.sweep()  # nothing changed: no call
        assert len(w.ecs.attribute_calls) + len(w.ecs.hold_calls) == calls


def test_a_released_hold_takes_its_attribute_off_and_the_pool_refills() -> None:
    """Given n-1 marked spare, When a relocation takes it (reserved for its job) and its
    restart is placed (the reservation released), Then n-1's attribute goes at once; as it
    is busy now, the pool refills with another free node in the same refresh."""
    with world(spare_nodes=SparePool(1)) as w:
        w.ecs.spare_nodes = ["n-1", "n-2"]
        w.service.sweep()
        assert _value(w, "n-1") == "spare"
        assert w.service.placement.reserve("j", ["n-1"]) == "holds_changed"
        assert _value(w, "n-1") == "reserved"
        w.ecs.spare_nodes = ["n-2"]  # n-1 runs the job's rank now: no longer listed free
        w.service.placement.after_restart("j")
        assert _value(w, "n-1") is None
        assert {n: h["why"] for n, h in w.repo.cordons.worklist().holds.items()} == {"n-2": "spare"}
        assert _value(w, "n-2") == "spare"


def test_a_sync_that_read_older_holds_does_not_confirm_a_newer_change() -> None:
    """Given a hold change committed after a sync read the worklist, Then that sync's
    confirmation does not remove the newer change's member (the revision moved): the sweep
    syncs it again."""
    with world(spare_nodes=SparePool(1)) as w:
        w.ecs.spare_nodes = ["n-1"]
        w.service.sweep()
        stale = w.repo.cordons.worklist()
        w.advance(1)
        assert w.repo.cordons.set_holds(stale, {"n-1": None}, w.now[0])
        members = w.repo.cordons.worklist().pending["n-1"]
        assert not w.repo.cordons.confirm_synced("n-1", None, members, applied=False, read=stale)
        assert list(w.repo.cordons.worklist().pending) == ["n-1"]
        assert w.service.reboots.cordons.sync("n-1") == "unmarked"  # the release, synced
        assert _value(w, "n-1") is None and w.repo.cordons.worklist().pending == {}


def test_a_sweep_reads_the_worklist_once_unless_its_refresh_changed_a_hold() -> None:
    """The sweep's one read of the worklist serves the holds' refresh and the attribute
    syncs; a refresh that wrote a hold (and its members) has it read again first, so the
    syncs never work from a read older than the sweep's own write."""
    with world(spare_nodes=SparePool(1)) as w:
        reads: list[int] = []

        def counted(real: Any) -> Any:
            def read() -> object:
                reads.append(1)
                return real()
            return read

        # The sweep's first read (with the breaker's item, one BatchGetItem), and any other.
        w.repo.cordons.worklist = counted(w.repo.cordons.worklist)  # type: ignore[method-assign]
        w.repo.breaker.worklist_and_state = counted(w.repo.breaker.worklist_and_state)  # type: ignore[method-assign]
        w.ecs.spare_nodes = ["n-1", "n-2"]
        assert w.service.sweep().detail["handled"]["holds_changed"] == 1
        changed = len(reads)
        assert _value(w, "n-1") == "spare"
        reads.clear()
        w.advance(60)
        assert w.service.sweep().detail["handled"]["holds_unchanged"] == 1
        assert len(reads) == 1 and changed >= 2


def test_a_sync_of_many_nodes_keeps_what_it_did_when_a_call_fails_midway() -> None:
    """Given a job's 250 nodes reserved at once, When ECS throttles the attribute puts after
    the 150th node (an invocation that cannot finish: the budget shared with a gang's stops),
    Then the nodes synced before the failing slice are confirmed (100 of them: a slice at a
    time), and only the rest is the sweep's to put again (150 nodes, not 250)."""
    nodes = [f"n-{i:03d}" for i in range(250)]
    with world() as w:
        w.ecs.hold_puts_left = 150
        assert w.service.placement.reserve("j", nodes) == "holds_changed"
        pending = w.repo.cordons.worklist().pending
        assert sorted(pending) == nodes[100:]
        assert all(_value(w, n) == "reserved" for n in nodes[:150]) and _value(w, nodes[150]) is None


@pytest.mark.parametrize("broken", ["node-a's confirmation lost", "the batched put throttled"])
def test_a_sync_that_fails_for_some_nodes_still_marks_the_others(broken: str) -> None:
    """Given three nodes to reserve, node-a once cordoned (synced alone: its deprecated
    attribute may be there), When one step of their sync fails (node-a's confirmation with its
    answer lost, or the others' batched put throttled), Then every node whose own calls did not
    fail carries ``reserved``, and only nodes whose step failed are left pending for the
    sweep: node-a's failure, first in line, left node-b and node-c unmarked until the sweep,
    which another scheduler beat (soak seed 6998 at 6 %)."""
    nodes = ["node-a", "node-b", "node-c"]
    with world() as w:
        w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: "node-a"}, set_fields={
            "ec2_instance_id": "i-node-a", "cordon_version": w.now[0] - 600}))
        if broken.startswith("node-a"):
            w.repo.fail_once("cordons.confirm_synced", "lose")
            marked, pending = nodes, []  # its confirmation executed: only its answer was lost
        else:
            w.ecs.failures["put_attributes_many"] = ["refuse"]
            marked, pending = ["node-a"], ["node-b", "node-c"]
        assert w.service.placement.reserve("j", nodes) == "holds_changed"
        assert [n for n in nodes if _value(w, n) == "reserved"] == marked
        assert sorted(w.repo.cordons.worklist().pending) == pending


@pytest.mark.parametrize("read", ["worklist", "get_instances"])
def test_a_syncs_read_that_fails_once_is_tried_again_at_once(monkeypatch: Any, read: str) -> None:
    """Given two nodes reserved for a relocation's restart (the holds committed), When the
    sync's read that follows fails once (the worklist's shards, or the nodes' items: one
    BatchGetItem each), Then the same call reads again and puts their attribute: after a
    relocation's claim, such a read spent the second of its reservation's two tries, and a
    user's scheduler placed a task on the target in the minute before the sweep put it (soak
    seed 7254 at 10 %)."""
    nodes = ["node-a", "node-b"]
    committed: list[bool] = []
    real_set_holds = CordonRepository.set_holds

    def set_holds(self: CordonRepository, *args: Any, **kwargs: Any) -> bool:
        committed.append(True)
        return real_set_holds(self, *args, **kwargs)

    monkeypatch.setattr(CordonRepository, "set_holds", set_holds)
    owner = CordonRepository if read == "worklist" else Instances
    with world() as w:
        failed = throttle_once(monkeypatch, owner, read, "BatchGetItem", armed=lambda: bool(committed))
        assert w.service.placement.reserve("j", nodes) == "holds_changed"
        assert failed == ["BatchGetItem"]
        assert all(_value(w, n) == "reserved" for n in nodes)
        assert w.repo.cordons.worklist().pending == {}


def test_the_sweeps_attribute_pass_leaves_the_rest_of_a_backlog_to_the_next_sweep() -> None:
    """Given 30 free nodes to mark spare whose batched sync is refused, When the sweep's time
    runs short during its attribute pass (one node a call), Then the pass stops with time
    left for the due steps (no timeout: nothing retried, nothing starved) and counts what it
    left; the next sweep goes on from there."""
    nodes = [f"n-{i:03d}" for i in range(30)]
    with world(spare_nodes=SparePool(30)) as w:
        w.ecs.spare_nodes = list(nodes)
        w.ecs.failures["put_attributes_many"] = ["refuse"]  # the refresh's batched sync

        def time_left() -> float:  # each attribute call costs two seconds of the invocation
            return 60.0 - 2 * len(w.ecs.attribute_calls)

        handled = w.service.sweep(time_left).detail["handled"]
        left = w.repo.cordons.worklist().pending
        assert 0 < len(left) < 30 and handled["sync_deferred"] == len(left)
        assert time_left() >= 30.0  # the due steps' share of the minute kept
        w.advance(60)
        w.service.sweep()
        assert w.repo.cordons.worklist().pending == {}
        assert all(_value(w, n) == "spare" for n in nodes)


@pytest.mark.parametrize("broken", ["worklist read lost", "commit lost", "put throttled"])
def test_a_faults_reservation_whose_call_fails_is_tried_again_before_its_stops_free_the_nodes(
        broken: str) -> None:
    """Given a two-node job, When a rank's fault is seen and the reservation of its nodes has
    one call fail (the worklist's read or the holds' commit with its answer lost, or the
    attributes' put throttled), Then the same invocation tries again at once: by the time its
    stops free the healthy node, that node carries ``reserved`` (the sweep's refresh, a minute
    on, would find another scheduler's task there), and its member is confirmed."""
    nodes = ["node-a", "node-b"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        if broken == "worklist read lost":
            w.repo.fail_once("cordons.worklist", "lose")
        elif broken == "commit lost":
            w.repo.fail_once("cordons.set_holds", "lose")
        else:
            w.ecs.failures["put_attributes_many"] = ["refuse"]
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert _value(w, "node-a") == "reserved" and _value(w, "node-b") == "reserved"
        assert w.repo.cordons.worklist().pending == {}
        assert not w.ecs.failures.get("put_attributes_many")


@pytest.mark.parametrize("then", ["redelivered, exit 1", "redelivered, exit 3", "node-a's hang reported"])
def test_a_fault_whose_first_delivery_died_after_its_commit_is_reserved_before_its_stop_is_sent(
        then: str) -> None:
    """Given a two-node job, When a rank's fault is committed (the job in recovery, its stop
    intent written; exit 1: a suspect's fault, exit 3: an application error's restart) and the
    delivery dies before it reserves the nodes (the commit's answer lost), Then whatever sends
    the stop next (the event redelivered, or the heartbeat reporting node-a's rank hung)
    reserves both nodes first: the stop frees node-a, and the sweep's refresh a minute on
    could find another scheduler's task there."""
    nodes = ["node-a", "node-b"]
    exit_code = 3 if "exit 3" in then else 1
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        w.repo.fail_once("rank_events.restart_in_place" if exit_code == 3 else "rank_events.enter_recovery",
                         "lose")
        with pytest.raises(LostResponse):
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=exit_code))
        assert w.repo.jobs.get_job("j").stop_fanout, "the premise: the stop intent committed"
        assert _value(w, "node-a") is None and arns[0] not in w.ecs.stop_calls
        at_stop = w.unavailable_at_stop(nodes)
        if then.startswith("redelivered"):
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=exit_code))
        else:
            w.service.report_suspected_fault("j", 1, "node-a", "rank 0 hung at step 7", 0)
        assert at_stop == {arns[0]: {"node-a": "reserved", "node-b": "reserved"}}


def test_a_faults_read_after_its_commit_that_fails_once_is_tried_again_before_the_nodes_are_freed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a two-node job whose rank 1 fails (exit 1), When the fault is committed (the job in
    recovery) and the job's read that follows it is throttled, Then the same delivery reads it
    again at once: both nodes reserved before the stop frees node-a, and no failure left for a
    redelivery a minute on (soak seed 7207: the delivery died there, and the peer's node, freed
    by its own NCCL exit, was taken by another job 53 s later)."""
    nodes = ["node-a", "node-b"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        enter_recovery, committed = RankEventRepository.enter_recovery, []

        def committing(self: RankEventRepository, *args: Any, **kwargs: Any) -> bool:
            committed.append(True)
            return enter_recovery(self, *args, **kwargs)

        monkeypatch.setattr(RankEventRepository, "enter_recovery", committing)
        failed = throttle_once(monkeypatch, JobsAndRanks, "get_job", "GetItem", lambda: bool(committed))
        at_stop = w.unavailable_at_stop(nodes)
        outcome = w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert committed and failed, "the premise: the read after the commit failed"
        assert outcome.action == "health_check_requested"
        assert at_stop == {arns[0]: {"node-a": "reserved", "node-b": "reserved"}}


@pytest.mark.parametrize(("owner", "read", "operation"), [
    (RegistrationRepository, "look_up_task", "Query"),  # the rank's lookup
    (JobsAndRanks, "get_job", "GetItem"),  # its job
    (Instances, "get_instance_item", "GetItem"),  # its node's evidence (soak seed 7219)
])
def test_a_faults_read_before_its_commit_that_fails_once_is_tried_again_before_its_freed_node_goes_unreserved(
        monkeypatch: pytest.MonkeyPatch, owner: type, read: str, operation: str) -> None:
    """Given a two-node job, When rank 1 fails (exit 1) and one of its delivery's reads before
    the fault's commit (its rank's, its job's, its node's item) is throttled the first time,
    Then the delivery reads it again at once: the fault is handled, both nodes reserved before
    the stop frees node-a, and node-b (freed by the failed rank itself) is not left unmarked
    until the event's redelivery a minute on."""
    nodes = ["node-a", "node-b"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        failed = throttle_once(monkeypatch, owner, read, operation)
        at_stop = w.unavailable_at_stop(nodes)
        outcome = w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert failed, f"the premise: the {read} read failed"
        assert outcome.action == "health_check_requested"
        assert at_stop == {arns[0]: {"node-a": "reserved", "node-b": "reserved"}}


def _in_converge() -> bool:
    """Is this call made while a stop converges (``TaskEvents._converge``: after its commit)?"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_converge":
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize(("owner", "read", "operation", "done"), [
    (FaultRepository, "get_suspect", "GetItem", "health_checks"),  # the failing node's suspect item
    (JobsAndRanks, "get_job", "GetItem", "ended"),  # the job, once every rank ended (soak seed 7241)
    (FaultRepository, "counted", "BatchGetItem", "ended"),  # then its tally's shards
])
def test_a_stops_read_after_its_commit_that_fails_once_is_tried_again_in_the_same_delivery(
        monkeypatch: pytest.MonkeyPatch, owner: type, read: str, operation: str, done: str) -> None:
    """Given a two-node job whose rank 1 fails (exit 1), When a read its stops make after their
    commit (the failing node's suspect item; the job and its tally's shards, once rank 0's stop
    ends the attempt) is throttled the first time, Then the delivery reads it again at once and
    finishes: the node's check requested, the attempt's end handled. Before, the delivery failed there: at
    6 % of calls failing such reads were where most dead-lettered stops died (soak seed 7241)."""
    nodes = ["node-a", "node-b"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        failed = throttle_once(monkeypatch, owner, read, operation, armed=_in_converge)
        outcomes = [w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))]
        w.now[0] += 3
        outcomes.append(w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=143)))
        assert failed, f"the premise: the {read} read failed"
        assert any(done in o.detail for o in outcomes), [o.detail for o in outcomes]


@pytest.mark.parametrize("by", ["a second suspect", "a coupled exit"])
def test_a_rank_exiting_on_its_own_after_its_jobs_fault_delivery_died_keeps_its_node_and_stops_the_rest(
        by: str) -> None:
    """Given a four-node job whose rank 1 fails (exit 1) and whose delivery dies after its
    commit (the answer lost: the job in recovery, its stop not sent, nothing reserved), When a
    peer exits on its own (NCCL: the next exit is a second suspect; the one after it, coupled,
    here after the suspect's own reservation could not put its attributes), Then that exit
    reserves the job's nodes (its own, freed, included) and sends the job's stop: the ranks
    still running are stopped with every node reserved. The fault's redelivery would have
    done it a minute on, when another scheduler's task could be on the freed node (soak seed
    7216 at 10 % of calls failing)."""
    nodes = ["node-a", "node-b", "node-c", "node-d"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        w.repo.fail_once("rank_events.enter_recovery", "lose")
        with pytest.raises(LostResponse):
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert _value(w, "node-b") is None and not w.ecs.stop_calls, "the premise: nothing reserved, stopped"
        at_stop = w.unavailable_at_stop(nodes)
        w.now[0] += 3
        if by == "a coupled exit":
            w.ecs.failures["put_attributes_many"] = ["refuse", "refuse"]
            suspect = w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
            assert suspect.action == "health_check_requested" and not at_stop and _value(w, "node-a") is None
            w.now[0] += 1
        first = 2 if by == "a coupled exit" else 0
        outcome = w.service.on_task_state_change(w.task_stopped(arns[first], exit_code=1))
        assert outcome.action == ("coupled_exit" if by == "a coupled exit" else "health_check_requested")
        assert all(_value(w, n) == "reserved" for n in nodes)
        assert set(at_stop) == {arns[r] for r in (2, 3) if r != first}
        assert all(seen == {n: "reserved" for n in nodes} for seen in at_stop.values())


def test_a_rank_exiting_while_its_jobs_reservation_is_being_put_leaves_it_and_the_stop_to_its_committer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a four-node job whose rank 1 fails (exit 1), When rank 0 exits on its own (a second
    suspect) while the fault's invocation is putting the nodes' attributes (its first call),
    Then rank 0's event puts none of them again and sends no stop, having read only its node's
    shard of the worklist: the fault's invocation puts every node once and then stops the ranks
    still running, every node reserved (2,048 tasks, every node checked: 360 PutAttributes
    calls repeated the committer's 26; 8,192: 40 s)."""
    from gpu_recovery.repository.cordons import CordonRepository

    reads: list[str] = []
    for name in ("worklist", "worklist_of"):
        real = getattr(CordonRepository, name)
        monkeypatch.setattr(CordonRepository, name,
                            lambda self, *a, _real=real, _name=name: reads.append(_name) or _real(self, *a))
    nodes = ["node-a", "node-b", "node-c", "node-d"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        at_stop = w.unavailable_at_stop(nodes)
        real_put = w.ecs.put_attributes_many
        seen: list[Any] = []

        def put_while_a_peer_exits(entries: Any) -> set[str]:
            if not seen:
                seen.append(None)
                w.advance(2)
                reads.clear()
                seen.append(w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1)))
                seen.append((dict(at_stop), list(w.ecs.hold_calls), list(reads)))  # asserted below
            return real_put(entries)  # (raised here, it would fail the put)

        w.ecs.put_attributes_many = put_while_a_peer_exits  # type: ignore[method-assign]
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert seen[1].action == "health_check_requested"
        assert seen[2] == ({}, [], ["worklist_of"]), "its event left the puts and the stop to the fault's"
        assert sorted(n for _, n, _ in w.ecs.hold_calls) == nodes  # each node put once
        assert set(at_stop) == {arns[2], arns[3]}
        assert all(seen == {n: "reserved" for n in nodes} for seen in at_stop.values())


def test_a_reservation_whose_committer_died_is_put_by_the_first_event_after_its_lease() -> None:
    """Given a four-node job whose fault's invocation committed the nodes' reservation and died
    before putting it (its lease not given back), When a peer exits on its own within
    SYNC_LEASE_SECONDS, Then it leaves the nodes and the stop (their committer may be at work);
    When another exits after the lease, Then that one puts every node and sends the stop: the
    ranks still running are stopped with every node reserved."""
    from gpu_recovery.domain.placement import SYNC_LEASE_SECONDS

    nodes = ["node-a", "node-b", "node-c", "node-d"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        at_stop = w.unavailable_at_stop(nodes)
        w.ecs.failures["put_attributes_many"] = ["refuse", "refuse"]
        w.repo.fail_once("cordons.stop_syncing", "refuse")  # its death: the lease stays
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert not at_stop and not w.ecs.hold_calls and w.repo.cordons.worklist().pending
        w.advance(3)
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
        assert not at_stop and not w.ecs.hold_calls
        w.advance(SYNC_LEASE_SECONDS)
        outcome = w.service.on_task_state_change(w.task_stopped(arns[2], exit_code=1))
        assert outcome.action == "coupled_exit"
        assert all(_value(w, n) == "reserved" for n in nodes)
        assert set(at_stop) == {arns[3]} and at_stop[arns[3]] == {n: "reserved" for n in nodes}


def test_a_rank_the_gang_stop_finds_by_its_tags_has_its_node_reserved_before_its_stop() -> None:
    """Given a three-node job whose rank 2's RUNNING event was lost (no rank item, not on the
    registered latch: its fault's reservation cannot know node-c), When rank 0 fails and the
    gang's stop finds rank 2 running by its tags and registers it, Then node-c is reserved for
    the job before rank 2's stop frees it (a minute's wait for the sweep's refresh let another
    scheduler take it: soak seed 6967 at 6 %)."""
    nodes = ["node-a", "node-b", "node-c"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        lost = w.lose_registration("j", 2, "node-c", world_size=3)
        at_stop = w.unavailable_at_stop(["node-c"])
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
        assert lost in at_stop, "the premise: rank 2 found by its tags and stopped"
        assert at_stop[lost] == {"node-c": "reserved"}


def test_a_relocation_whose_launch_was_not_sent_has_its_target_reserved_before_the_sweep() -> None:
    """Given a relocatable job on node-a and node-b, node-c free, When node-b's check says
    replace and the relocation's launch onto node-c is not sent (StartTask throttled), Then
    node-c carries ``reserved`` at once: chosen free, it had no attribute, and the sweep's
    refresh a minute on came after another scheduler took it (soak seed 7010 at 6 %)."""
    with world(relocation_wait_seconds=1800) as w:
        w.ecs.spare_nodes = ["node-c"]
        arns = w.register_job("j", ["node-a", "node-b"], tags={C.TAG_RELOCATABLE: "true"})
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [check] = w.ecs.health_checks_on("node-b")
        assert _value(w, "node-c") is None
        w.ecs.failures["start_task"] = ["refuse"] * 3
        w.service.on_health_check_stopped(w.health_check_stopped(check, 2))
        moves = w.repo.faults.placement("j", 2)
        assert {a: m["node"] for a, m in moves.items()} == {"node-b": "node-c"}, "the premise: relocated"
        assert not [t for t in w.ecs.tasks.values() if t.node == "node-c"], "the premise: not launched"
        assert _value(w, "node-c") == "reserved"


@pytest.mark.parametrize("seen", ["rank 1's stop", "rank 1's hang reported"])
@pytest.mark.parametrize("refused", ["at the event's two tries", "throughout"])
def test_a_faults_stop_waits_for_its_nodes_reservation_and_the_sweep_sends_it_reserved_first(
        refused: str, seen: str) -> None:
    """Given a two-node job, When a fault is seen (rank 1 exits 1, or the heartbeat reports it
    hung) and the attributes' put of its nodes'
    reservation is refused at both of the invocation's tries, Then its stop is not sent (node-a
    would be freed unmarked: soak seeds 7062 and 7067 at 6 %, where the sweep's own refresh
    failed too and another scheduler took the node); the sweep sends it once the nodes carry
    ``reserved``, and (the put refused on) after RESERVE_FIRST_SECONDS at most: the ranks do
    not wait for good."""
    nodes = ["node-a", "node-b"]
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", nodes)
        throughout = refused == "throughout"
        w.ecs.failures["put_attributes_many"] = ["refuse"] * (100 if throughout else 2)
        w.ecs.failures["put_attributes"] = ["refuse"] * (100 if throughout else 0)
        at_stop = w.unavailable_at_stop(nodes)
        if seen == "rank 1's stop":
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        else:
            w.service.report_suspected_fault("j", 1, "node-b", "rank 1 hung at step 7", 1)
        assert arns[0] not in w.ecs.stop_calls and _value(w, "node-a") is None
        waited = 0
        while arns[0] not in w.ecs.stop_calls and waited < 600:
            w.advance(60)
            waited += 60
            w.service.sweep()
        if not throughout:  # the sweep's sync put the attributes: stopped at its first pass
            expected, after = {"node-a": "reserved", "node-b": "reserved"}, 60
        else:  # every put refused: stopped unreserved, once the wait is over
            expected, after = {"node-a": None, "node-b": None}, RESERVE_FIRST_SECONDS
        assert waited == after and at_stop[arns[0]] == expected
        assert all(attributes == expected for attributes in at_stop.values())  # a hung rank 1's too


def test_a_sweep_whose_first_read_fails_is_tried_again_at_once_and_marks_the_nodes_that_minute() -> None:
    """Given a spare wanted and a free node, When the sweep's first read (the worklist with the
    breaker's item) fails once (its answer lost), Then the sweep reads it again at
    once and puts the node's attribute that minute: a node freed unmarked (a fault's
    reservation that failed) waited a minute more, and another scheduler took it (soak seeds
    7062 and 7063 at 6 %)."""
    with world(spare_nodes=SparePool(1)) as w:
        w.ecs.spare_nodes = ["n-1"]
        w.repo.fail_once("breaker.worklist_and_state", "lose")
        w.service.sweep()
        assert w.repo.armed() == [], "the premise: the first read failed"
        assert _value(w, "n-1") == "spare"


def test_a_sweep_whose_sync_of_a_node_fails_is_tried_again_at_once_and_marks_it_that_minute() -> None:
    """Given a spare wanted on a free node whose batched put was refused (the node pending),
    When the sweep's sync of that node has its put throttled once, Then the sweep tries it again
    at once and the node carries ``spare`` that minute: a node freed unmarked waited a minute
    more, and another scheduler took it (soak seed 7082 at 6 %: a fault's node, XID 79)."""
    with world(spare_nodes=SparePool(1)) as w:
        w.ecs.spare_nodes = ["n-1"]
        w.ecs.failures["put_attributes_many"] = ["refuse"]  # the refresh's batched sync
        w.ecs.failures["put_attributes"] = ["refuse"]  # the worklist pass's first try
        w.service.sweep()
        assert not w.ecs.failures["put_attributes"], "the premise: the node's own put refused once"
        assert _value(w, "n-1") == "spare" and w.repo.cordons.worklist().pending == {}


def test_a_node_two_recoveries_hold_stays_with_the_recovery_that_reserved_it_first() -> None:
    """Given job a in recovery on node-a and node-b (node-b's rank failed, both nodes reserved
    for a, node-a's rank stopped), and job b's rank on node-a (a user's scheduler placed it in
    the second before node-a's attribute was put: soak seeds 7201 and 7204 at 10 %), When b's
    rank fails and b's check is in first, Then node-a stays reserved for a (b's reservation
    does not take it over) and b's restart does not start its rank there: it waits, naming a's
    recovery; a's restart, its verdict in, takes node-a."""
    with world(max_app_restarts=1) as w:
        a = w.register_job("a", ["node-a", "node-b"])
        w.service.on_task_state_change(w.task_stopped(a[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            a[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        assert {n: h.get("job") for n, h in w.repo.cordons.worklist().holds.items()} == {
            "node-a": "a", "node-b": "a"}, "the premise: a's nodes reserved"
        [b] = w.register_job("b", ["node-a"])
        w.service.on_task_state_change(w.task_stopped(b, exit_code=1))
        assert w.repo.cordons.worklist().holds["node-a"].get("job") == "a"
        [check_b] = w.ecs.health_checks_on("node-a")
        w.service.on_health_check_stopped(w.health_check_stopped(check_b, 0))
        job_b = w.repo.jobs.get_job("b")
        assert job_b.state is C.JobState.PENDING_RESTART, job_b.state
        assert "reserved for the recovery of job a" in str(job_b.restart_wait)
        started = [t for t in w.ecs.tasks.values() if t.node == "node-a" and t.group != C.HEALTH_CHECK_GROUP
                   and t.started_by.startswith("gpurec")]
        assert not started, "b started a rank on a's node"
        [check_a] = w.ecs.health_checks_on("node-b")
        w.service.on_health_check_stopped(w.health_check_stopped(check_a, 0))
        job_a = w.repo.jobs.get_job("a")
        assert job_a.state in (C.JobState.STARTING, C.JobState.RUNNING), job_a.state
        assert {t.node for t in w.ecs.tasks.values() if t.last_status == "RUNNING"
                and t.group != C.HEALTH_CHECK_GROUP} >= {"node-a", "node-b"}


def test_a_relocatable_job_on_a_node_another_recovery_reserved_first_moves_off_it() -> None:
    """Given the same two recoveries, b relocatable and node-c free, When b's check is in
    first, Then b's restart moves its rank to node-c, not onto a's node-a."""
    with world(max_app_restarts=1, relocation_wait_seconds=1800) as w:
        w.ecs.spare_nodes = ["node-c"]
        a = w.register_job("a", ["node-a", "node-b"])
        w.service.on_task_state_change(w.task_stopped(a[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            a[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [b] = w.register_job("b", ["node-a"], tags={C.TAG_RELOCATABLE: "true"})
        w.service.on_task_state_change(w.task_stopped(b, exit_code=1))
        [check_b] = w.ecs.health_checks_on("node-a")
        w.service.on_health_check_stopped(w.health_check_stopped(check_b, 0))
        moves = w.repo.faults.placement("b", 2)
        assert {n: m["node"] for n, m in moves.items()} == {"node-a": "node-c"}
        assert "reserved for the recovery of job a" in str(w.repo.jobs.get_job_item("b"))
