"""Issue 51 with the stages' fakes: AWS's notice that a node goes away (a Spot or reservation
interruption, a Capacity Block's end, scheduled maintenance, a rebalance recommendation) takes the
node out of placement at once (its own ``aws-notice`` cordon), asks each queue job on it to
checkpoint and move before the deadline (stopped by it otherwise), and handles duplicate and
foreign events. The whole flow, broken at every call: local_mode/campaigns/aws_notices.py."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from gpu_recovery import constants as C
from gpu_recovery.domain import aws_notices as n
from gpu_recovery.domain.placement import NOTICE, UNAVAILABLE_ATTRIBUTE
from gpu_recovery.repository import Update
from local_mode.sim.aws_notices import notice_event
from tests.recovery.fakes import REGION, World, throttled, world
from tests.recovery.remediation_steps import sweeps

NODE, PEER, IDLE = "node-b", "node-a", "node-c"
JobState, Kind = C.JobState, C.NotificationKind


def notify(w: World, kind: str, node: str = NODE, **options: Any) -> dict[str, Any]:
    event, _deadline = notice_event(kind, now=w.now[0], region=REGION, account="123456789012",
                                    instance_id=f"i-{node}", **options)
    return w.service.on_aws_notice(event).as_dict() | {"event": event}


def mails(w: World) -> list[Any]:
    return [m for m in w.notifier.sent if m.kind is Kind.CAPACITY_NOTICE]


class Block:
    """The EC2 side of a Capacity Block: its reservation's instances."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.calls = 0

    def instances_in(self, reservation_id: str) -> list[str]:
        self.calls += 1
        return [f"i-{node}" for node in self.nodes]


def test_a_spot_warning_cordons_the_node_at_once_and_asks_its_queue_job_to_move_in_time() -> None:
    with world() as w:
        w.register_queue_job("train", [PEER, NODE])
        done = notify(w, "spot_interruption")
        assert done["action"] == "aws_notice"
        instance = w.repo.instances.get_instance(NODE)
        assert instance.cordoned and instance.cordon["notice"]
        assert instance.notice["kind"] == "spot_interruption"
        assert w.ecs.attribute_values[NODE][UNAVAILABLE_ATTRIBUTE] == NOTICE
        job = w.repo.jobs.get_job("train")
        assert job.state is JobState.SUSPENDING and job.suspend["kind"] == "moved"
        # Until the stop margin before the deadline (two minutes from the warning).
        assert job.suspend["grace_seconds"] == n.SPOT_WARNING_SECONDS - n.STOP_MARGIN_SECONDS
        assert job.suspend["avoid"]["force"] is True
        [mail] = mails(w)
        assert "spot interruption" in mail.subject and NODE in mail.body
        assert not w.repo.instances.get_instance(PEER).cordoned  # only the announced node


def test_a_duplicate_or_replayed_notice_changes_nothing_more() -> None:
    with world() as w:
        w.register_queue_job("train", [PEER, NODE])
        event = notify(w, "spot_interruption")["event"]
        before = (w.repo.instances.get_instance_item(NODE)["notice"], w.repo.jobs.get_job("train").suspend)
        again = w.service.on_aws_notice({**event, "id": "another-delivery"}).as_dict()
        assert again["nodes"] == {NODE: "notice_again"}
        notice = w.repo.instances.get_instance_item(NODE)["notice"]
        assert (notice, w.repo.jobs.get_job("train").suspend) == before
        assert len(mails(w)) == 1


def test_a_notice_for_an_instance_of_no_node_of_this_cluster_writes_nothing() -> None:
    with world() as w:
        w.register_queue_job("train", [PEER, NODE])
        done = notify(w, "spot_interruption", node="elsewhere")
        assert done["action"] == "aws_notice_no_node_of_this_cluster"
        assert w.repo.instances.get_instance("elsewhere") is None and not mails(w)
        assert w.repo.jobs.get_job("train").state is JobState.RUNNING


def test_a_job_that_does_not_checkpoint_in_time_is_stopped_before_the_deadline_spending_nothing() -> None:
    with world() as w:
        arns = w.register_queue_job("train", [PEER, NODE])
        notify(w, "spot_interruption")
        sweeps(w, 1, every=n.SPOT_WARNING_SECONDS - n.STOP_MARGIN_SECONDS)  # no go_suspend() by then
        assert w.repo.jobs.get_job("train").suspend.get("stop_requested_at")  # not declined: stopped
        assert set(w.ecs.stop_calls) >= set(arns)
        w.stopped_by_the_stack(arns)
        job = w.repo.jobs.get_job_item("train")
        assert job["job_state"] == JobState.SUSPENDED.value
        assert [m["outcome"] for m in job["moves"]] == ["stopped_at_deadline"]
        assert not int(job.get("recoveries_used") or 0)
        assert C.RELOCATED_QUEUE_MARK in str(job.get(C.QUEUE_SK))  # at the head of its priority
        assert "waiting for capacity: Spot interruption" in str(job["history"][-1])


def test_a_capacity_block_warning_maps_its_reservation_to_nodes_and_drains_the_idle_one_too() -> None:
    with world(spare_nodes=0) as w:
        w.register_queue_job("train", [PEER, NODE])
        w.ecs.spare_nodes = [IDLE]
        block = Block([NODE, IDLE])
        w.service.aws_notices.capacity = block
        done = notify(w, "capacity_block_expiry", reservation_id="cr-0123456789abcdef0")
        assert block.calls == 1 and set(done["nodes"]) == {NODE, IDLE}
        idle = w.repo.instances.get_instance(IDLE)
        assert idle.cordoned and idle.cordon["notice"] and idle.ec2_instance_id == f"i-{IDLE}"
        assert w.repo.jobs.get_job("train").state is JobState.SUSPENDING
        assert any("no job runs on it" in m.body for m in mails(w))
        # The block's nodes are due for the sweep, which drains both in ECS (the busy one's ranks
        # keep running until they move); the instance monitor itself takes no node action.
        assert w.ecs.drained == []
        assert all(w.repo.instances.get_instance(node).deadline_at <= w.now[0] + C.NOTICE_RETRY_SECONDS
                   for node in (NODE, IDLE))
        w.advance(C.NOTICE_RETRY_SECONDS)
        w.service.sweep()
        assert sorted(a.rsplit("/", 1)[-1] for a in w.ecs.drained) == sorted([NODE, IDLE])
        assert all(w.repo.instances.get_instance(node).notice.get("drained_at") for node in (NODE, IDLE))


@pytest.mark.parametrize("failures", [1, 2])
def test_a_node_whose_notice_write_failed_is_recorded_at_once_and_holds_back_no_other(failures: int) -> None:
    """Given a Capacity Block's warning for two nodes, When the first write for one is lost
    (executed, its answer never came), Then it is written again at once in the same delivery:
    until it is, the scheduler may still place work there. When it fails twice, the other node
    is recorded all the same and the delivery fails (EventBridge retries it); the retry records
    the rest."""
    with world(spare_nodes=0) as w:
        w.ecs.spare_nodes = [NODE, IDLE]
        w.service.aws_notices.capacity = Block([IDLE, NODE])  # IDLE is the first looked at
        real = w.repo.instances.put_instance_if_absent
        lost: list[str] = []

        def loses(instance: Any, *args: Any, **kwargs: Any) -> Any:
            done = real(instance, *args, **kwargs)
            if instance.container_inst_id == IDLE and len(lost) < failures:
                lost.append(IDLE)
                raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
            return done

        w.repo.instances.put_instance_if_absent = loses  # type: ignore[method-assign]
        if failures == 1:
            done = notify(w, "capacity_block_expiry", reservation_id="cr-0123456789abcdef0")
            assert set(done["nodes"]) == {NODE, IDLE}
        else:
            with pytest.raises(ReadTimeoutError):
                notify(w, "capacity_block_expiry", reservation_id="cr-0123456789abcdef0")
            nodes = w.repo.instances
            assert nodes.get_instance(NODE).cordoned and not nodes.get_instance(IDLE).cordoned
            notify(w, "capacity_block_expiry", reservation_id="cr-0123456789abcdef0")  # the retry
        nodes = w.repo.instances
        assert all(nodes.get_instance(node).cordon.get("notice") for node in (NODE, IDLE)), failures


def test_a_drain_ecs_did_not_confirm_is_owed_and_done_by_the_sweep() -> None:
    """Given a Capacity Block's warning for an idle node, When the sweep's drain is throttled,
    Then the notice (the intent) stands, the node stays due, and the next sweep drains it and
    records it; When the drain's answer is lost, the sweep drains again (idempotent) and records it.
    Other notices (a Spot warning) do not drain: the instance may be replaced or come back."""
    for how in ("refuse", "lose"):
        with world(spare_nodes=0) as w:
            w.ecs.spare_nodes = [IDLE]
            w.service.aws_notices.capacity = Block([IDLE])
            w.ecs.failures["drain"] = [how]
            notify(w, "capacity_block_expiry", node=IDLE, reservation_id="cr-0123456789abcdef0")
            w.advance(C.NOTICE_RETRY_SECONDS)
            w.service.sweep()  # its drain fails
            idle = w.repo.instances.get_instance(IDLE)
            assert idle.notice and not idle.notice.get("drained_at"), how
            assert idle.deadline_at is not None and idle.deadline_at <= w.now[0] + C.NOTICE_RETRY_SECONDS
            w.advance(C.NOTICE_RETRY_SECONDS)
            w.service.sweep()
            assert w.repo.instances.get_instance(IDLE).notice.get("drained_at"), how
            assert len(w.ecs.drained) == (1 if how == "refuse" else 2)
    with world(spare_nodes=0) as w:
        w.ecs.spare_nodes = [IDLE]
        notify(w, "spot_interruption", node=IDLE)
        assert w.repo.instances.get_instance(IDLE).cordoned and w.ecs.drained == []


def test_a_tag_registered_job_keeps_running_and_is_told() -> None:
    with world() as w:
        w.register_job("tagged", [PEER, NODE])
        notify(w, "spot_interruption")
        assert w.repo.jobs.get_job("tagged").state is JobState.RUNNING
        told = [m for m in mails(w) if m.job_id == "tagged"]
        assert len(told) == 1 and "keeps running" in told[0].body
        assert w.repo.instances.get_instance(NODE).cordoned


def test_a_relocatable_tag_registered_job_is_stopped_before_the_deadline_and_moves_spending_nothing() -> None:
    """Given a tag-registered relocatable job (no control channel) on a node a scheduled
    retirement names, Then it keeps running (told when it will be stopped) until two sweep
    periods before the stop margin; the sweep then stops every rank and relocates it as a fault
    of its own (the node UNAVAILABLE, no check, no node action, no budget); it restarts on
    another node, never the announced one; a repeated sweep stops nothing more."""
    with world() as w:
        w.ecs.spare_nodes = [IDLE]
        arns = w.register_job("tagged", [PEER, NODE], tags={C.TAG_RELOCATABLE: "true"})
        done = notify(w, "scheduled_retirement", lead_seconds=600)
        deadline = float(w.repo.instances.get_instance(NODE).notice["deadline"])
        told = [m for m in mails(w) if m.job_id == "tagged"]
        assert len(told) == 1 and "keeps running until" in told[0].body
        # Two sweep periods before the stop margin: one for the sweep to come, one for a retry.
        stop_at = n.stop_at(deadline, C.RECOVERY_SWEEP_RATE_SECONDS)
        assert stop_at == deadline - n.STOP_MARGIN_SECONDS - 120
        assert w.repo.instances.get_instance(NODE).deadline_at == w.now[0] + C.NOTICE_RETRY_SECONDS, done
        w.now[0] = stop_at - 1
        w.service.sweep()
        assert w.repo.jobs.get_job("tagged").state is JobState.RUNNING and w.ecs.stop_calls == []
        assert w.repo.instances.get_instance(NODE).deadline_at == stop_at
        w.now[0] = stop_at
        w.service.sweep()
        _moved(w, "tagged", arns)


def test_a_spot_warning_stops_and_moves_a_relocatable_tag_registered_job_at_once() -> None:
    """Two minutes leave no sweep to wait for: the invocation that records the notice stops
    the job and moves it (its only e-mail says so)."""
    with world() as w:
        w.ecs.spare_nodes = [IDLE]
        arns = w.register_job("tagged", [PEER, NODE], tags={C.TAG_RELOCATABLE: "true"})
        notify(w, "spot_interruption")
        _moved(w, "tagged", arns)
        assert [m.subject for m in mails(w) if m.job_id == "tagged"] == [
            next(m.subject for m in mails(w) if m.job_id == "tagged" and "moved off" in m.subject.lower())]


def test_a_spot_warning_stops_the_rank_on_the_announced_node_first() -> None:
    """The deadline is the announced node's rank's alone (a large gang's stop is paced by the
    stack's ECS budget): its StopTask is the move's first, and the gang's stop, which finds it
    asked, does not ask it again."""
    with world() as w:
        w.ecs.spare_nodes = [IDLE]
        arns = w.register_job("tagged", [PEER, NODE], tags={C.TAG_RELOCATABLE: "true"})  # NODE: rank 1
        notify(w, "spot_interruption")
        assert w.ecs.stop_calls == [arns[1], arns[0]]
        _moved(w, "tagged", arns)


@pytest.mark.parametrize("checkpointed", [True, False], ids=["go_suspend", "stopped_at_the_bound"])
def test_a_queue_job_moving_off_the_node_has_its_rank_there_asked_first(checkpointed: bool) -> None:
    """Given a queue job asked to move off a node with a Spot warning (its rank 1 there), When
    rank 0 checkpoints and calls go_suspend(), or the move's bound passes without it, Then the
    rank on the announced node is asked to stop first (a large gang's stop is paced: the
    deadline is that rank's alone), and the gang's stop, which finds it asked, asks the others
    once each; a StopTask of it that fails once is asked again at once."""
    with world() as w:
        arns = w.register_queue_job("train", [PEER, NODE])
        notify(w, "spot_interruption")
        stop_task, failed = w.ecs.stop_task, _throttle_first_stop(w)
        if checkpointed:
            assert w.service.go_suspend("train", 0, 1).action == "suspending"
        else:
            sweeps(w, 1, every=n.SPOT_WARNING_SECONDS - n.STOP_MARGIN_SECONDS)
        assert failed == [arns[1]] and w.ecs.stop_calls == [arns[1], arns[0]]
        w.ecs.stop_task = stop_task  # type: ignore[method-assign]
        w.stopped_by_the_stack(arns)
        job = w.repo.jobs.get_job_item("train")
        assert job["job_state"] == JobState.SUSPENDED.value
        assert [m["outcome"] for m in job["moves"]] == ["moved" if checkpointed else "stopped_at_deadline"]


def test_a_first_stop_whose_stoptask_failed_is_asked_again_at_once() -> None:
    """Given the StopTask of the announced node's rank throttled once (its rank marked asked),
    Then the move's second try asks it again at once (StopTask is idempotent): the rank on the
    node is not left to the sweep's minute."""
    with world() as w:
        w.ecs.spare_nodes = [IDLE]
        arns = w.register_job("tagged", [PEER, NODE], tags={C.TAG_RELOCATABLE: "true"})
        stop_task, failed = w.ecs.stop_task, _throttle_first_stop(w)
        notify(w, "spot_interruption")
        assert failed == [arns[1]] and w.ecs.stop_calls[0] == arns[1]
        w.ecs.stop_task = stop_task  # type: ignore[method-assign]
        _moved(w, "tagged", arns)


def test_a_sweep_whose_read_failed_before_the_deadline_asks_the_job_at_once() -> None:
    """Given a Spot warning recorded whose delivery died before asking the job (its reads of the
    node's ranks failed at both tries), When the sweep's first read of them fails too, Then the
    sweep tries its step again at once: the job is asked in that sweep, not a minute nearer the
    two-minute deadline."""
    with world() as w:
        w.register_queue_job("train", [PEER, NODE])
        real = w.repo.jobs.live_ranks_on_instance
        reads: list[int] = []

        def failing(inst_id: str, *args: Any, **kwargs: Any) -> Any:
            reads.append(len(reads) + 1)
            if len(reads) in (2, 3, 4):  # the delivery's two tries after the record; the sweep's first
                raise throttled("Query")
            return real(inst_id, *args, **kwargs)

        w.repo.jobs.live_ranks_on_instance = failing  # type: ignore[method-assign]
        with pytest.raises(ClientError):
            notify(w, "spot_interruption")
        assert w.repo.instances.get_instance(NODE).notice["kind"] == "spot_interruption"
        assert w.repo.jobs.get_job("train").state is JobState.RUNNING  # recorded, not asked
        w.advance(C.NOTICE_RETRY_SECONDS)
        w.service.sweep()
        assert len(reads) == 5
        job = w.repo.jobs.get_job("train")
        assert job.state is JobState.SUSPENDING and job.suspend["kind"] == "moved"


def _throttle_first_stop(w: World) -> list[str]:
    """The first StopTask from here on is throttled (its task returned in the list); the others go
    to ECS."""
    stop_task, failed = w.ecs.stop_task, []

    def throttled_once(task_arn: str, reason: str) -> None:
        if not failed:
            failed.append(task_arn)
            raise throttled("StopTask")
        stop_task(task_arn, reason)

    w.ecs.stop_task = throttled_once  # type: ignore[method-assign]
    return failed


def _moved(w: World, job_id: str, arns: list[str]) -> None:
    """The job stopped and relocated off NODE, nothing spent, no check, no node action; then
    restarted on PEER and IDLE once its ranks stopped."""
    job = w.repo.jobs.get_job(job_id)
    assert job.state is JobState.PENDING_RESTART and job.relocate, job.state
    assert sorted(w.ecs.stop_calls) == sorted(arns)
    assert w.repo.faults.labels(job) == {NODE: "UNAVAILABLE"}
    assert (job.recoveries_used, job.app_restarts_used) == (0, 0)
    assert w.ecs.health_checks_on(NODE) == [] and w.rebooter.calls == []  # no check, no node action
    w.service.sweep()  # again: nothing more is stopped or charged
    assert sorted(w.ecs.stop_calls) == sorted(arns)
    for arn in arns:
        w.service.on_task_state_change(w.task_stopped(
            arn, exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: moved"))
    job = w.repo.jobs.get_job(job_id)
    assert job.attempt == 2 and job.state in (JobState.STARTING, JobState.RUNNING), job.state
    placed = sorted(r.container_inst_id for r in w.repo.jobs.get_ranks(job))
    assert placed == sorted([PEER, IDLE]) and (job.recoveries_used, job.app_restarts_used) == (0, 0)
    moved = [m for m in mails(w) if m.job_id == job_id and "moved off" in m.subject.lower()]
    assert len(moved) == 1, [m.subject for m in mails(w)]


def test_a_tag_registered_job_that_cannot_move_is_not_stopped() -> None:
    with world() as w:
        w.register_job("tagged", [PEER, NODE])
        notify(w, "spot_interruption")
        w.now[0] = float(w.repo.instances.get_instance(NODE).notice["deadline"]) - n.STOP_MARGIN_SECONDS
        w.service.sweep()
        assert w.repo.jobs.get_job("tagged").state is JobState.RUNNING and w.ecs.stop_calls == []


def test_after_a_reboot_maintenance_window_the_node_returns_to_service() -> None:
    with world() as w:
        w.ecs.spare_nodes = [NODE]
        notify(w, "scheduled_maintenance", lead_seconds=600)
        instance = w.repo.instances.get_instance(NODE)
        assert instance.cordoned and instance.notice["kind"] == "scheduled_reboot"
        w.advance(600 + 2 * 3600 + 1)  # past the window's end
        w.service.sweep()
        after = w.repo.instances.get_instance(NODE)
        assert not after.cordoned and not after.notice


def test_a_rebalance_recommendation_asks_without_a_deadline_and_never_stops_the_job() -> None:
    with world() as w:
        w.register_queue_job("train", [PEER, NODE])
        event = {"version": "0", "id": "x", "detail-type": n.REBALANCE_RECOMMENDATION, "source": "aws.ec2",
                 "account": "123456789012", "time": "2027-01-15T08:00:00Z", "region": REGION,
                 "resources": [], "detail": {"instance-id": f"i-{NODE}"}}
        w.service.on_aws_notice(event)
        job = w.repo.jobs.get_job("train")
        assert job.state is JobState.SUSPENDING and job.suspend["avoid"]["force"] is False
        sweeps(w, 1, every=w.service.settings.remediation.warning_checkpoint_seconds + 1)
        assert w.repo.jobs.get_job("train").state is JobState.RUNNING  # declined, not stopped
        assert w.repo.instances.get_instance(NODE).cordoned


def test_a_later_more_urgent_notice_replaces_a_scheduled_one() -> None:
    with world() as w:
        w.ecs.spare_nodes = [NODE]
        notify(w, "scheduled_retirement", lead_seconds=3 * 24 * 3600)
        notify(w, "spot_interruption")
        assert w.repo.instances.get_instance(NODE).notice["kind"] == "spot_interruption"
        notify(w, "scheduled_retirement", lead_seconds=3 * 24 * 3600)  # later: it does not replace it
        assert w.repo.instances.get_instance(NODE).notice["kind"] == "spot_interruption"


def test_a_notice_cordon_outlives_the_node_s_return_from_a_reboot() -> None:
    """A node AWS announced that the stack also reboots (a fault on it) stays out of placement
    when it is back: its cordon is AWS's notice's, not the fault's."""
    with world() as w:
        w.ecs.spare_nodes = [NODE]
        notify(w, "scheduled_retirement", lead_seconds=3600)
        w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: NODE},
                                      set_fields={"instance_state": C.InstanceState.REBOOTING.value}))
        instance = w.repo.instances.get_instance(NODE)
        assert w.repo.nodes_back.back_to_available(instance, w.now[0], {}, [], "attribute_exists(#k)", {},
                                                   {"#k": C.INSTANCE_PK})
        after = w.repo.instances.get_instance(NODE)
        assert after.state is C.InstanceState.AVAILABLE and after.cordoned and after.cordon["notice"]


@pytest.mark.parametrize("kind, lead", [("spot_interruption", None), ("scheduled_maintenance", 600)])
def test_a_settled_notice_due_again_keeps_the_node_cordoned(kind: str, lead: int | None) -> None:
    """Given a notice past its deadline, settled by the sweep, then due again (a late redelivery
    of its event re-arms it while a rank of the job still reads live on the node)
    When the sweep visits the node
    Then its notice and cordon stay: for good where the capacity is gone (Spot), until the window's
    end where the node comes back (scheduled maintenance), and not a moment before."""
    with world() as w:
        w.register_queue_job("train", [PEER, NODE])
        options = {} if lead is None else {"lead_seconds": lead}
        event = notify(w, kind, **options)["event"]
        notice = w.repo.instances.get_instance(NODE).notice
        w.advance(float(notice["deadline"]) - w.now[0] + 1)
        w.service.sweep()
        assert w.repo.instances.get_instance_item(NODE)["notice"].get("ended_at")
        w.service.on_aws_notice(event)  # the late redelivery, a rank still live on the node
        assert "deadline_at" in w.repo.instances.get_instance_item(NODE)
        w.advance(61)
        w.service.sweep()
        after = w.repo.instances.get_instance(NODE)
        assert after.cordoned and after.cordon["notice"] and after.notice["key"] == notice["key"]
        if lead is not None:
            w.advance(float(notice["window_end"]) - w.now[0] + 1)
            w.service.sweep()
            assert not w.repo.instances.get_instance(NODE).cordoned


def test_a_move_whose_commit_answer_was_lost_reserves_the_jobs_nodes_before_its_stop() -> None:
    """Given the write that moves a relocatable job off the announced node executed but its
    answer lost, When the notice's handling tries again (at once, ``once_more.twice``) and
    finds the job moved, Then the job's other node is reserved for it before the stop that
    frees it is sent, as when nothing failed (the sweep's refresh, a minute on, could find
    another scheduler's task there)."""
    with world() as w:
        w.ecs.spare_nodes = [IDLE]
        arns = w.register_job("tagged", [PEER, NODE], tags={C.TAG_RELOCATABLE: "true"})
        w.repo.fail_once("aws_notices.move_job_off_notice", "lose")
        at_stop = w.unavailable_at_stop([PEER])
        notify(w, "spot_interruption")
        assert w.repo.armed() == [], "the premise: the move's answer was lost"
        assert at_stop.get(arns[0]) == {PEER: "reserved"}
