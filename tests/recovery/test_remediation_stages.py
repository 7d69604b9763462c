"""Node remediation with fakes of the ports: the breaker, observe mode, escalation's page,
the fast path's crash consistency and termination in an Auto Scaling group. Each test
fails without the behaviour it names."""

from __future__ import annotations

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.remediation_mode import parse_remediation_mode
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.recovery.breaker.operations import reset_breaker
from gpu_recovery.repository import Update
from tests.recovery.fakes import LostResponse, World, world
from tests.recovery.remediation_steps import (
    fault_with_reboot_verdict,
    rebooting,
    report_xid,
    trip_with_backlog,
)

FAULTY, PEER = "node-b", "node-a"
DAY = 24 * 3600.0


def test_a_tripped_breaker_holds_the_reboot_and_keeps_it_in_its_backlog() -> None:
    """Given the breaker tripped, When a verdict says reboot, Then nothing is rebooted, the
    node is marked SUSPECT with the held action, the action joins the backlog, and the
    job (not relocatable) does not fail: it waits for the reset (HELD once its other rank
    ended: tests/recovery/test_held_jobs.py)."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.trip_breaker(["x-1", "x-2"])
        fault_with_reboot_verdict(w, arns)
        assert w.rebooter.calls == []
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.SUSPECT and inst.breaker_blocked["action"] == "reboot"
        assert [b["node"] for b in w.repo.breaker.read()["backlog"]] == ["x-2", FAULTY]
        job = w.repo.jobs.get_job("j")
        assert job.state is C.JobState.PENDING_RESTART and w.repo.faults.labels(job)[FAULTY] == "BLOCKED"
        assert job.tally.held == 1 and job.recoveries_used == 0


def test_the_released_backlog_is_carried_out_by_the_sweep_once() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.trip_breaker(["x-1", "x-2"])
        fault_with_reboot_verdict(w, arns)
        reset = reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=True, by="oncall")
        assert reset.done and {e["node"] for e in reset.released} == {"x-2", FAULTY}
        w.service.sweep()
        w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]  # x-2 is not a node this table knows: dropped
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.REBOOTING
        assert not w.repo.breaker.read().get("released")


def test_a_lost_answer_of_the_fast_path_decision_is_finished_by_the_sweep() -> None:
    """Given XID 79 reported and the node decision's transaction executed but its answer
    lost, When the sweep runs, Then the reboot is issued exactly once (no diag)."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        report_xid(w, FAULTY, 79)
        w.repo.fail_once("decisions.record", "lose")
        with pytest.raises(LostResponse):
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.rebooter.calls == [] and w.ecs.health_checks_on(FAULTY) == []
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        assert w.ecs.health_checks_on(FAULTY) == []
        assert w.repo.jobs.get_job("j").state is C.JobState.PENDING_RESTART


def test_a_node_remediated_five_times_in_a_week_is_quarantined_and_an_operator_paged() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        history = [{"at": w.now[0] - i * DAY, "cause": f"cause-{i}", "action": "reboot", "executed": True}
                   for i in range(1, 6)]
        w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: FAULTY},
                                      set_fields={"fault_history": history}))
        fault_with_reboot_verdict(w, arns)
        assert w.rebooter.calls == []
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.QUARANTINED
        assert w.ecs.drained  # drained, never terminated
        paged = [n for n in w.notifier.sent if n.kind is C.NotificationKind.OPERATOR_ACTION]
        assert len(paged) == 1 and "remediated 5 times" in paged[0].body


def test_observe_mode_stops_nothing_starts_no_diag_and_tells_once() -> None:
    observe = RemediationSettings(modes=parse_remediation_mode("observe"))
    with world(remediation=observe) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))  # redelivered
        w.advance(120)
        w.service.sweep()
        assert w.ecs.stop_calls == [] and w.ecs.health_checks_on(FAULTY) == [] and w.rebooter.calls == []
        assert w.repo.jobs.get_job("j").state is C.JobState.FAILED
        observed = [n for n in w.notifier.sent if n.kind is C.NotificationKind.OBSERVED]
        assert len(observed) == 1 and "stop_tasks, health_check" in observed[0].body


def test_a_termination_whose_answer_was_lost_is_looked_up_not_repeated() -> None:
    """Given replace_action terminate_in_asg, When TerminateInstanceInAutoScalingGroup
    executed but its answer was lost, Then the sweep (after the claim's lease) finds the
    instance terminating in its group and records it without calling again."""
    replace = RemediationSettings(replace_action="terminate_in_asg")
    with world(remediation=replace) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        report_xid(w, FAULTY, 64)  # row-remap failure: replace, without the diag
        w.replacer.fail_next = "lose"
        # The decision is committed before the call: its delivery ends (the sweep finishes).
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.replacer.terminated == [f"i-{FAULTY}"]
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        assert w.replacer.terminated == [f"i-{FAULTY}"]
        inst = w.repo.instances.get_instance_item(FAULTY)
        assert inst["instance_state"] == "QUARANTINED" and "terminating" in inst["terminate_result"]
        assert "terminate_pending" not in inst


def test_a_termination_claim_whose_answer_was_lost_is_the_same_try_s() -> None:
    """Given replace_action terminate_in_asg, When the termination's claim was written but its
    answer lost, Then the same delivery sends it again with its own token and terminates the
    node at once (it does not wait out the claim's lease), once."""
    replace = RemediationSettings(replace_action="terminate_in_asg")
    with world(remediation=replace) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        report_xid(w, FAULTY, 64)
        w.repo.fail_once("reboots.claim_termination", "lose")
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.replacer.terminated == [f"i-{FAULTY}"]
        inst = w.repo.instances.get_instance_item(FAULTY)
        assert "terminating" in inst["terminate_result"] and "terminate_claim_token" not in inst
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        assert w.replacer.terminated == [f"i-{FAULTY}"]


# --- gaps closed after the audit: every automatic quarantine asks the breaker and the mode --


class _Metrics:
    def __init__(self) -> None:
        self.values: list[tuple[str, str, float]] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.values.append((name, unit, value))

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        self.values.append((name, unit, value))

    def last(self, name: str) -> tuple[str, float] | None:
        return next(((u, v) for n, u, v in reversed(self.values) if n == name), None)


def test_a_reboot_timeout_with_the_breaker_at_its_limit_does_not_drain() -> None:
    """Given a node rebooting and then the breaker tripped by other nodes, When the reboot
    times out, Then the node is not drained: SUSPECT with the held-back quarantine in the
    backlog (the job fails); nothing beyond the window's limit is acted on."""
    with world() as w:
        rebooting(w, "j", [PEER, FAULTY])
        w.advance(31 * 60)
        w.ecs.agent_connected[FAULTY] = False  # it never came back (issue 49: one that answers is asked)
        trip_with_backlog(w, ["x-2"], window=("x-1",))
        w.service.sweep()
        assert w.ecs.drained == []
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.SUSPECT and inst.breaker_blocked["action"] == "replace"
        assert inst.breaker_blocked["rule"] == "builtin:reboot-timeout"
        assert [b["node"] for b in w.repo.breaker.read()["backlog"]] == ["x-2", FAULTY]
        assert w.repo.jobs.get_job("j").state is C.JobState.FAILED
        history = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert (history[-1]["cause"], history[-1]["executed"]) == ("builtin:reboot-timeout", False)


def test_a_reboot_timeout_counts_against_the_breaker_when_it_drains() -> None:
    with world() as w:
        rebooting(w, "j", [PEER, FAULTY])
        w.advance(31 * 60)
        w.ecs.agent_connected[FAULTY] = False  # it never came back (issue 49: one that answers is asked)
        w.service.sweep()
        assert w.ecs.drained and w.repo.instances.get_instance(FAULTY).state is C.InstanceState.QUARANTINED
        assert [e["node"] for e in w.repo.breaker.read()["window"]] == [FAULTY]  # the quarantine, now


def _minutes(w: World, minutes: int) -> None:
    for _ in range(minutes):
        w.advance(60)
        w.service.sweep()


def test_a_reboot_sent_late_has_the_whole_timeout_to_come_back() -> None:
    """Given a reboot whose every try is refused for twenty minutes (the reboot API throttled),
    When it is sent at last and the node goes down, Then the reboot timeout (30 minutes) counts
    from its sending: 49 minutes after the request the node is still given its time; not back
    30 minutes after its reboot, it is quarantined."""
    with world() as w:
        w.rebooter.failures = ["refuse"] * 1000
        rebooting(w, "j", [PEER, FAULTY])
        _minutes(w, 20)
        assert w.rebooter.calls == []
        w.rebooter.failures.clear()
        _minutes(w, 1)
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        w.ecs.agent_connected[FAULTY] = False  # going down: its reboot
        _minutes(w, 28)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.REBOOTING
        assert w.ecs.drained == []
        _minutes(w, 3)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.QUARANTINED
        assert "did not come back after its reboot" in w.repo.jobs.get_job("j").last_error


def test_a_reboot_never_sent_times_out_from_its_request_and_says_so() -> None:
    """Given a reboot whose every try is refused, When the reboot timeout has passed since its
    request, Then the node (its check's verdict stands) is quarantined, and the job's error says
    the node was not rebooted, not that it did not come back."""
    with world() as w:
        w.rebooter.failures = ["refuse"] * 1000
        rebooting(w, "j", [PEER, FAULTY])
        _minutes(w, 31)
        assert w.rebooter.calls == []
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.QUARANTINED
        assert "was not rebooted: every try to send its reboot failed" in w.repo.jobs.get_job("j").last_error
        w.rebooter.failures.clear()


def test_drain_observed_a_health_check_timeout_leaves_the_node_undrained() -> None:
    """Given drain=observe, When a health check never finishes, Then the node is neither
    drained nor marked SUSPECT and its history records nothing (issue 49: a check without
    a verdict is the stack's failure, not evidence against the node)."""
    settings = RemediationSettings(modes=parse_remediation_mode("enforce,drain=observe"))
    with world(remediation=settings) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.ecs.health_checks_on(FAULTY)
        w.advance(31 * 60)
        w.service.sweep()
        assert w.ecs.drained == []
        inst = w.repo.instances.get_instance_item(FAULTY)
        assert inst["instance_state"] == "AVAILABLE" and "drain_pending" not in inst
        assert not inst.get("fault_history")


def _held(w: World, nodes: list[str]) -> None:
    """``nodes`` held back by a tripped breaker (SUSPECT, reboot in the backlog)."""
    for node in nodes:
        w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: node}, set_fields={
            "instance_state": "SUSPECT", "ec2_instance_id": f"i-{node}",
            "breaker_blocked": {"action": "reboot", "at": w.now[0], "rule": "xid-79", "jobs": []}}))
    trip_with_backlog(w, nodes)


def test_a_reset_releases_at_most_the_windows_allowance_per_sweep() -> None:
    """Given 10 GPU nodes (20 %: 2 per 10-minute window) and 5 reboots held back, When an
    operator resets with --resume-backlog, Then each sweep reboots no more than the window
    allows (2, then nothing until the window slides, then 2, then 1), oldest first."""
    with world() as w:
        w.ecs.spare_nodes = [f"n-{i}" for i in range(10)]
        held = [f"n-{i}" for i in range(5)]
        _held(w, held)
        assert w.repo.breaker.read()["state"] == "tripped"
        assert reset_breaker(w.repo.breaker, now=w.now[0] + 10, resume_backlog=True, by="oncall").done
        w.advance(60)
        w.service.sweep()
        assert w.rebooter.calls == ["i-n-0", "i-n-1"]
        w.advance(60)
        w.service.sweep()
        assert len(w.rebooter.calls) == 2
        assert sorted(w.repo.breaker.read()["released"]) == ["n-2", "n-3", "n-4"]
        w.advance(10 * 60)
        w.service.sweep()
        assert w.rebooter.calls == ["i-n-0", "i-n-1", "i-n-2", "i-n-3"]
        w.advance(10 * 60)
        w.service.sweep()
        assert len(w.rebooter.calls) == 5 and not w.repo.breaker.read()["released"]
        assert w.repo.breaker.read()["state"] == "closed"


def test_drop_backlog_also_drops_what_an_earlier_reset_released_and_is_still_waiting() -> None:
    with world() as w:
        w.ecs.spare_nodes = [f"n-{i}" for i in range(5)]
        _held(w, ["n-0", "n-1", "n-2"])
        assert reset_breaker(w.repo.breaker, now=w.now[0] + 10, resume_backlog=True, by="oncall").done
        w.advance(60)
        w.service.sweep()
        assert w.rebooter.calls == ["i-n-0"]  # 20 % of 5: one node per window
        dropped = reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=False, by="oncall")
        assert sorted(e["node"] for e in dropped.dropped) == ["n-1", "n-2"]
        w.advance(20 * 60)
        w.service.sweep()
        assert w.rebooter.calls == ["i-n-0"]


def test_the_breaker_sweep_emits_its_state_and_utilisation() -> None:
    """BreakerOpen (1 while tripped), BreakerUtilization (% of the window's limit, against the
    cluster its last decision counted: no ECS listing every minute) and BreakerBacklog every
    sweep, from the stored state."""
    with world() as w:
        metrics = _Metrics()
        w.service.metrics = metrics
        w.ecs.spare_nodes = [f"n-{i}" for i in range(10)]
        w.service.sweep()
        assert metrics.last("BreakerOpen") == ("Count", 0)
        decided = breaker.record_action(None, node="n-0", action="reboot", now=w.now[0], cluster_gpu_nodes=10)
        assert w.repo.breaker.save(decided.state, None)  # a first action: nothing counted
        listed = w.ecs.cluster_listings
        w.service.sweep()
        assert metrics.last("BreakerOpen") == ("Count", 0.0)
        assert metrics.last("BreakerUtilization") is None  # a share of an unknown cluster means nothing
        assert w.ecs.cluster_listings == listed
        stored = w.repo.breaker.read()
        assert w.repo.breaker.save({**decided.state, "version": decided.state["version"] + 1,
                                    "cluster_gpu_nodes": 10}, int(stored["version"]))
        w.service.sweep()
        assert metrics.last("BreakerUtilization") == ("Percent", pytest.approx(50.0))
        trip_with_backlog(w, ["n-3"], window=("n-1", "n-2"))
        w.service.sweep()
        assert metrics.last("BreakerOpen") == ("Count", 1.0)
        assert metrics.last("BreakerUtilization") == ("Percent", pytest.approx(100.0))
        assert metrics.last("BreakerBacklog") == ("Count", 1.0)


def test_an_idle_sweep_reads_the_breaker_with_its_worklist_and_a_sweep_that_acted_reads_it_again() -> None:
    """The sweep reads the cordon worklist and the breaker's item in one BatchGetItem; the
    breaker's sweep uses that item when nothing was written since (an idle minute), and reads
    it again after a due step ran (a step may act on a node through the breaker)."""
    with world() as w:
        metrics = _Metrics()
        w.service.metrics = metrics
        decided = breaker.record_action(None, node="n-0", action="reboot", now=w.now[0], cluster_gpu_nodes=10)
        assert w.repo.breaker.save({**decided.state, "cluster_gpu_nodes": 10}, None)
        reads: list[str] = []
        read = w.repo.breaker.read
        w.repo.breaker.read = lambda: reads.append("breaker") or read()  # type: ignore[method-assign]
        w.service.sweep()
        assert reads == []
        assert metrics.last("BreakerUtilization") == ("Percent", pytest.approx(50.0))  # from the batch's item
        fault_with_reboot_verdict(w, w.register_job("j", [PEER, FAULTY]))  # node-b rebooting: due
        w.advance(10 * 60)
        reads.clear()  # the verdict's node decision read it too
        w.service.sweep()
        assert reads, "the breaker was not read again after a due step ran"


def test_observe_mode_leaves_a_hung_or_lost_nodes_diag_unstarted() -> None:
    """Given observe mode, When the heartbeat service hands a suspected fault over (a node
    lost with its agent connected, a hung rank), Then no diag is started and nothing is
    stopped: the job fails in the table only, with one 'observed' e-mail."""
    with world(remediation=RemediationSettings(modes=parse_remediation_mode("observe"))) as w:
        w.register_job("j", [PEER, FAULTY])
        w.service.report_suspected_fault("j", 1, FAULTY, "rank 1 hung at step 7")
        w.advance(120)
        w.service.sweep()
        assert w.ecs.health_checks_on(FAULTY) == [] and w.ecs.stop_calls == []
        job = w.repo.jobs.get_job("j")
        assert job.state is C.JobState.FAILED and "observe mode" in job.last_error
        assert [n.kind for n in w.notifier.sent] == [C.NotificationKind.OBSERVED]
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE


def test_the_node_history_keeps_a_summary_of_each_faults_evidence() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        fault_with_reboot_verdict(w, arns)
        [record] = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        summary = record["evidence"]
        assert (summary["trigger"], summary["exit_code"], summary["rank"]) == ("task_exit", 1, 1)
        assert summary["stop_code"] == "EssentialContainerExited"
        assert summary["dcgm"]["verdict"] == "reboot" and summary["dcgm"]["failed_tests"] == ["memory"]


def test_a_fault_without_node_action_joins_the_nodes_history_once() -> None:
    """The helper task_events calls after a restart in place: idempotent per fault."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        report_xid(w, FAULTY, 13)
        job = w.repo.jobs.get_job("j")
        raw = w.repo.instances.get_instance_item(FAULTY)
        remediation = w.service.remediation
        evidence = remediation.evidence(inst_id=FAULTY, instance_item=raw, trigger=Trigger.TASK_EXIT,
                                        fault_at=w.now[0], job=job, rank=1, exit_code=1,
                                        stop_code="EssentialContainerExited")
        plan = remediation.plan(evidence, raw, now=w.now[0])
        assert plan.action.value == "application_error"
        assert remediation.record_fault_on_node(job, FAULTY, evidence, plan, spent="application")
        w.advance(5)
        assert remediation.record_fault_on_node(job, FAULTY, evidence, plan, spent="application")  # again
        history = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert [(r["cause"], r["action"], r["job_id"], r["charged_job"]) for r in history] == [
            ("xid-13", "application_error", "j", False)]
        assert history[0]["xids"][0]["xid"] == 13
        assert (history[0]["evidence"]["exit_code"], history[0]["evidence"]["spent"]) == (1, "application")
        last_fault = w.repo.instances.get_instance_item(FAULTY)["last_fault"]
        assert last_fault["plan"]["action"] == "application_error"
        assert arns


def test_an_xid_that_decided_one_fault_does_not_decide_the_next_on_that_node() -> None:
    """Given XID 13 on a node that failed job a as an application error, When job b's rank
    on that node exits 1 two minutes later (within the catalog's 15 min look-back), Then
    b's fault is not the same XID 13 again: the suspect exit sends the node to the DCGM
    diag (b waits for it) instead of failing b as an application error."""
    with world() as w:
        first = w.register_job("a", [PEER, FAULTY])
        report_xid(w, FAULTY, 13)
        w.service.on_task_state_change(w.task_stopped(first[1], exit_code=1))
        assert w.repo.jobs.get_job("a").state is C.JobState.FAILED
        assert [r["cause"] for r in w.repo.instances.get_instance_item(FAULTY)["fault_history"]] == ["xid-13"]
        assert w.ecs.health_checks_on(FAULTY) == []
        w.advance(120)
        second = w.register_job("b", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(second[1], exit_code=1))
        assert len(w.ecs.health_checks_on(FAULTY)) == 1
        assert w.repo.jobs.get_job("b").state is not C.JobState.FAILED


def test_the_breaker_records_the_clusters_size_only_when_it_counted_it() -> None:
    """Given a first node action (one node always fits: nobody lists the cluster), Then the
    breaker's item holds no cluster size (it used to say 0 GPU nodes); When a second node is
    acted on within the window, Then the cluster is counted and its real size recorded."""
    with world() as w:
        fault_with_reboot_verdict(w, w.register_job("j", [PEER, FAULTY]))
        stored = w.repo.breaker.read()
        assert stored["window"] and "cluster_gpu_nodes" not in stored
        arns = w.register_job("k", ["node-c", "node-d"])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [task] = w.ecs.health_checks_on("node-d")
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        assert w.repo.breaker.read()["cluster_gpu_nodes"] == 4
