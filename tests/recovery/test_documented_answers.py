"""The recovery stages on answers AWS documents (issue 40): a health check's verdict line
readable only seconds after its STOPPED event (defect 8), and ECS answering ``MISSING``
inside a successful DescribeTasks / DescribeContainerInstances (the ``failures`` check)."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import HEALTH_CHECK_GROUP, InstanceState, JobState
from gpu_recovery.recovery import Invocation
from gpu_recovery.recovery.health_check_verdicts import VERDICT_LOG_GRACE_SECONDS, VERDICT_LOG_RETRY_SECONDS
from tests.recovery.fakes import World, world

FAULTY, PEER = "node-b", "node-a"
LINE = {"verdict": "reboot", "exit_code": 1, "failed_tests": ["memory"],
        "reasons": ["gpu 3: 2 uncorrected volatile ECC errors"]}


class LateLine:
    """The check's verdict line, readable from the ``readable_from``-th read on (None: never)."""

    def __init__(self, readable_from: int | None) -> None:
        self.readable_from = readable_from
        self.reads = 0

    def read_verdict(self, task_arn: str) -> dict[str, Any] | None:
        self.reads += 1
        return dict(LINE) if self.readable_from is not None and self.reads >= self.readable_from else None


def _checking(w: World) -> Any:
    """Rank 1 on the faulty node exits 1: its node's DCGM check runs; returns the check."""
    arns = w.register_job("j", [PEER, FAULTY])
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [task] = w.ecs.health_checks_on(FAULTY)
    return task


def _invocation(w: World) -> Invocation:
    return Invocation("request-1", w.now[0] + 900)


def test_a_verdict_line_readable_seconds_after_the_stopped_event_is_waited_for() -> None:
    """Given the check's verdict line becomes readable only on the third read (CloudWatch
    Logs ingests a line some seconds after it was written), When its STOPPED event is
    handled, Then the invocation reads again after short pauses and the verdict is applied
    with the line's evidence (not on the exit code alone)."""
    reader = LateLine(readable_from=3)
    with world(verdicts=reader) as w:
        task = _checking(w)
        started = w.now[0]
        outcome = w.service.on_health_check_stopped(w.health_check_stopped(task, 1), _invocation(w))
        assert outcome.action == "verdict_applied"
        assert reader.reads == 3 and 0 < w.now[0] - started < 30
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        assert w.repo.instances.get_instance_item(FAULTY)["last_verdict"]["failed_tests"] == ["memory"]


def test_a_verdict_line_still_unreadable_is_left_for_the_sweep_not_guessed_from_the_exit_code() -> None:
    """Given the verdict line is not readable within the invocation, When the STOPPED event is
    handled, Then nothing is decided (the node stays HEALTH_CHECKING, no reboot) and the
    sweep's poll comes back within a minute; once the line is readable the sweep (reading the
    task from DescribeTasks) applies the verdict with its evidence."""
    reader = LateLine(readable_from=None)
    with world(verdicts=reader) as w:
        task = _checking(w)
        outcome = w.service.on_health_check_stopped(w.health_check_stopped(task, 1), _invocation(w))
        assert outcome.action == "verdict_log_pending"
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.HEALTH_CHECKING and instance.check.task_arn == task.arn
        assert (instance.deadline_at or 0) <= w.now[0] + VERDICT_LOG_RETRY_SECONDS
        assert w.rebooter.calls == [] and w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
        reader.readable_from = reader.reads + 1
        w.advance(VERDICT_LOG_RETRY_SECONDS)
        w.service.sweep()
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        assert w.repo.instances.get_instance_item(FAULTY)["last_verdict"]["failed_tests"] == ["memory"]
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def _stopped_then_polled_past_the_grace(w: World, polls: int) -> None:
    """The check exits 1 and its STOPPED event is handled; the sweep polls each minute until
    ``polls`` polls past the grace, nothing decided within the grace."""
    task = _checking(w)
    w.service.on_health_check_stopped(w.health_check_stopped(task, 1), _invocation(w))
    stopped = w.now[0]
    while w.now[0] < stopped + VERDICT_LOG_GRACE_SECONDS + polls * VERDICT_LOG_RETRY_SECONDS:
        w.advance(VERDICT_LOG_RETRY_SECONDS)
        w.service.sweep()
        if w.now[0] < stopped + VERDICT_LOG_GRACE_SECONDS - VERDICT_LOG_RETRY_SECONDS:
            assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECKING


def test_a_verdict_line_never_readable_is_decided_on_the_exit_code_after_the_grace() -> None:
    """Given the verdict line never becomes readable (the log driver lost it), Then the sweep
    keeps the check waiting until the grace after the task stopped, then decides on the
    exit code (the check's contract): the node is rebooted, once."""
    with world(verdicts=LateLine(readable_from=None)) as w:
        _stopped_then_polled_past_the_grace(w, polls=2)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        assert w.rebooter.calls == [f"i-{FAULTY}"]


class FailingReads(LateLine):
    """Every read of the verdict line fails (GetLogEvents throttled) while ``failing``; then the
    line is there."""

    def __init__(self) -> None:
        super().__init__(readable_from=1)
        self.failing = True

    def read_verdict(self, task_arn: str) -> dict[str, Any] | None:
        if self.failing:
            self.reads += 1
            raise TimeoutError("GetLogEvents: throttled")
        return super().read_verdict(task_arn)


def test_a_verdict_line_whose_reads_fail_past_the_grace_is_read_again_not_decided_on_the_exit_code() -> None:
    """Given every read of the verdict line failing (the stack's reads, not a line lost) past
    the grace, When the sweep polls, Then nothing is decided on the exit code alone while the
    check has time (8 % sweep two_faults s197: three failed reads, a TIMEOUT exit code's
    quarantine where the line allowed a reboot); once a read works, the verdict is applied with
    the line's evidence."""
    reader = FailingReads()
    with world(verdicts=reader) as w:
        _stopped_then_polled_past_the_grace(w, polls=3)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECKING
        assert w.rebooter.calls == [] and reader.reads > 4
        reader.failing = False
        w.advance(VERDICT_LOG_RETRY_SECONDS)
        w.service.sweep()
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        assert w.repo.instances.get_instance_item(FAULTY)["last_verdict"]["failed_tests"] == ["memory"]


def _rebooting(w: World) -> None:
    """Rank 1's node faults, its check says reboot; rank 0 stopped by the recovery."""
    arns = w.register_job("j", [PEER, FAULTY])
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [task] = w.ecs.health_checks_on(FAULTY)
    w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
    assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
    w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=143, stop_code="UserInitiated",
                                                  reason="gpu-recovery: suspected GPU fault"))


def test_an_instance_ecs_answers_missing_is_no_agent_disconnect() -> None:
    """Given a REBOOTING node that DescribeContainerInstances answers MISSING (in
    ``failures``) this minute, When the sweep and a boot report look at it, Then no agent
    disconnect is recorded (a stale "connected" event could otherwise mark it back
    without a reboot) and the reboot is not issued again."""
    with world() as w:
        _rebooting(w)
        w.ecs.missing_nodes.add(FAULTY)
        w.advance(60)
        w.service.sweep()
        assert w.service.on_boot_reported(FAULTY, w.now[0] - 5).action == "ignored"
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.REBOOTING and instance.disconnected_at is None
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def _restarted(w: World, before: set[str]) -> set[str]:
    return {a for a, t in w.ecs.tasks.items() if a not in before and t.group != HEALTH_CHECK_GROUP}


def test_a_restart_whose_started_tasks_ecs_answers_missing_never_starts_a_rank_twice() -> None:
    """Given the gang restart's StartTask executed but its answer was lost, and the taker-over
    of its lease finds the tasks by startedBy but DescribeTasks answers them MISSING (not
    caught up), When the restart is tried again, Then nothing is started while ECS cannot say
    where they run; once it can, they are registered: one task per rank, ever."""
    with world() as w:
        _rebooting(w)
        training = {a for a, t in w.ecs.tasks.items() if t.group == "family:train"}
        w.ecs.failures["start_task"] = ["lose"]
        w.service.on_container_instance_change(w.instance_event(FAULTY, connected=False, version=11,
                                                                 at=w.now[0] + 10))
        w.service.on_container_instance_change(w.instance_event(FAULTY, connected=True, version=12,
                                                                 at=w.now[0] + 200))
        started = _restarted(w, training)
        assert len(started) == 2, w.ecs.tasks  # the lost answer's tasks, one per rank
        w.ecs.missing_tasks |= started
        for _ in range(4):
            w.advance(60)
            w.service.sweep()
        assert _restarted(w, training) == started
        w.ecs.missing_tasks.clear()
        for _ in range(4):
            w.advance(60)
            w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.attempt == 2 and {w.repo.jobs.get_rank("j", r).task_arn for r in (0, 1)} == started
        assert _restarted(w, training) == started
