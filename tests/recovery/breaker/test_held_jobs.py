"""A job that cannot move waits (HELD) for a node whose reboot the blast-radius breaker
held back, instead of failing for it (issue 19), with fakes of the ports: entered once
every verdict is in and every old rank ended, not charged while held, carried on by a
reset that resumes the backlog, failed by a dropped backlog or its deadline, and told."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState, NotificationKind
from gpu_recovery.recovery.breaker.operations import reset_breaker
from gpu_recovery.repository.scheduling import SchedulingRepository
from tests.fixtures.history import state_changes
from tests.recovery.breaker.steps import PEER, reboot_fault, running_on, sent, sweep_minutes
from tests.recovery.fakes import World, world
from tests.recovery.remediation_steps import FAULTY

SPARE = "node-c"


def _held(w: World, job_id: str = "j", **tags: str) -> list[str]:
    """The breaker tripped by other nodes, then a fault on node-b that needs a reboot."""
    arns = w.register_job(job_id, [PEER, FAULTY], tags=tags or None)
    w.trip_breaker(["x-1", "x-2"])
    reboot_fault(w, arns)
    return arns


def _reset_and_back(w: World) -> None:
    """The operator resumes the backlog; the sweep reboots node-b and it comes back."""
    assert reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=True, by="oncall").done
    sweep_minutes(w, 1)
    assert w.rebooter.calls == [f"i-{FAULTY}"]
    t = w.now[0]
    for connected, version, at in ((False, 11, t + 5), (True, 12, t + 90)):
        w.service.on_container_instance_change(w.instance_event(FAULTY, connected=connected,
                                                                version=version, at=at))
    assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.AVAILABLE


def test_a_job_on_a_held_node_waits_held_uncharged_and_operators_are_told() -> None:
    """Given the breaker tripped, When a non-relocatable job's node needs a reboot, Then the
    job is HELD (not FAILED) on that node once its ranks ended, nothing is charged, its
    healthy node stays reserved, and one e-mail says which node it waits for and what a
    reset does; the sweep keeps it waiting while the breaker holds."""
    with world() as w:
        _held(w)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.HELD and job.recoveries_used == 0
        assert job.breaker_hold is not None and job.breaker_hold.nodes == (FAULTY,)
        assert job.breaker_hold.seconds == 3600 and job.tally.held == 1
        assert w.rebooter.calls == []
        [mail] = sent(w, NotificationKind.JOB_HELD)
        assert f"Job HELD on {FAULTY}, not failed" in mail
        assert f"--resume-backlog` reboots {FAULTY} now; the job restarts on its nodes" in mail
        assert "`--drop-backlog` fails the job" in mail
        sweep_minutes(w, 5)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.HELD and job.recoveries_used == 0
        assert not sent(w, NotificationKind.FAILED) and len(sent(w, NotificationKind.JOB_HELD)) == 1
        # Its nodes are held for its restart: the scheduler's index of jobs in recovery lists it.
        assert [i["job_id"] for i in SchedulingRepository(w.repo.jobs).jobs_in_recovery()] == ["j"]


def test_a_reset_that_resumes_the_backlog_reboots_the_node_and_the_held_job_restarts() -> None:
    """When the operator resets the breaker with --resume-backlog, Then the sweep reboots the
    node, the job stays HELD while it reboots, and once the node is back the job restarts
    on its own nodes (attempt 2), charged once for the fault."""
    with world() as w:
        _held(w)
        _reset_and_back(w)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.HELD and job.recoveries_used == 0  # the sweep notices it
        sweep_minutes(w, 1)
        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2
        assert job.recoveries_used == 1
        assert running_on(w) == [PEER, FAULTY]
        history = [h["to"] for h in state_changes((w.repo.jobs.get_job_item("j") or {})["history"])]
        held_at = history.index("HELD")
        assert history[held_at:held_at + 3] == ["HELD", "PENDING_RESTART", "STARTING"]


def test_the_held_job_waits_while_the_released_node_reboots() -> None:
    with world() as w:
        _held(w)
        assert reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=True, by="oncall").done
        sweep_minutes(w, 3)
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.REBOOTING
        assert w.repo.jobs.get_job("j").state is JobState.HELD


def test_a_refused_hold_is_finished_by_the_sweep_and_a_lost_resume_is_not_charged_twice() -> None:
    """Given the write that holds the job refused (throttled), Then the job is still
    PENDING_RESTART and the sweep holds it (one e-mail); Given the answer of the write that
    lets it go on lost, 80 min after the fault (past the restart's usual give-up time), Then
    the next sweep restarts it, charged once."""
    with world(held_job_deadline_seconds=7200) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.trip_breaker(["x-1", "x-2"])
        w.repo.fail_once("breaker.hold_job", "refuse")
        with pytest.raises(TimeoutError):  # the event is retried; the sweep finishes it anyway
            reboot_fault(w, arns)
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        sweep_minutes(w, 1)
        assert w.repo.jobs.get_job("j").state is JobState.HELD
        assert len(sent(w, NotificationKind.JOB_HELD)) == 1
        w.advance(80 * 60)
        w.service.sweep()
        assert w.repo.jobs.get_job("j").state is JobState.HELD
        _reset_and_back(w)
        w.repo.fail_once("breaker.resume_held_job", "lose")
        sweep_minutes(w, 1)  # the step fails after the write: the job is PENDING_RESTART
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_RESTART and job.recoveries_used == 1
        sweep_minutes(w, 1)
        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2
        assert job.recoveries_used == 1 and running_on(w) == [PEER, FAULTY]


def test_a_reset_that_drops_the_backlog_fails_the_held_job_saying_so() -> None:
    """When the operator drops the backlog, Then nothing will reboot the node: the next
    sweep fails the held job with that reason (naming the node and who dropped it); the
    node stays SUSPECT and cordoned."""
    with world() as w:
        _held(w)
        assert reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=False, by="oncall").done
        sweep_minutes(w, 1)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED
        assert job.last_error.startswith("the blast-radius breaker's backlog was dropped by oncall")
        assert f"nothing will reboot {FAULTY}" in job.last_error
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.SUSPECT and inst.cordoned and w.rebooter.calls == []
        [mail] = sent(w, NotificationKind.FAILED)
        assert "backlog was dropped" in mail


def test_a_held_job_fails_at_its_deadline_naming_the_node_and_the_hold() -> None:
    with world(held_job_deadline_seconds=300) as w:
        _held(w)
        sweep_minutes(w, 4)
        assert w.repo.jobs.get_job("j").state is JobState.HELD
        sweep_minutes(w, 2)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED and job.recoveries_used == 0
        assert job.last_error == (f"held 300 s (held_job_deadline_seconds) waiting for the reboot of "
                                  f"{FAULTY}, held back by the blast-radius breaker; nobody reset the "
                                  "breaker in time")
        assert len(sent(w, NotificationKind.FAILED)) == 1


def test_a_deadline_of_zero_fails_the_job_at_once_as_before() -> None:
    with world(held_job_deadline_seconds=0) as w:
        _held(w)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED and "not carried out" in job.last_error
        assert not sent(w, NotificationKind.JOB_HELD)


def test_a_relocatable_job_moves_off_the_held_node_instead_of_waiting() -> None:
    with world() as w:
        w.ecs.spare_nodes = [SPARE]
        _held(w, **{C.TAG_RELOCATABLE: "true"})
        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.breaker_hold is None
        assert {a: m["node"] for a, m in w.repo.faults.placement("j", 2).items()} == {FAULTY: SPARE}


def test_the_breaker_tripped_mail_says_which_job_waits_on_which_node_and_what_a_reset_does() -> None:
    """Given one node already in the breaker's window of a 2-node cluster, When node-b's
    fault trips it, Then its one e-mail lists node-b, the job that waits there, that
    --resume-backlog reboots it and restarts the job, and that --drop-backlog fails it."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.trip_breaker(["x-1"])
        reboot_fault(w, arns)
        [mail] = sent(w, NotificationKind.BREAKER_TRIPPED)
        assert (f"Held: {FAULTY} needs reboot (jobs on it: j (waits HELD until the breaker closes (by itself "
                "or reset), not failed, budget not charged)); --resume-backlog reboots it; it is uncordoned "
                "and takes work again once back, and j restart(s) on their nodes then;") in mail
        assert "and fails j" in mail and "fail 3600 s after they were held" in mail
        assert w.repo.jobs.get_job("j").state is JobState.HELD


def test_breaker_show_lists_the_held_jobs_and_the_nodes_they_wait_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    from cli.admin import breaker_command

    with world() as w:
        _held(w)
        assert breaker_command(argparse.Namespace(breaker_command="show", json=True), w.repo, w.now[0]) == 0
        shown = json.loads(capsys.readouterr().out)
        [held] = shown["held_jobs"]
        assert (held["job_id"], held["nodes"], held["until"] - held["since"]) == ("j", [FAULTY], 3600)


def test_a_held_fault_whose_job_went_on_before_it_was_ever_held_is_charged_once() -> None:
    """Given a non-relocatable job whose node's reboot the breaker held back, and every write
    that would hold the job refused until the operator's reset had the node rebooted and back,
    Then the job goes on from PENDING_RESTART without ever being HELD, charged once for the
    fault, as a job that was HELD is when it goes on (its verdict left the charge to then)."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.trip_breaker(["x-1", "x-2"])
        w.repo.fail_once("breaker.hold_job", "refuse")
        with pytest.raises(TimeoutError):
            reboot_fault(w, arns)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_RESTART and job.recoveries_used == 0
        assert reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=True, by="oncall").done
        w.repo.fail_once("breaker.hold_job", "refuse")
        sweep_minutes(w, 1)  # node-b rebooted; the job's hold refused again
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        t = w.now[0]
        for connected, version, at in ((False, 11, t + 5), (True, 12, t + 90)):
            w.service.on_container_instance_change(w.instance_event(FAULTY, connected=connected,
                                                                    version=version, at=at))
        sweep_minutes(w, 1)
        job = w.repo.jobs.get_job("j")
        history = [h["to"] for h in state_changes((w.repo.jobs.get_job_item("j") or {})["history"])]
        assert "HELD" not in history
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2
        assert job.recoveries_used == 1 and running_on(w) == [PEER, FAULTY]
        w.advance(3600)
        w.service.sweep()
        assert w.repo.jobs.get_job("j").recoveries_used == 1


def test_a_job_held_again_on_its_fault_after_going_on_is_not_charged_again() -> None:
    """Given a HELD job that went on (charged once) and, on the same fault, was held again
    before its restart (a node it waits for held back again: ``HeldJobs.hold`` keeps the
    first hold's record), When it goes on again, Then nothing more is charged."""
    with world() as w:
        _held(w)
        job = w.repo.jobs.get_job("j")
        assert job.breaker_hold is not None and job.breaker_hold.spend == "infrastructure"
        assert w.repo.breaker.resume_held_job(job, job.breaker_hold, "every node back", w.now[0])
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_RESTART and job.recoveries_used == 1
        assert job.breaker_hold is not None
        again = replace(job.breaker_hold, resumed_at=None)  # as HeldJobs.hold re-enters it
        assert w.repo.breaker.hold_job(job, again, w.now[0] + 60)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.HELD and job.breaker_hold is not None
        assert w.repo.breaker.resume_held_job(job, job.breaker_hold, "every node back", w.now[0])
        assert w.repo.jobs.get_job("j").recoveries_used == 1
