"""Issue 49: missing evidence is not bad evidence. A DCGM check whose verdict cannot be had
(its STOPPED event lost and its log line unreadable, a check that hangs, one that cannot
start) never quarantines its node nor fails its job: the verdict is read from the stopped
task when it can be, else the node leaves its check as it was, an operator is told, and the
job goes on without spending a recovery. A reboot the stack cannot prove is settled by
asking the node, not by a quarantine. The recovery with fakes of the ports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.states import InstanceState, JobState
from gpu_recovery.domain.validation import ValidationPolicy
from tests.health_check.script_runner import run_check
from tests.recovery.fakes import World, world

PEER, FAULTY = "node-a", "node-b"
TIMEOUT = 30 * 60  # health_check_timeout_seconds (the default)


def _check_running(w: World) -> None:
    """Rank 1 exits 1 (its application's own error): node-b's DCGM check starts."""
    arns = w.register_job("j", [PEER, FAULTY])
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    assert w.ecs.health_checks_on(FAULTY)


def _unreadable_log(w: World) -> None:
    def failing(task_arn: str) -> None:
        raise TimeoutError("GetLogEvents: throttled")

    w.service.health.verdicts.reader.read_verdict = failing  # type: ignore[method-assign]


def _not_condemned(w: World) -> None:
    """The node back in service, the job restarting, no budget spent, nobody failed."""
    instance = w.repo.instances.get_instance(FAULTY)
    assert instance.state is InstanceState.AVAILABLE and not instance.drain_pending
    assert w.ecs.drained == [] and w.rebooter.calls == []
    job = w.repo.jobs.get_job("j")
    assert job.state in (JobState.PENDING_HEALTHCHECK, JobState.PENDING_RESTART), job.state
    suspect = w.repo.faults.get_suspect("j", 1, FAULTY)
    assert suspect is not None and not suspect.pending and suspect.findings["verdict"] == "undiagnosed"
    assert (job.recoveries_used, job.app_restarts_used) == (0, 0)
    assert not (w.repo.instances.get_instance_item(FAULTY) or {}).get("fault_history")


def test_a_diag_that_passed_whose_event_was_lost_and_log_unreadable_is_decided_by_its_exit_code() -> None:
    """The issue's case: the diag passed (exit 0), its STOPPED event was dead-lettered and
    every read of its log line fails. By the check's timeout the sweep decides on the
    stopped task's exit code: healthy, the job restarts (application error), the node is
    not quarantined and the job not failed for health_check_timeout."""
    with world() as w:
        _check_running(w)
        [task] = w.ecs.health_checks_on(FAULTY)
        w.health_check_stopped(task, 0)  # the event itself never delivered
        _unreadable_log(w)
        for _ in range(TIMEOUT // 300 + 2):
            w.advance(300)
            w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.AVAILABLE and w.ecs.drained == []
        job = w.repo.jobs.get_job("j")
        assert job.state is not JobState.FAILED and "health check" not in (job.last_error or "")
        suspect = w.repo.faults.get_suspect("j", 1, FAULTY)
        assert suspect is not None and suspect.findings["verdict"] == "healthy"


def test_a_check_with_no_verdict_by_its_timeout_leaves_the_node_as_it_was_and_tells_an_operator() -> None:
    """A check that never ends (no verdict by health_check_timeout_seconds): stopped, the
    node back in service (not quarantined, nothing in its history), one e-mail to the
    operator, the job restarting without spending a recovery."""
    with world() as w:
        _check_running(w)
        [task] = w.ecs.health_checks_on(FAULTY)
        w.advance(TIMEOUT + 60)
        w.service.sweep()
        assert task.arn in w.ecs.stop_calls
        _not_condemned(w)
        told = [n for n in w.notifier.sent if n.kind is C.NotificationKind.HEALTH_CHECK_TIMEOUT]
        assert len(told) == 1 and "no verdict" in told[0].subject and not told[0].job_id
        assert not any(n.job_id == "j" and "FAILED" in n.body for n in w.notifier.sent)


def test_a_check_that_cannot_be_placed_does_not_count_against_the_node() -> None:
    """Every placement of the check refused (its start retries spent): the node is not
    marked SUSPECT, the job is not failed; an operator is told."""
    with world(health_check_start_retries=2) as w:
        w.ecs.failures["start_task"] = ["place_nothing"] * 10
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        for _ in range(4):
            w.advance(61)
            w.service.sweep()
        assert w.ecs.health_checks_on(FAULTY) == []
        _not_condemned(w)
        assert [n for n in w.notifier.sent if n.kind is C.NotificationKind.HEALTH_CHECK_TIMEOUT]


def test_a_check_ecs_cannot_place_where_the_agent_is_away_leaves_a_suspect_for_its_own_check() -> None:
    """Every placement of the check refused while ECS reads the node's agent disconnected (a node
    that lost power, ECS answering AGENT): the node is no node to go back to, and no node to
    condemn either. It leaves its check SUSPECT with the lost node's origin (no new queue work,
    nothing in its history, no drain, reboot or breaker entry), marked for its events, the job
    going on without spending a recovery, one e-mail saying so. When its agent is back the sweep's
    look starts the stack's own check, whose pass returns it to AVAILABLE."""
    from gpu_recovery.constants import GPU_VALIDATION_GROUP, LOST_NODE_ATTRIBUTE

    with world(health_check_start_retries=2) as w:
        w.ecs.failures["start_task"] = ["place_nothing"] * 10
        w.ecs.agent_connected[FAULTY] = False
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        for _ in range(4):
            w.advance(61)
            w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.lost_node_suspect, instance.state
        assert w.ecs.drained == [] and w.rebooter.calls == []
        assert not (w.repo.instances.get_instance_item(FAULTY) or {}).get("fault_history")
        assert LOST_NODE_ATTRIBUTE in w.ecs.attributes.get(FAULTY, set())
        job = w.repo.jobs.get_job("j")
        assert job.state is not JobState.FAILED and (job.recoveries_used, job.app_restarts_used) == (0, 0)
        [told] = [n for n in w.notifier.sent if n.kind is C.NotificationKind.HEALTH_CHECK_TIMEOUT]
        assert "ECS agent is disconnected: flagged SUSPECT" in told.body and "flagged SUSPECT" in told.subject

        w.ecs.failures["start_task"] = []
        w.ecs.agent_connected[FAULTY] = True
        for _ in range(6):  # the lost node's look, every 5 minutes
            w.advance(61)
            w.service.sweep()
        [check] = [t for t in w.ecs.tasks.values() if t.node == FAULTY and t.group == GPU_VALIDATION_GROUP]
        passed = w.health_check_stopped(check, 0).model_copy(update={"group": GPU_VALIDATION_GROUP})
        assert w.service.on_health_check_stopped(passed).action == "validation_passed"
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.AVAILABLE


def _two_suspects_one_undiagnosed(w: World, *, undiagnosed_first: bool, peer_exit: int = 0) -> None:
    """Both ranks exit 1 (suspected GPU faults): node-b's check is never placed (undiagnosed once
    its start retries are spent), node-a's ends with ``peer_exit`` (0: healthy), in the order given."""
    arns = w.register_job("j", [PEER, FAULTY])
    w.ecs.failures["start_task"] = ["place_nothing"]  # node-b's first start
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
    [peer_check] = w.ecs.health_checks_on(PEER)
    w.ecs.failures["start_task"] = ["place_nothing"] * 10
    if not undiagnosed_first:
        w.service.on_health_check_stopped(w.health_check_stopped(peer_check, peer_exit))
    for _ in range(5):
        w.advance(61)
        w.service.sweep()
    assert w.repo.faults.get_suspect("j", 1, FAULTY).findings["verdict"] == "undiagnosed"
    if undiagnosed_first:
        w.service.on_health_check_stopped(w.health_check_stopped(peer_check, peer_exit))


def test_a_fault_one_of_whose_suspects_went_undiagnosed_is_no_ones_to_pay_in_either_order() -> None:
    """Two suspects, one found healthy and one the stack's check could not judge: whose the
    fault was is not known, so the job restarts without spending any budget, whichever verdict
    comes last (it failed as an application error, its application budget 0, when the healthy
    verdict came last: a missing answer made the tenant's program the culprit)."""
    for undiagnosed_first in (True, False):
        with world(health_check_start_retries=2) as w:
            _two_suspects_one_undiagnosed(w, undiagnosed_first=undiagnosed_first)
            job = w.repo.jobs.get_job("j")
            assert job.state is not JobState.FAILED, (undiagnosed_first, job.last_error)
            assert job.attempt == 2 and (job.recoveries_used, job.app_restarts_used) == (0, 0)


def test_a_fault_whose_other_suspect_was_found_bad_is_charged_as_found_in_either_order() -> None:
    """Two suspects, one the DCGM check finds in need of a reboot and one it could not judge: the
    fault was found (the bad node explains it), so the job's infrastructure budget pays its
    recovery, whichever verdict comes last."""
    for undiagnosed_first in (True, False):
        with world(health_check_start_retries=2) as w:
            _two_suspects_one_undiagnosed(w, undiagnosed_first=undiagnosed_first, peer_exit=1)
            job = w.repo.jobs.get_job("j")
            assert w.repo.instances.get_instance(PEER).state is InstanceState.REBOOTING
            assert (job.recoveries_used, job.app_restarts_used) == (1, 0), (undiagnosed_first, job)


class _ScriptLine:
    """The verdict line the real health-check script printed."""

    def __init__(self, line: dict[str, Any]) -> None:
        self.line = line

    def read_verdict(self, task_arn: str) -> dict[str, Any]:
        return self.line


def test_a_check_that_could_not_run_is_run_again_then_leaves_the_node_as_it_was(tmp_path: Path) -> None:
    """The check's dcgmi loses its DCGM host engine (no test ran): the real script says
    inconclusive (exit 5), no verdict. Each attempt is run again; when every one says so the node
    leaves its check as it was (undiagnosed), an operator is told, and nothing is rebooted."""
    run = run_check(tmp_path, dcgmi=("dcgmi_host_engine_connection_lost.json", 235))
    with world(health_check_start_retries=3, verdicts=_ScriptLine(run.verdict)) as w:
        _check_running(w)
        for _ in range(3):
            [check] = [t for t in w.ecs.health_checks_on(FAULTY) if t.last_status != "STOPPED"]
            outcome = w.service.on_health_check_stopped(w.health_check_stopped(check, run.returncode))
            assert outcome.action == "health_check_retry"
            for _ in range(3):
                w.advance(61)
                w.service.sweep()
        assert w.rebooter.calls == []
        _not_condemned(w)
        told = [n for n in w.notifier.sent if n.kind is C.NotificationKind.HEALTH_CHECK_TIMEOUT]
        assert len(told) == 1 and "could not run" in told[0].body


def _rebooting(w: World) -> None:
    """Rank 1 exits 1, DCGM says reboot, rank 0 stops: node-b REBOOTING, its reboot issued."""
    arns = w.register_job("j", [PEER, FAULTY])
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [check] = w.ecs.health_checks_on(FAULTY)
    w.service.on_health_check_stopped(w.health_check_stopped(check, 1))
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
    assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING and w.rebooter.calls


def test_a_reboot_the_stack_cannot_prove_is_settled_by_asking_the_node_not_by_a_quarantine() -> None:
    """Issue 49: the reboot was issued, but no agent outage was ever seen (the reboot's
    events lost, or too quick to see); at the reboot's timeout the node's agent answers. It is
    not quarantined: it is back as from its reboot, and its job restarts."""
    with world() as w:
        _rebooting(w)
        for _ in range(32):
            w.advance(60)
            w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.AVAILABLE and w.ecs.drained == []
        assert not (w.repo.instances.get_instance_item(FAULTY) or {}).get("quarantine_reason")
        assert w.repo.jobs.get_job("j").state is not JobState.FAILED


def test_a_reboot_across_which_the_agent_was_updated_is_settled_by_asking_the_node() -> None:
    """Issue 49: an agent outage was seen, but the ECS agent came back with another version
    (an agent update, not proof of a reboot): the node is not taken back on that outage, and
    not quarantined at the reboot's timeout either; the node answers, so it is back."""
    with world() as w:
        _rebooting(w)
        t = w.now[0]
        w.service.on_container_instance_change(w.instance_event(FAULTY, connected=False, version=11,
                                                                at=t + 20, agent="1.80.0"))
        back = w.instance_event(FAULTY, connected=True, version=12, at=t + 200, agent="1.81.0")
        assert w.service.on_container_instance_change(back).action != "instance_available"
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        for _ in range(32):
            w.advance(60)
            w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.AVAILABLE and w.ecs.drained == []
        assert not (w.repo.instances.get_instance_item(FAULTY) or {}).get("quarantine_reason")
        assert w.repo.jobs.get_job("j").state is not JobState.FAILED


def test_with_validation_on_an_unproven_reboot_is_settled_by_the_nodes_validation() -> None:
    policy = ValidationPolicy(enabled=True, dcgm_level=1, load_seconds=45, timeout_seconds=600)
    with world(validation=policy) as w:
        _rebooting(w)
        for _ in range(32):
            w.advance(60)
            w.service.sweep()
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.REBOOTING and instance.validating
        assert w.ecs.drained == []
