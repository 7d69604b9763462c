"""Validation after repair (recovery.validations) with the stages' fakes: a node back from
its reboot or GPU reset stays REBOOTING and runs the health-check task as a validation
(DCGM level + GPU load) before it is AVAILABLE; a pass releases its jobs, a failure is a node
decision under the cause of the repair that did not hold (escalation, breaker); the task is
started once per validation (claim, startedBy), its lost answers and events are finished by
the sweep, and the validation is bounded by its timeout."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain import placement
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.domain.validation import START_RETRIES, ValidationPolicy
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery.node_tasks import FOREIGN_TASK, POLL_SECONDS
from tests.health_check.script_runner import run_check
from tests.recovery.fakes import CLUSTER_ARN, EVENTS, FakeTask, LostResponse, World, ci_arn, world
from tests.recovery.remediation_steps import FOREIGN_DEFINITION, impostor

FAULTY, PEER = "node-b", "node-a"
ON = ValidationPolicy(enabled=True, dcgm_level=1, load_seconds=45, timeout_seconds=600)


@contextmanager
def validating_world(**settings: Any) -> Iterator[World]:
    with world(validation=settings.pop("validation", ON), **settings) as w:
        yield w


def validations_on(w: World, node: str) -> list[FakeTask]:
    return [t for t in w.ecs.tasks.values() if t.node == node and t.group == C.GPU_VALIDATION_GROUP]


def stopped(task: FakeTask, exit_code: int | None, now: float) -> EcsTaskDetail:
    """The validation task's STOPPED event (the health-check fixture's shape, its own group)."""
    task.last_status, task.exit_code, task.stopped_at = "STOPPED", exit_code, now
    detail = json.loads((EVENTS / "health_check_task_stopped.json").read_text())["detail"]
    detail.update(taskArn=task.arn, clusterArn=CLUSTER_ARN, containerInstanceArn=ci_arn(task.node),
                  startedBy=task.started_by, group=task.group, taskDefinitionArn=task.task_definition_arn)
    detail["containers"][0]["exitCode"] = exit_code
    return EcsTaskDetail.model_validate(detail)


def sweeps(w: World, times: int, every: float = 60) -> None:
    for _ in range(times):
        w.advance(every)
        w.service.sweep()


def fault_to_reboot(w: World, job: str = "j", tags: dict[str, str] | None = None) -> list[str]:
    """Rank 1 exits 1 on node-b, DCGM says reboot, rank 0 stops: node-b is rebooted."""
    arns = w.register_job(job, [PEER, FAULTY], tags=tags)
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [check] = w.ecs.health_checks_on(FAULTY)
    w.service.on_health_check_stopped(w.health_check_stopped(check, 1))
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
    return arns


def comes_back(w: World, node: str = FAULTY) -> None:
    """The reboot proven by the agent's outage (disconnect, reconnect with a newer version)."""
    w.ecs.agent_connected[node] = False
    sweeps(w, 1)
    w.ecs.agent_connected[node], w.ecs.versions[node] = True, w.ecs.versions.get(node, 1) + 1
    sweeps(w, 1)


def history_reasons(w: World, job: str = "j") -> list[str]:
    return [str(h.get("reason")) for h in (w.repo.jobs.get_job_item(job) or {}).get("history") or []]


def test_a_rebooted_node_validates_under_load_before_its_job_restarts_on_it() -> None:
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.validating
        assert instance.validation["repair"] == "reboot" and instance.validation["cause"]
        assert not instance.placeable
        # Every other scheduler keeps off it: gpu-recovery.unavailable=validating.
        assert w.ecs.attribute_values[FAULTY][placement.UNAVAILABLE_ATTRIBUTE] == placement.VALIDATING
        job = w.repo.jobs.get_job("j")
        assert job.state is C.JobState.PENDING_RESTART and job.attempt == 1  # waits for the validation
        [task] = validations_on(w, FAULTY)
        assert task.started_by.startswith("gpu-recovery-val-")
        assert instance.validation["task_arn"] == task.arn
        outcome = w.service.on_health_check_stopped(stopped(task, 0, w.now[0]))
        assert outcome.action == "validation_passed"
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.AVAILABLE
        assert not instance.validation and not instance.cordoned
        assert instance.last_validation["result"] == "passed"
        assert placement.UNAVAILABLE_ATTRIBUTE not in w.ecs.attribute_values.get(FAULTY, {})
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2  # restarted once the node proved itself
        assert any("validated node-b after its reboot (DCGM level 1 + 45 s GPU load): passed in" in r
                   for r in history_reasons(w))
        suspect = w.repo.faults.get_suspect("j", 1, FAULTY)
        assert suspect is not None and suspect.validation["result"] == "passed"
        # The event again changes nothing.
        assert w.service.on_health_check_stopped(stopped(task, 0, w.now[0])).action == "duplicate"


def test_the_validation_task_runs_the_level_and_load_configured() -> None:
    seen: list[dict[str, Any]] = []
    with validating_world(validation=ValidationPolicy(enabled=True, dcgm_level=2, load_seconds=120,
                                                      timeout_seconds=900)) as w:
        real = w.ecs.start_task

        def spy(**kwargs: Any) -> Any:
            seen.append(kwargs)
            return real(**kwargs)

        w.ecs.start_task = spy  # type: ignore[method-assign]
        fault_to_reboot(w)
        comes_back(w)
    [call] = [c for c in seen if c.get("group") == C.GPU_VALIDATION_GROUP]
    assert call["task_definition"] == "gpu-health-check"  # the health-check task, extended
    [container] = call["overrides"]["containerOverrides"]
    assert container["name"] == C.HEALTH_CHECK_CONTAINER_NAME
    assert {e["name"]: e["value"] for e in container["environment"]} == {
        "DCGM_LEVEL": "2", "VALIDATION_LOAD_SECONDS": "120"}


def test_a_node_failing_under_load_is_rebooted_again_and_its_job_keeps_waiting() -> None:
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        [task] = validations_on(w, FAULTY)
        for _ in range(2):  # redelivered: one decision, one reboot, one e-mail
            w.service.on_health_check_stopped(stopped(task, 1, w.now[0]))
        assert w.rebooter.calls == [f"i-{FAULTY}", f"i-{FAULTY}"]  # the fault's, then the failure's
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and not instance.validation
        assert instance.cordoned and not instance.cordon.get("validating")  # known bad again
        assert w.ecs.attribute_values[FAULTY][placement.UNAVAILABLE_ATTRIBUTE] == placement.CORDONED
        item = w.repo.instances.get_instance_item(FAULTY)
        causes = [(r["action"], r["cause"]) for r in item["fault_history"]]
        # Counted under the cause of the repair that did not hold.
        assert causes[0][0] == "reboot" and causes == [causes[0], ("reboot", causes[0][1])]
        assert item["fault_history"][-1]["evidence"]["trigger"] == "validation"
        assert item["last_validation"]["result"] == "failed"
        mails = [n for n in w.notifier.sent if n.kind is C.NotificationKind.VALIDATION_FAILED]
        assert len(mails) == 1 and "Jobs waiting for it: j (they keep waiting for it)" in mails[0].body
        job = w.repo.jobs.get_job("j")
        assert job.state is C.JobState.PENDING_RESTART and job.attempt == 1 and job.recoveries_used == 1
        assert any("failed its validation" in r and "repaired again" in r for r in history_reasons(w))
        # The next reboot holds: validated, the job restarts, charged once.
        comes_back(w)
        [_, second] = validations_on(w, FAULTY)
        w.service.on_health_check_stopped(stopped(second, 0, w.now[0]))
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and job.recoveries_used == 1
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE


def test_a_repair_that_never_holds_is_escalated_to_a_replacement_and_the_job_moves() -> None:
    """reboot, reboot (validation failed), then the next failure replaces the node: within
    the escalation's caps, never an endless loop; the relocatable job leaves it."""
    with validating_world() as w:
        w.ecs.spare_nodes = ["node-c"]
        fault_to_reboot(w, tags={C.TAG_RELOCATABLE: "true"})
        for _ in range(2):
            comes_back(w)
            task = validations_on(w, FAULTY)[-1]
            w.service.on_health_check_stopped(stopped(task, 1, w.now[0]))
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.QUARANTINED and not instance.waiting_jobs
        assert len(w.rebooter.calls) == 2
        history = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert [r["action"] for r in history] == ["reboot", "reboot", "replace"]
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and job.relocated  # moved to the spare, never back on node-b
        ranks = {r.rank: r.container_inst_id for r in w.repo.jobs.get_ranks(job) if r.attempt == 2}
        assert ranks[1] == "node-c"


def test_a_job_that_cannot_move_fails_when_its_node_is_replaced_after_failed_validations() -> None:
    with validating_world() as w:
        fault_to_reboot(w)
        for _ in range(2):
            comes_back(w)
            w.service.on_health_check_stopped(stopped(validations_on(w, FAULTY)[-1], 2, w.now[0]))
            if w.repo.instances.get_instance(FAULTY).state is not C.InstanceState.REBOOTING:
                break
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.QUARANTINED
        job = w.repo.jobs.get_job("j")
        assert job.state is C.JobState.FAILED and "quarantined" in job.last_error


def to_the_deadline(w: World, node: str = FAULTY) -> None:
    """The sweep's look just before the validation's ``until`` (the task running), then the
    clock at ``until``, the sweep not run yet."""
    until = float(w.repo.instances.get_instance(node).validation["until"])
    w.advance(until - 1 - w.now[0])
    w.service.sweep()
    w.advance(1)


def test_a_validation_that_passed_whose_event_was_lost_is_read_at_its_deadline_not_failed() -> None:
    """The task exits 0 just before ``until``; its STOPPED event is lost (or dead-lettered):
    at the deadline the sweep asks ECS first and hands the node back as the event would have,
    with no second reboot and nothing in its fault history."""
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        [task] = validations_on(w, FAULTY)
        to_the_deadline(w)
        task.last_status, task.exit_code, task.stopped_at = "STOPPED", 0, w.now[0] - 1  # no event
        w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.AVAILABLE and instance.last_validation["result"] == "passed"
        assert w.rebooter.calls == [f"i-{FAULTY}"] and task.arn not in w.ecs.stop_calls
        history = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert [r["action"] for r in history] == ["reboot"]
        assert w.repo.jobs.get_job("j").attempt == 2
        # The event, late, changes nothing.
        assert w.service.on_health_check_stopped(stopped(task, 0, w.now[0])).action == "duplicate"


def test_a_validation_placed_late_keeps_its_own_time_past_the_nodes_deadline() -> None:
    """Another job's rank holds the GPUs until 100 s before ``until``: the task runs from then
    on; at ``until`` it is neither stopped nor failed, and it passes later."""
    with validating_world() as w:
        fault_to_reboot(w)
        other = w.register_job("k", [FAULTY])
        comes_back(w)
        assert validations_on(w, FAULTY) == []
        until = float(w.repo.instances.get_instance(FAULTY).validation["until"])
        w.advance(until - 100 - w.now[0])
        w.service.on_task_state_change(w.task_stopped(other[0], exit_code=0))
        w.service.sweep()
        [task] = validations_on(w, FAULTY)
        sweeps(w, 4, POLL_SECONDS)  # past until, within its own time: looked at, left running
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.validating and not instance.last_validation and task.arn not in w.ecs.stop_calls
        assert len(w.rebooter.calls) == 1 and instance.deadline_at is not None
        assert w.service.on_health_check_stopped(stopped(task, 0, w.now[0])).action == "validation_passed"
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE


def test_a_validation_task_past_its_own_time_is_stopped_without_a_verdict_not_failed() -> None:
    """The task runs from the node's return and is still running at ``until``: stopped, and
    no verdict (a missing answer never fails a repair): no second reboot, nothing in the
    node's history; it is run again, and passes."""
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        [task] = validations_on(w, FAULTY)
        to_the_deadline(w)
        w.service.sweep()
        assert task.arn in w.ecs.stop_calls
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.validating
        assert not instance.last_validation and len(w.rebooter.calls) == 1
        history = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert [r["action"] for r in history] == ["reboot"]
        [_, again] = validations_on(w, FAULTY)
        assert again.started_by != task.started_by and instance.validation["task_arn"] == again.arn
        # The stopped task's own event is of a claim given back: nothing happens.
        assert w.service.on_health_check_stopped(stopped(task, 143, w.now[0])).action == "duplicate"
        w.service.on_health_check_stopped(stopped(again, 0, w.now[0]))
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE


def test_a_task_the_stack_stopped_for_its_time_is_no_verdict_whatever_its_exit() -> None:
    """The sweep stops the task past its time and dies before its write; the diag, cut short,
    exits 1: the sweep's next look reads the stop as its own, no verdict, not a failure."""
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        [task] = validations_on(w, FAULTY)
        to_the_deadline(w)
        w.repo.fail_once("node_tasks.release", "refuse")
        w.service.sweep()
        assert task.arn in w.ecs.stop_calls
        assert w.repo.instances.get_instance(FAULTY).validation["task_arn"] == task.arn
        task.last_status, task.exit_code, task.stopped_at = "STOPPED", 1, w.now[0]
        task.stop_code, task.stopped_reason = "UserInitiated", "gpu-recovery: validation timed out"
        sweeps(w, 1)
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.validating and not instance.last_validation and len(w.rebooter.calls) == 1
        assert len(validations_on(w, FAULTY)) == 2  # run again


def test_a_throttled_describe_at_the_deadline_decides_nothing_and_the_next_look_does() -> None:
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        [task] = validations_on(w, FAULTY)
        to_the_deadline(w)
        w.ecs.failures["describe_task"] = ["refuse"]
        w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.validating and not instance.last_validation
        assert task.arn not in w.ecs.stop_calls and len(w.rebooter.calls) == 1
        task.last_status, task.exit_code, task.stopped_at = "STOPPED", 0, w.now[0]  # its event lost
        sweeps(w, 1)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert len(w.rebooter.calls) == 1


def test_a_lost_start_answer_is_found_by_its_started_by_never_started_twice() -> None:
    with validating_world() as w:
        fault_to_reboot(w)
        w.ecs.failures["start_task"] = ["lose"]
        with contextlib.suppress(LostResponse):
            comes_back(w)
        sweeps(w, 3)  # the claim's lease expires, the task is looked up by its startedBy
        [task] = validations_on(w, FAULTY)
        assert w.repo.instances.get_instance(FAULTY).validation["task_arn"] == task.arn
        w.service.on_health_check_stopped(stopped(task, 0, w.now[0]))
        assert w.repo.jobs.get_job("j").attempt == 2


def test_a_task_with_the_validations_started_by_but_another_definition_is_not_its_result() -> None:
    """Someone else's task with the validation's group and startedBy exits 0: ignored, the node
    stays validating (out of placement); the stack's own validation task decides."""
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        [task] = validations_on(w, FAULTY)
        outcome = w.service.on_health_check_stopped(stopped(impostor(w, task), 0, w.now[0]))
        assert outcome.action == FOREIGN_TASK
        assert w.repo.instances.get_instance(FAULTY).validating
        w.service.on_health_check_stopped(stopped(task, 0, w.now[0]))
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE


def test_a_task_found_by_its_started_by_that_is_someone_elses_is_not_followed() -> None:
    """The validation's StartTask answer was lost; the task the take-over finds by its startedBy
    runs another task definition (someone else's). The sweep treats it as gone: a new
    validation task of the stack's is started, never a timeout counted as a failed repair."""
    with validating_world() as w:
        fault_to_reboot(w)
        w.ecs.failures["start_task"] = ["lose"]
        with contextlib.suppress(LostResponse):
            comes_back(w)
        [found] = validations_on(w, FAULTY)
        found.task_definition = FOREIGN_DEFINITION
        sweeps(w, 3, POLL_SECONDS)  # the take-over records it, the next look finds it foreign
        [ours] = [t for t in validations_on(w, FAULTY) if t.task_definition != FOREIGN_DEFINITION]
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.validating and instance.validation["task_arn"] == ours.arn
        assert len(w.rebooter.calls) == 1 and not instance.last_validation


def test_a_lost_result_event_is_read_by_the_sweep() -> None:
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        [task] = validations_on(w, FAULTY)
        task.last_status, task.exit_code = "STOPPED", 0  # its event never arrives
        sweeps(w, 1, POLL_SECONDS)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert w.repo.jobs.get_job("j").attempt == 2


def test_a_task_without_a_verdict_is_run_again_then_is_not_a_failed_repair() -> None:
    """Issue 49: every attempt ends without a verdict (CannotPullContainerError,
    ResourceInitializationError): the node is not repaired again nor escalated; it stays
    validating (out of service, as it was), an operator is told once, and it is tried again;
    once the task can run and passes, the node is back and its job restarts."""
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        for attempt in range(START_RETRIES):
            tasks = validations_on(w, FAULTY)
            assert len(tasks) == attempt + 1 and len({t.started_by for t in tasks}) == attempt + 1
            w.service.on_health_check_stopped(stopped(tasks[-1], None, w.now[0]))
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.validating
        assert instance.validation.get("stalled_at") and len(w.rebooter.calls) == 1
        assert w.ecs.attribute_values[FAULTY][placement.UNAVAILABLE_ATTRIBUTE] == placement.VALIDATING
        told = [n for n in w.notifier.sent if "could not run" in n.subject]
        assert len(told) == 1
        sweeps(w, 2)  # tried again
        task = validations_on(w, FAULTY)[-1]
        w.service.on_health_check_stopped(stopped(task, 0, w.now[0]))
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert w.repo.jobs.get_job("j").attempt == 2 and len(w.rebooter.calls) == 1


def test_a_validation_whose_check_could_not_run_is_not_a_failed_repair(tmp_path: Path) -> None:
    """The validation's dcgmi loses its DCGM host engine in every attempt: the real script says
    inconclusive (exit 5). Run again, then stalled (the node stays validating, out of service
    as it was, an operator told once): never rebooted again nor escalated."""
    run = run_check(tmp_path, dcgmi=("dcgmi_host_engine_connection_lost.json", 235),
                    env=ON.task_environment())
    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        for _ in range(START_RETRIES):
            task = validations_on(w, FAULTY)[-1]
            w.service.on_health_check_stopped(stopped(task, run.returncode, w.now[0]))
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.validation.get("stalled_at")
        assert len(w.rebooter.calls) == 1 and not instance.last_validation
        assert len([n for n in w.notifier.sent if "could not run" in n.subject]) == 1


def test_a_validation_that_can_never_be_placed_is_not_a_failed_repair() -> None:
    """Issue 49: ECS places nothing until the validation's time is up: no failed repair (no
    second reboot, no escalation), the node stays validating, an operator is told."""
    with validating_world() as w:
        fault_to_reboot(w)
        w.ecs.failures["start_task"] = ["place_nothing"] * 100
        comes_back(w)
        sweeps(w, int(ON.timeout_seconds // 60) + 2)
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is C.InstanceState.REBOOTING and instance.validating
        assert len(w.rebooter.calls) == 1 and not instance.last_validation
        assert len([n for n in w.notifier.sent if "could not run" in n.subject]) == 1


def test_the_validation_waits_for_ranks_still_on_the_node() -> None:
    with validating_world() as w:
        fault_to_reboot(w)
        other = w.register_job("k", [FAULTY])  # placed by a scheduler that ignored the attribute
        comes_back(w)
        assert validations_on(w, FAULTY) == []  # another job's rank still holds the GPUs
        assert w.repo.instances.get_instance(FAULTY).deadline_at is not None
        w.service.on_task_state_change(w.task_stopped(other[0], exit_code=0))
        sweeps(w, 1)
        assert len(validations_on(w, FAULTY)) == 1


def test_with_validation_off_the_restart_says_so() -> None:
    with world() as w:  # the Settings default: off (a deployment turns it on)
        fault_to_reboot(w)
        comes_back(w)
        assert validations_on(w, FAULTY) == []
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE
        assert w.repo.jobs.get_job("j").attempt == 2
        assert any("node-b not validated after its reboot (validate_after_repair is false)" in r
                   for r in history_reasons(w))


def test_the_node_a_terminated_one_is_replaced_by_is_validated_before_it_takes_work() -> None:
    """replace_action terminate_in_asg: the stack terminates node-b in its group; the node the
    group launches in its place registers, is adopted in validation (cordoned ``validating``)
    and is AVAILABLE only once it passed."""
    with validating_world(remediation=RemediationSettings(replace_action="terminate_in_asg")) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [check] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(check, 2))  # replace
        sweeps(w, 1)
        assert w.replacer.terminated == [f"i-{FAULTY}"]
        watch = w.repo.instances.get_instance(FAULTY).replacement_watch
        assert watch["group"] == "gpu-nodes"
        sweeps(w, 1)  # nothing registered yet: still watching
        assert w.repo.instances.get_instance(FAULTY).replacement_watch == watch
        w.ecs.spare_nodes.append("node-r1")
        w.ecs.registered["node-r1"] = w.now[0] + 1
        sweeps(w, 1)
        new = w.repo.instances.get_instance("node-r1")
        assert new.validating and new.validation["repair"] == "replacement"
        assert new.validation["replaces"] == FAULTY
        assert w.ecs.attribute_values["node-r1"][placement.UNAVAILABLE_ATTRIBUTE] == placement.VALIDATING
        old = w.repo.instances.get_instance_item(FAULTY)
        assert old["replaced_by"] == "node-r1" and "replacement_watch" not in old
        [task] = validations_on(w, "node-r1")
        w.service.on_health_check_stopped(stopped(task, 0, w.now[0]))
        new = w.repo.instances.get_instance("node-r1")
        assert new.state is C.InstanceState.AVAILABLE and not new.cordoned


def test_a_gpu_reset_is_validated_too() -> None:
    with validating_world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [check] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(check, 4))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [reset] = [t for t in w.ecs.tasks.values() if t.group == C.GPU_RESET_GROUP]
        assert w.service.on_health_check_stopped(stopped(reset, 0, w.now[0])).action == "gpu_reset_passed"
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.validating and instance.validation["repair"] == "gpu_reset"
        [task] = validations_on(w, FAULTY)
        w.service.on_health_check_stopped(stopped(task, 0, w.now[0]))
        assert w.repo.jobs.get_job("j").attempt == 2 and w.rebooter.calls == []


def test_the_validation_is_its_own_cause_in_the_jobs_goodput_ledger() -> None:
    """Issue 52: the job waits for its node's reboot, then for the node's validation (70 s
    from its start to its result): the ledger has those 70 s as ``validation``, the rest of
    the wait as ``repair`` (the restart's RUNNING carries the span)."""
    from gpu_recovery.queue.jobs_api.reads import goodput_view

    with validating_world() as w:
        fault_to_reboot(w)
        comes_back(w)
        since = float(w.repo.instances.get_instance(FAULTY).validation["since"])
        [task] = validations_on(w, FAULTY)
        w.advance(70 - (w.now[0] - since))
        assert w.service.on_health_check_stopped(stopped(task, 0, w.now[0])).action == "validation_passed"
        seconds = goodput_view(w.repo.jobs.get_job_item("j"))["seconds"]
    assert seconds["validation"] == 70
    assert seconds["repair"] > 0
