"""Node remediation with fakes of the ports: the breaker, observe mode, escalation's page,
the fast path's crash consistency and termination in an Auto Scaling group. Each test
fails without the behaviour it names."""

from __future__ import annotations

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain import breaker
from gpu_recovery.domain.remediation_mode import parse_remediation_mode
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.recovery.breaker import reset_breaker
from gpu_recovery.repository import Update
from tests.recovery.fakes import LostResponse, World, world

FAULTY, PEER = "node-b", "node-a"
DAY = 24 * 3600.0


def _fault_with_reboot_verdict(w: World, arns: list[str]) -> None:
    """Rank 1 exits 1 (suspect); its DCGM check says reboot (the fake verdict line)."""
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [task] = w.ecs.health_checks_on(FAULTY)
    w.service.on_health_check_stopped(w.health_check_stopped(task, 1))


def _xid(w: World, node: str, xid: int) -> None:
    """What the heartbeat service keeps when the node agent reports an XID."""
    w.repo.apply(Update(table="instances", key={C.INSTANCE_PK: node},
                        set_fields={"gpu_events": [{"t": w.now[0], "g": "GPU-0", "x": xid}]}))


def _trip(w: World, nodes: list[str]) -> None:
    state = None
    for i, node in enumerate(nodes):
        decided = breaker.record_action(state, node=node, action="reboot", now=w.now[0] - 60 + i,
                                        cluster_gpu_nodes=2)
        assert w.repo.save_breaker(decided.state, None if state is None else state["version"])
        state = decided.state


def test_a_tripped_breaker_holds_the_reboot_and_keeps_it_in_its_backlog() -> None:
    """Given the breaker tripped, When a verdict says reboot, Then nothing is rebooted, the
    node is marked SUSPECT with the held action, the action joins the backlog, and the
    job (not relocatable) fails saying the node action was not carried out."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        _trip(w, ["x-1", "x-2"])
        _fault_with_reboot_verdict(w, arns)
        assert w.rebooter.calls == []
        inst = w.repo.get_instance(FAULTY)
        assert inst.state is C.InstanceState.SUSPECT and inst.breaker_blocked["action"] == "reboot"
        assert [b["node"] for b in w.repo.get_breaker()["backlog"]] == ["x-2", FAULTY]
        job = w.repo.get_job("j")
        assert job.state is C.JobState.FAILED and job.suspects[FAULTY] == "BLOCKED"
        assert "not carried out" in job.last_error


def test_the_released_backlog_is_carried_out_by_the_sweep_once() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        _trip(w, ["x-1", "x-2"])
        _fault_with_reboot_verdict(w, arns)
        reset = reset_breaker(w.repo, now=w.now[0], resume_backlog=True, by="oncall")
        assert reset.done and {e["node"] for e in reset.released} == {"x-2", FAULTY}
        w.service.sweep()
        w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]  # x-2 is not a node this table knows: dropped
        assert w.repo.get_instance(FAULTY).state is C.InstanceState.REBOOTING
        assert not w.repo.get_breaker().get("released")


def test_a_lost_answer_of_the_fast_path_decision_is_finished_by_the_sweep() -> None:
    """Given XID 79 reported and the node decision's transaction executed but its answer
    lost, When the sweep runs, Then the reboot is issued exactly once (no diag)."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        _xid(w, FAULTY, 79)
        w.repo.fail_once("record_node_decision", "lose")
        with pytest.raises(LostResponse):
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.rebooter.calls == [] and w.ecs.health_checks_on(FAULTY) == []
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        assert w.ecs.health_checks_on(FAULTY) == []
        assert w.repo.get_job("j").state is C.JobState.PENDING_RESTART


def test_a_node_remediated_five_times_in_a_week_is_quarantined_and_an_operator_paged() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        history = [{"at": w.now[0] - i * DAY, "cause": f"cause-{i}", "action": "reboot", "executed": True}
                   for i in range(1, 6)]
        w.repo.apply(Update(table="instances", key={C.INSTANCE_PK: FAULTY},
                            set_fields={"fault_history": history}))
        _fault_with_reboot_verdict(w, arns)
        assert w.rebooter.calls == []
        assert w.repo.get_instance(FAULTY).state is C.InstanceState.QUARANTINED
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
        assert w.repo.get_job("j").state is C.JobState.FAILED
        observed = [n for n in w.notifier.sent if n.kind is C.NotificationKind.OBSERVED]
        assert len(observed) == 1 and "stop_tasks, health_check" in observed[0].body


def test_a_termination_whose_answer_was_lost_is_looked_up_not_repeated() -> None:
    """Given replace_action terminate_in_asg, When TerminateInstanceInAutoScalingGroup
    executed but its answer was lost, Then the sweep (after the claim's lease) finds the
    instance terminating in its group and records it without calling again."""
    replace = RemediationSettings(replace_action="terminate_in_asg")
    with world(remediation=replace) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        _xid(w, FAULTY, 64)  # row-remap failure: replace, without the diag
        w.replacer.fail_next = "lose"
        with pytest.raises(LostResponse):
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.replacer.terminated == [f"i-{FAULTY}"]
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        assert w.replacer.terminated == [f"i-{FAULTY}"]
        inst = w.repo.get_instance_item(FAULTY)
        assert inst["instance_state"] == "QUARANTINED" and "terminating" in inst["terminate_result"]
        assert "terminate_pending" not in inst
