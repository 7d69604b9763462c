"""The GPU reset stage (recovery.gpu_resets) with the stages' fakes: a reset_gpu decision
starts a privileged reset task on the node once its ranks stopped, learns the result from
the task's STOPPED event (or DescribeTasks), and either brings the node back (the job
restarts as after a healthy reboot) or falls back to today's reboot with an e-mail. Every
AWS call of the flow lost or refused once ends right."""

from __future__ import annotations

import contextlib

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain import started_by
from gpu_recovery.domain.models import GPU_RESET_TASK
from gpu_recovery.domain.remediation_mode import parse_remediation_mode
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.recovery.node_tasks import FOREIGN_TASK, POLL_SECONDS
from gpu_recovery.repository import Update
from tests.recovery.fakes import LostResponse, World, world
from tests.recovery.remediation_steps import impostor, report_xid, reset_stopped, resets_on, sweeps

FAULTY, PEER = "node-b", "node-a"






def xid_fault(w: World, xid: int = 119) -> list[str]:
    """XID ``xid`` (NVIDIA's RESET_GPU bucket, definitive) reported, then rank 1 exits 1."""
    arns = w.register_job("j", [PEER, FAULTY])
    report_xid(w, FAULTY, xid)
    with contextlib.suppress(LostResponse, TimeoutError):
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    return arns


def peer_stopped(w: World, arns: list[str]) -> None:
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))




def test_a_reset_class_xid_resets_the_gpus_and_the_job_restarts_on_the_same_node() -> None:
    with world() as w:
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        assert task.started_by.startswith(started_by.GPU_RESET) and w.rebooter.calls == []
        assert w.ecs.health_checks_on(FAULTY) == []
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.reset_pending
        assert instance.task(GPU_RESET_TASK).task_arn == task.arn
        job = w.repo.jobs.get_job("j")
        assert job.state is C.JobState.PENDING_RESTART and w.repo.faults.labels(job)[FAULTY] == "REBOOT"
        [record] = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert (record["action"], record["cause"]) == ("reset_gpu", "xid-119")
        peer_stopped(w, arns)
        outcome = w.service.on_health_check_stopped(reset_stopped(task, 0))
        assert outcome.action == "gpu_reset_passed"
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.AVAILABLE and not instance.reset_pending
        assert w.repo.jobs.get_job("j").attempt == 2  # restarted, as after a healthy reboot
        assert w.rebooter.calls == []
        assert C.NotificationKind.GPU_RESET_FAILED not in [n.kind for n in w.notifier.sent]
        # The event again changes nothing.
        assert w.service.on_health_check_stopped(reset_stopped(task, 0)).action == "duplicate"


def test_a_task_with_the_resets_started_by_but_another_definition_is_not_its_result() -> None:
    """Someone else's task with the reset's group and startedBy exits 0: ignored, the node is
    still being reset (not handed back unreset); the stack's own reset task decides."""
    with world() as w:
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        peer_stopped(w, arns)
        assert w.service.on_health_check_stopped(reset_stopped(impostor(w, task), 0)).action == FOREIGN_TASK
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.reset_pending
        assert w.service.on_health_check_stopped(reset_stopped(task, 0)).action == "gpu_reset_passed"


def test_a_health_check_reset_verdict_resets() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [check] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(check, 4))
        [task] = resets_on(w, FAULTY)
        assert w.rebooter.calls == []
        assert w.service.on_health_check_stopped(reset_stopped(task, 0)).action == "gpu_reset_passed"


def test_a_failed_reset_falls_back_to_the_reboot_with_one_email() -> None:
    with world() as w:
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        peer_stopped(w, arns)
        for _ in range(2):  # redelivered: one fallback, one reboot, one e-mail
            w.service.on_health_check_stopped(reset_stopped(task, 1))
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and not instance.reset_pending
        mails = [n for n in w.notifier.sent if n.kind is C.NotificationKind.GPU_RESET_FAILED]
        assert len(mails) == 1 and "exited 1" in mails[0].body
        item = w.repo.instances.get_instance_item(FAULTY)
        assert [r["action"] for r in item["fault_history"]] == ["reset_gpu", "reboot"]
        assert item["last_reset"]["result"] == "failed"
        # Then today's reboot flow: back after the reboot, the job restarts.
        w.ecs.agent_connected[FAULTY] = False
        sweeps(w, 1)
        w.ecs.agent_connected[FAULTY], w.ecs.versions[FAULTY] = True, 2
        sweeps(w, 1)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert w.repo.jobs.get_job("j").attempt == 2


def test_the_reset_waits_until_no_rank_holds_the_nodes_gpus() -> None:
    """nvidia-smi -r refuses a GPU in use: while another job's rank still runs on the node,
    no reset task starts; once it stopped, the sweep starts it."""
    with world() as w:
        other = w.register_job("k", [FAULTY])
        xid_fault(w)
        sweeps(w, 2)
        assert resets_on(w, FAULTY) == []
        assert w.repo.instances.get_instance(FAULTY).deadline_at is not None  # the sweep comes back
        w.service.on_task_state_change(w.task_stopped(other[0], exit_code=0))
        sweeps(w, 1)
        assert len(resets_on(w, FAULTY)) == 1


def test_a_lost_result_event_is_read_by_the_sweep() -> None:
    with world() as w:
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        peer_stopped(w, arns)
        task.last_status, task.exit_code = "STOPPED", 0  # its event never arrives
        sweeps(w, 1, POLL_SECONDS)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert w.repo.jobs.get_job("j").attempt == 2 and w.rebooter.calls == []


def test_a_reset_that_never_ends_is_stopped_and_the_node_rebooted() -> None:
    with world() as w:
        xid_fault(w)
        [task] = resets_on(w, FAULTY)
        timeout = w.service.settings.gpu_reset_timeout_seconds
        sweeps(w, int(timeout // POLL_SECONDS) + 1, POLL_SECONDS)
        assert task.arn in w.ecs.stop_calls and w.rebooter.calls == [f"i-{FAULTY}"]
        assert [n.kind for n in w.notifier.sent].count(C.NotificationKind.GPU_RESET_FAILED) == 1


def to_the_reset_deadline(w: World) -> None:
    """The sweep's look just before the reset's time is up (the task running), then the clock
    at that time, the sweep not run yet."""
    deadline = (w.repo.instances.get_instance(FAULTY).reboot_requested_at
                + w.service.settings.gpu_reset_timeout_seconds)
    w.advance(deadline - 1 - w.now[0])
    w.service.sweep()
    w.advance(1)


def test_a_reset_that_passed_whose_event_was_lost_is_read_at_its_deadline_not_rebooted() -> None:
    """The reset exits 0 just before its time is up and its STOPPED event is lost: the sweep
    asks ECS first, the node is back, no reboot, no reboot in its history (which would
    count toward its replacement)."""
    with world() as w:
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        peer_stopped(w, arns)
        to_the_reset_deadline(w)
        task.last_status, task.exit_code = "STOPPED", 0  # its event never arrives
        w.service.sweep()
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert w.rebooter.calls == [] and task.arn not in w.ecs.stop_calls
        history = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert [r["action"] for r in history] == ["reset_gpu"]
        assert C.NotificationKind.GPU_RESET_FAILED not in [n.kind for n in w.notifier.sent]


def test_a_throttled_describe_at_the_reset_deadline_decides_nothing_and_the_next_look_does() -> None:
    with world() as w:
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        peer_stopped(w, arns)
        to_the_reset_deadline(w)
        w.ecs.failures["describe_task"] = ["refuse"]
        w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.reset_pending and w.rebooter.calls == [] and task.arn not in w.ecs.stop_calls
        task.last_status, task.exit_code = "STOPPED", 0  # its event never arrives
        sweeps(w, 1)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert w.rebooter.calls == []


def test_a_reset_task_ecs_forgot_falls_back() -> None:
    with world() as w:
        xid_fault(w)
        [task] = resets_on(w, FAULTY)
        del w.ecs.tasks[task.arn]
        sweeps(w, 1, POLL_SECONDS)
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_a_lost_start_task_answer_never_starts_a_second_reset() -> None:
    with world() as w:
        w.ecs.failures["start_task"] = ["lose"]
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        assert not w.repo.instances.get_instance(FAULTY).task(GPU_RESET_TASK).task_arn
        sweeps(w, 4)  # past the claim's lease: taken over, looked up by startedBy
        assert resets_on(w, FAULTY) == [task]
        assert w.repo.instances.get_instance(FAULTY).task(GPU_RESET_TASK).task_arn == task.arn
        peer_stopped(w, arns)
        assert w.service.on_health_check_stopped(reset_stopped(task, 0)).action == "gpu_reset_passed"


def test_a_refused_start_task_is_retried_once_by_the_sweep() -> None:
    with world() as w:
        w.ecs.failures["start_task"] = ["refuse"]
        xid_fault(w)
        assert resets_on(w, FAULTY) == []
        sweeps(w, 1)
        assert len(resets_on(w, FAULTY)) == 1


@pytest.mark.parametrize("intent", ["node_tasks.claim", "node_tasks.record"])
def test_a_lost_write_of_the_reset_is_finished_by_the_sweep(intent: str) -> None:
    with world() as w:
        w.repo.fail_once(intent, "lose")
        arns = xid_fault(w)
        sweeps(w, 4)
        [task] = resets_on(w, FAULTY)
        assert w.repo.instances.get_instance(FAULTY).task(GPU_RESET_TASK).task_arn == task.arn
        peer_stopped(w, arns)
        assert w.service.on_health_check_stopped(reset_stopped(task, 0)).action == "gpu_reset_passed"


@pytest.mark.parametrize("claim", ["node_tasks.claim", "node_tasks.take_over"])
def test_a_reset_claim_whose_answer_was_lost_is_the_same_try_s(claim: str) -> None:
    """Given the reset's claim (or the take-over of a claim whose StartTask answer was lost)
    written but its answer lost, Then the same try sends it again with its own token and goes
    on (starts the reset, or finds it by its startedBy) at once: it does not wait out the
    claim's lease, and the reset runs once."""
    with world() as w:
        if claim == "node_tasks.take_over":
            w.ecs.failures["start_task"] = ["lose"]
            xid_fault(w)
            w.advance(C.CLAIM_LEASE_SECONDS - 60)
        w.repo.fail_once(claim, "lose")
        if claim == "node_tasks.claim":
            xid_fault(w)
        else:
            sweeps(w, 1)  # the lease has ended: taken over, its task looked up
        [task] = resets_on(w, FAULTY)
        assert w.repo.instances.get_instance(FAULTY).task(GPU_RESET_TASK).task_arn == task.arn
        sweeps(w, 4)
        assert resets_on(w, FAULTY) == [task]


def test_a_lost_fallback_write_is_finished_once() -> None:
    with world() as w:
        w.repo.fail_once("gpu_resets.fall_back_to_reboot", "lose")
        arns = xid_fault(w)
        [task] = resets_on(w, FAULTY)
        peer_stopped(w, arns)
        with contextlib.suppress(LostResponse):
            w.service.on_health_check_stopped(reset_stopped(task, 1))
        sweeps(w, 2)
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        assert [n.kind for n in w.notifier.sent].count(C.NotificationKind.GPU_RESET_FAILED) == 1


def test_a_task_ecs_could_not_place_is_started_again_not_rebooted() -> None:
    """ECS answers the reset's StartTask with a failure (placed nothing: GPUs not released
    yet): the reset is tried again on the sweep and starts; no reboot (issue 40, ECS failures)."""
    with world() as w:
        w.ecs.failures["start_task"] = ["place_nothing"]
        xid_fault(w)
        assert w.rebooter.calls == [] and resets_on(w, FAULTY) == []
        sweeps(w, 2)
        assert len(resets_on(w, FAULTY)) == 1 and w.rebooter.calls == []


def test_a_task_that_can_never_be_placed_falls_back_once_its_time_is_up() -> None:
    with world() as w:
        w.ecs.failures["start_task"] = ["place_nothing"] * 100
        xid_fault(w)
        sweeps(w, 20)
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        [mail] = [n for n in w.notifier.sent if n.kind is C.NotificationKind.GPU_RESET_FAILED]
        assert "could not be placed" in mail.body or "did not finish" in mail.body


def test_the_driver_asking_for_a_node_reboot_is_never_reset() -> None:
    """The check exits 4 (reset) but a GPU's driver recovery action is "node reboot": the
    more severe signal wins."""
    with world() as w:
        w.service.verdicts.read_verdict = lambda _arn: {  # type: ignore[method-assign]
            "verdict": "reset", "gpus": [{"index": 0, "uuid": "GPU-0", "remap_pending": True,
                                          "recovery_action": "node_reboot"}]}
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [check] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(check, 4))
        assert resets_on(w, FAULTY) == [] and w.rebooter.calls == [f"i-{FAULTY}"]
        assert w.repo.instances.get_instance_item(FAULTY)["last_fault"]["plan"]["action"] == "reboot"


def test_observe_mode_resets_nothing() -> None:
    observe = RemediationSettings(modes=parse_remediation_mode("enforce,reset_gpu=observe"))
    with world(remediation=observe) as w:
        xid_fault(w)
        assert resets_on(w, FAULTY) == [] and w.rebooter.calls == []
        plan = w.repo.instances.get_instance_item(FAULTY)["last_fault"]["plan"]
        assert plan["action"] == "reset_gpu" and plan["record_only"] == ["reset_gpu"]
        assert w.repo.instances.get_instance(FAULTY).state is not C.InstanceState.REBOOTING


def test_a_node_reset_twice_in_the_window_is_rebooted() -> None:
    """Escalation (domain.escalation): resets that do not hold become a reboot."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        history = [{"at": w.now[0] - 3600 * (i + 1), "cause": "xid-119", "action": "reset_gpu",
                    "executed": True} for i in range(2)]
        w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: FAULTY},
                                      set_fields={"fault_history": history}))
        report_xid(w, FAULTY, 119)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert resets_on(w, FAULTY) == [] and w.rebooter.calls == [f"i-{FAULTY}"]
        assert w.repo.instances.get_instance_item(FAULTY)["last_fault"]["plan"]["action"] == "reboot"


def test_a_reset_the_breaker_held_is_released_as_a_reset_and_the_held_job_restarts() -> None:
    """The breaker counts a reset as a remediation: tripped, it holds the reset back (the job
    waits HELD); the operator's reset releases it as a reset, not as a quarantine."""
    from gpu_recovery.recovery.breaker.operations import reset_breaker

    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.trip_breaker(["x-1", "x-2"])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [check] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(check, 4))
        peer_stopped(w, arns)
        assert resets_on(w, FAULTY) == [] and w.rebooter.calls == []
        assert w.repo.instances.get_instance(FAULTY).breaker_blocked["action"] == "reset_gpu"
        assert w.repo.jobs.get_job("j").state is C.JobState.HELD
        assert reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=True, by="oncall").done
        sweeps(w, 1)
        [task] = resets_on(w, FAULTY)
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.reset_pending
        assert w.service.on_health_check_stopped(reset_stopped(task, 0)).action == "gpu_reset_passed"
        sweeps(w, 1)
        assert w.repo.jobs.get_job("j").attempt == 2 and w.rebooter.calls == [] and w.ecs.drained == []
