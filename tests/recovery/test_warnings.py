"""Issue 44 with the stages' fakes: the driver's warning on a node (recorded by the heartbeat
service, due for the sweep) repairs an idle node at once through the node decision, and on a
busy node cordons it and moves a queue job at its next checkpoint (the time-sharing suspend,
kind moved), or leaves a job that cannot move running, the node repaired once it leaves."""

from __future__ import annotations

from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.evidence import build_evidence
from gpu_recovery.domain.fault_catalog import default_catalog
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.gpu_counters import CounterRate
from gpu_recovery.domain.gpu_warnings import driver_warning, warning_record
from gpu_recovery.domain.models import Instance
from gpu_recovery.queue.control import JobControlService
from gpu_recovery.repository import Update
from gpu_recovery.repository.time_sharing import SuspensionRepository
from tests.recovery.fakes import World, ci_arn, world
from tests.recovery.remediation_steps import reset_stopped, resets_on, sweeps

NODE, PEER = "node-b", "node-a"
JobState, InstanceState, Kind = C.JobState, C.InstanceState, C.NotificationKind


def warn(w: World, node: str, rates: tuple[CounterRate, ...] = (), **gpu: Any) -> str:
    """What the heartbeat service leaves on the node when its agent reports ``gpu`` (compact
    telemetry keys: ``ra`` the recovery action, ``rp`` a pending remap) on GPU 0: the report,
    and the warning's record due for the sweep now. Returns the warning's rule."""
    w.repo.instances.put_instance_if_absent(Instance(node, container_instance_arn=ci_arn(node),
                                                     ec2_instance_id=f"i-{node}"))
    item = {"gpu_telemetry": [{"i": 0, "u": "GPU-0", **gpu}], "last_gpu_report_at": w.now[0],
            "gpu_counter_rates": [r.to_dict() for r in rates]}
    evidence = build_evidence(node_id=node, fault_at=w.now[0], trigger=Trigger.TELEMETRY, instance_item=item,
                              catalog=default_catalog())
    warning = driver_warning(evidence, default_catalog())
    assert warning is not None
    w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: node}, set_fields={
        **item, "warning": warning_record(warning, since=w.now[0], rates=evidence.counter_rates),
        C.DEADLINE_PK: C.DEADLINE_BUCKET, C.DEADLINE_SK: w.now[0]}))
    return warning.rule_id


def calm(w: World, node: str) -> None:
    """The node's next report shows nothing (the driver cleared it, the reset applied it)."""
    w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: node}, set_fields={
        "gpu_telemetry": [{"i": 0, "u": "GPU-0", "ra": "none"}], "last_gpu_report_at": w.now[0]}))


def mails(w: World, kind: C.NotificationKind = Kind.GPU_WARNING) -> list[Any]:
    return [n for n in w.notifier.sent if n.kind is kind]


# ------------------------------------------------------------------------- idle
def test_an_idle_node_whose_driver_asks_for_a_reset_is_reset_at_once_and_kept_out_until_it_passes() -> None:
    with world() as w:
        assert warn(w, NODE, ra="gpu_reset") == "gpu-recovery-action-reset"
        sweeps(w, 1)
        instance = w.repo.instances.get_instance(NODE)
        assert instance.state is InstanceState.REBOOTING and instance.reset_pending and instance.cordoned
        assert not instance.warning  # answered by the node decision
        [task] = resets_on(w, NODE)
        [record] = w.repo.instances.get_instance_item(NODE)["fault_history"]
        assert (record["action"], record["cause"]) == ("reset_gpu", "gpu-recovery-action-reset")
        assert w.repo.instances.get_instance_item(NODE)["last_verdict"]["source"] == "driver warning"
        [mail] = mails(w)
        assert "before a job found it" in mail.subject and "reset" in mail.body
        calm(w, NODE)
        assert w.service.on_health_check_stopped(reset_stopped(task, 0)).action == "gpu_reset_passed"
        instance = w.repo.instances.get_instance(NODE)
        assert instance.state is InstanceState.AVAILABLE and not instance.cordoned
        assert w.rebooter.calls == []


def test_an_idle_node_whose_driver_asks_for_a_reboot_is_rebooted_never_reset() -> None:
    with world() as w:
        warn(w, NODE, ra="node_reboot")
        sweeps(w, 1)
        assert w.repo.instances.get_instance(NODE).state is InstanceState.REBOOTING
        assert w.rebooter.calls == [f"i-{NODE}"] and resets_on(w, NODE) == []


def test_a_warning_the_next_report_no_longer_shows_is_cleared_with_its_cordon() -> None:
    with world() as w:
        arns = w.register_queue_job("j", [NODE])
        warn(w, NODE, rp=True)
        sweeps(w, 1)
        assert w.repo.instances.get_instance(NODE).cordoned
        # The job declines (no checkpoint), then the remap is applied some other way.
        w.advance(700)
        w.service.sweep()
        assert w.repo.jobs.get_job("j").state is JobState.RUNNING
        calm(w, NODE)
        sweeps(w, 1)
        instance = w.repo.instances.get_instance(NODE)
        assert not instance.warning and not instance.cordoned and instance.state is InstanceState.AVAILABLE
        assert arns and w.rebooter.calls == [] and resets_on(w, NODE) == []


def test_a_predicted_warning_stands_when_its_rate_dips_until_the_node_is_repaired() -> None:
    """NVLink replays rising past the catalog's rate (their lower bound at least 60/h) raised a
    predicted warning; the next report's rate dips (a shorter span, noise): the idle node is
    still repaired (a reboot), not let go."""
    with world() as w:
        rule = warn(w, NODE, rates=(CounterRate("nvlink_replay_errors", "GPU-0", 150.0, 25, 600.0),))
        assert rule == "gpu-nvlink-replay-rising"
        calm(w, NODE)
        sweeps(w, 1)
        assert w.repo.instances.get_instance(NODE).state is InstanceState.REBOOTING
        assert w.rebooter.calls == [f"i-{NODE}"]


def test_a_repair_the_breaker_holds_is_decided_once_not_every_minute() -> None:
    with world() as w:
        w.trip_breaker(["node-x", "node-y"])
        warn(w, NODE, ra="node_reboot")
        sweeps(w, 3)
        instance = w.repo.instances.get_instance(NODE)
        assert instance.state is InstanceState.SUSPECT and instance.breaker_blocked and instance.cordoned
        assert instance.warning.get("decided_at") and w.rebooter.calls == []
        assert len(w.repo.instances.get_instance_item(NODE)["fault_history"]) == 1


# ------------------------------------------------------------------------- busy
def test_a_busy_queue_job_is_moved_at_its_checkpoint_and_the_node_repaired_after() -> None:
    with world() as w:
        arns = w.register_queue_job("j", [PEER, NODE])
        warn(w, NODE, ra="gpu_reset")
        sweeps(w, 1)
        instance = w.repo.instances.get_instance(NODE)
        assert instance.cordoned and instance.state is InstanceState.AVAILABLE and resets_on(w, NODE) == []
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.SUSPENDING and job.suspend["kind"] == "moved"
        assert job.suspend["avoid"]["node"] == NODE and job.suspend["grace_seconds"] == 600
        sweeps(w, 2)  # asked once per attempt, whatever the sweeps
        assert len([h for h in w.repo.jobs.get_job_item("j")["history"] if h["to"] == "SUSPENDING"]) == 1
        # Rank 0 checkpoints and calls go_suspend(): every rank is stopped, the job queued
        # again ahead of its priority, then the node is repaired (the job's ranks gone).
        assert w.service.go_suspend("j", 0, 1).action == "suspending"
        w.stopped_by_the_stack(arns)
        item = w.repo.jobs.get_job_item("j")
        assert item["job_state"] == JobState.SUSPENDED.value
        assert f"#{C.RELOCATED_QUEUE_MARK}" in item[C.QUEUE_SK]
        [move] = item["moves"]
        assert move["outcome"] == "moved" and move["node"] == NODE and move["confidence"] == "announced"
        assert int(item.get("recoveries_used") or 0) == 0  # a move spends no recovery
        [task] = resets_on(w, NODE)
        assert w.repo.instances.get_instance(NODE).state is InstanceState.REBOOTING
        moved = [m for m in mails(w) if "moved off" in m.subject]
        assert len(moved) == 1 and "Avoided" in moved[0].body
        calm(w, NODE)
        w.service.on_health_check_stopped(reset_stopped(task, 0))
        assert w.repo.instances.get_instance(NODE).placeable


def test_a_job_that_does_not_checkpoint_in_time_keeps_running_on_its_cordoned_node() -> None:
    with world() as w:
        arns = w.register_queue_job("j", [NODE])
        warn(w, NODE, rp=True)
        sweeps(w, 1)
        w.advance(600)
        w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.RUNNING and not job.suspend
        [move] = w.repo.jobs.get_job_item("j")["moves"]
        assert move["outcome"] == "declined"
        assert arns[0] not in w.ecs.stop_calls  # never stopped by force for a warning
        assert any("did not checkpoint" in m.subject for m in mails(w))
        sweeps(w, 3)  # not asked again, not repaired under it
        assert w.repo.jobs.get_job("j").state is JobState.RUNNING and resets_on(w, NODE) == []
        assert w.repo.instances.get_instance(NODE).cordoned
        # The job ends: the node is repaired at the next sweep.
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=0))
        sweeps(w, 1)
        assert len(resets_on(w, NODE)) == 1


def test_a_job_that_cannot_be_asked_keeps_running_and_the_node_is_repaired_once_it_leaves() -> None:
    """A tag-registered job has no control channel: one e-mail says it keeps running; the
    node is cordoned; once the job ends, the node is repaired."""
    with world() as w:
        arns = w.register_job("t", [NODE])
        warn(w, NODE, ra="gpu_reset")
        sweeps(w, 3)
        assert w.repo.jobs.get_job("t").state is JobState.RUNNING
        assert w.repo.instances.get_instance(NODE).cordoned
        [mail] = mails(w)
        assert "keeps running" in mail.body and "not a queue job" in mail.body
        assert resets_on(w, NODE) == []
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=0))
        sweeps(w, 1)
        assert len(resets_on(w, NODE)) == 1


def test_a_warning_whose_node_reported_nothing_since_is_repaired_on_its_last_report() -> None:
    """The node's only GPU report (the driver asking for a reset) is 20 minutes old when its job
    leaves (the agent's later reports failed): the report aged out of the evidence's window is
    judged as of its own time, not as a report that no longer shows the warning; the node is
    reset, not uncordoned (8 % sweep ``driver_warning`` s13: a move that took 11 minutes)."""
    with world() as w:
        arns = w.register_job("t", [NODE])
        warn(w, NODE, ra="gpu_reset")
        sweeps(w, 20)
        assert w.repo.instances.get_instance(NODE).cordoned and resets_on(w, NODE) == []
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=0))
        sweeps(w, 1)
        assert len(resets_on(w, NODE)) == 1
        assert w.repo.instances.get_instance(NODE).cordoned


def test_a_gpu_that_fails_before_the_move_takes_the_ordinary_recovery() -> None:
    """The move asked, the GPU fails first: the rank's exit is a fault like any other (the
    suspension dropped); its evidence carries the driver's own word (reset, fast path), and
    that node decision answers the warning. The job restarts from its last checkpoint."""
    with world() as w:
        arns = w.register_queue_job("j", [PEER, NODE])
        warn(w, NODE, ra="gpu_reset")
        sweeps(w, 1)
        assert w.repo.jobs.get_job("j").state is JobState.SUSPENDING
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.PENDING_HEALTHCHECK, JobState.PENDING_RESTART)
        instance = w.repo.instances.get_instance(NODE)
        assert instance.state is InstanceState.REBOOTING and instance.reset_pending and not instance.warning
        assert w.ecs.health_checks_on(NODE) == []  # the driver said reset: no diag


def test_a_go_suspend_racing_the_decline_of_its_move_suspends_the_job_as_its_own() -> None:
    """Rank 0 calls go_suspend() at the move's bound: the call reads the job SUSPENDING, the
    sweep's decline commits (RUNNING again), the stop's write is refused. The call suspends
    the job as its own (like a RUNNING job's go_suspend()): the control API answers
    SUSPENDING with the ranks it stops, never RUNNING with nothing left to stop the caller."""
    with world() as w:
        arns = w.register_queue_job("j", [NODE])
        warn(w, NODE, rp=True)
        sweeps(w, 1)
        assert w.repo.jobs.get_job("j").state is JobState.SUSPENDING
        store = w.service.suspensions.store
        real = store.record_stop

        def declined_first(*args: Any, **kwargs: Any) -> bool:
            if not w.repo.jobs.get_job_item("j").get("moves"):
                w.advance(600)
                w.service.sweep()  # the bound passes under the call: the move declined
                assert w.repo.jobs.get_job("j").state is JobState.RUNNING
            return real(*args, **kwargs)

        store.record_stop = declined_first  # type: ignore[method-assign]
        control = JobControlService(w.repo.jobs, w.service.go_suspend, secrets=lambda job_id: "")
        answer = control.go_suspend("j", 0, 1)
        assert answer["state"] == JobState.SUSPENDING.value and answer["stopping_ranks"] == [0]
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.SUSPENDING and job.suspend["kind"] == "self" and job.suspend_stopping
        assert arns[0] in w.ecs.stop_calls
        w.stopped_by_the_stack(arns)
        item = w.repo.jobs.get_job_item("j")
        assert item["job_state"] == JobState.SUSPENDED.value and item["held"] is False
        assert f"#{C.RELOCATED_QUEUE_MARK}" not in item[C.QUEUE_SK]  # its own suspend: its own position
        assert [m["outcome"] for m in item["moves"]] == ["declined"]


# ------------------------------------------------------------- the owner's hold on a move
def test_the_owners_suspend_during_a_move_holds_the_job_once_moved() -> None:
    """`gpujobs suspend` on a job being moved (held: true): rank 0 checkpoints, every rank
    stops; the job is SUSPENDED and held (not queued for the scheduler to restart), the move
    recorded, the node repaired all the same."""
    with world() as w:
        arns = w.register_queue_job("j", [PEER, NODE])
        warn(w, NODE, ra="gpu_reset")
        sweeps(w, 1)
        assert SuspensionRepository(w.repo.jobs).set_hold("j", True, reason="suspend by u: held once stopped",
                                                          actor="u")
        assert w.service.go_suspend("j", 0, 1).action == "suspending"
        w.stopped_by_the_stack(arns)
        item = w.repo.jobs.get_job_item("j")
        assert item["job_state"] == JobState.SUSPENDED.value and item["held"] is True
        assert C.QUEUE_SK not in item and C.QUEUE_PK not in item
        [move] = item["moves"]
        assert move["outcome"] == "moved" and "held" in move["detail"]
        assert "held by its owner" in item["history"][-1]["reason"]
        [mail] = [m for m in mails(w) if "moved off" in m.subject]
        assert "gpujobs resume" in mail.body
        assert len(resets_on(w, NODE)) == 1


def test_a_held_move_whose_bound_passes_is_stopped_then_held_not_declined() -> None:
    with world() as w:
        arns = w.register_queue_job("j", [NODE])
        warn(w, NODE, rp=True)
        sweeps(w, 1)
        assert SuspensionRepository(w.repo.jobs).set_hold("j", True, reason="suspend by u", actor="u")
        w.advance(600)
        w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.SUSPENDING and job.suspend_stopping and arns[0] in w.ecs.stop_calls
        w.stopped_by_the_stack(arns)
        item = w.repo.jobs.get_job_item("j")
        assert item["job_state"] == JobState.SUSPENDED.value and item["held"] is True
        assert C.QUEUE_SK not in item
        assert [m["outcome"] for m in item["moves"]] == ["stopped_at_deadline"]


def test_a_hold_that_lands_between_the_sweeps_read_and_the_decline_is_kept() -> None:
    """The owner's suspend commits after the sweep read the move unheld: the decline's write
    is refused (the move is held), and the same sweep stops the job instead of letting it run."""
    with world() as w:
        arns = w.register_queue_job("j", [NODE])
        warn(w, NODE, rp=True)
        sweeps(w, 1)
        store = w.service.suspensions.store
        real = store.decline_move

        def held_first(*args: Any, **kwargs: Any) -> bool:
            assert store.set_hold("j", True, reason="suspend by u", actor="u")
            return real(*args, **kwargs)

        store.decline_move = held_first  # type: ignore[method-assign]
        w.advance(600)
        w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.SUSPENDING and job.suspend["hold"] is True and job.suspend_stopping
        assert arns[0] in w.ecs.stop_calls and "moves" not in w.repo.jobs.get_job_item("j")
        w.stopped_by_the_stack(arns)
        assert w.repo.jobs.get_job_item("j")["held"] is True
