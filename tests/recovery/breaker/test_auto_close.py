"""The blast-radius breaker closes by itself when remediation worked (issue 29, half-open),
with fakes of the ports: a window after the trip, with the node it had acted on back
healthy, the sweep closes it in one transaction that owes one e-mail and releases the
backlog as an operator's --resume-backlog does; a node that failed again leaves it open
until an operator resets it, said once; a duplicate sweep changes nothing."""

from __future__ import annotations

import argparse
import json

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState, NotificationKind
from gpu_recovery.domain.breaker import breaker as policy
from gpu_recovery.domain.breaker.breaker import BreakerPolicy
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.recovery.breaker.operations import reset_breaker
from tests.recovery.breaker.steps import PEER, reboot_fault, running_on, sent, sweep_minutes
from tests.recovery.fakes import World, world
from tests.recovery.remediation_steps import FAULTY

REBOOTED = "node-x"  # rebooted a minute before the fault, in the breaker's window
WINDOW = 600


def _tripped(w: World) -> None:
    """node-x was rebooted (and is back, AVAILABLE) a minute ago; node-b's reboot then trips
    the breaker of this small cluster (limit 1 per window): its job waits HELD."""
    w.repo.instances.put_instance_if_absent(Instance(REBOOTED, C.InstanceState.AVAILABLE))
    w.trip_breaker([REBOOTED])
    arns = w.register_job("j", [PEER, FAULTY])
    reboot_fault(w, arns)
    stored = w.repo.breaker.read()
    assert stored["state"] == policy.TRIPPED and stored["tripped_nodes"] == [REBOOTED]
    assert w.repo.jobs.get_job("j").state is JobState.HELD


def _back(w: World, node: str) -> None:
    t = w.now[0]
    for connected, version, at in ((False, 11, t + 5), (True, 12, t + 90)):
        w.service.on_container_instance_change(w.instance_event(node, connected=connected, version=version,
                                                                at=at))


def test_it_closes_by_itself_a_window_after_the_trip_releases_the_backlog_and_says_so_once() -> None:
    """Given the node it acted on back healthy, When a window has passed since the trip,
    Then the sweep closes it (by itself, not an operator), owes and sends one e-mail naming
    the node and the released action, reboots node-b at the window's rate, and the HELD job
    restarts on its nodes once node-b is back; later sweeps send nothing more."""
    with world() as w:
        _tripped(w)
        tripped_at = w.repo.breaker.read()["tripped_at"]
        while w.now[0] + 61 < tripped_at + WINDOW:
            sweep_minutes(w, 1)
            assert w.repo.breaker.read()["state"] == policy.TRIPPED
        assert w.rebooter.calls == [] and not sent(w, NotificationKind.BREAKER_CLOSED)
        sweep_minutes(w, 1)
        stored = w.repo.breaker.read()
        assert stored["state"] == policy.CLOSED and stored["last_reset_by"] == policy.CLOSED_BY_ITSELF
        [mail] = sent(w, NotificationKind.BREAKER_CLOSED)
        assert (f"breaker closed by itself: nodes {REBOOTED} back healthy; 1 held-back action(s) released at "
                "the window's rate") in mail
        assert f"Released: reboot of {FAULTY}" in mail
        assert w.rebooter.calls == [f"i-{FAULTY}"]  # released in the same sweep
        _back(w, FAULTY)
        sweep_minutes(w, 2)
        job = w.repo.jobs.get_job("j")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2
        assert running_on(w) == [PEER, FAULTY]
        sweep_minutes(w, 15)
        assert len(sent(w, NotificationKind.BREAKER_CLOSED)) == 1
        assert not sent(w, NotificationKind.BREAKER_NEEDS_OPERATOR)


def test_a_duplicate_sweep_that_read_the_tripped_breaker_neither_closes_it_twice_nor_mails_twice() -> None:
    with world() as w:
        _tripped(w)
        w.advance(WINDOW + 60)
        stored = w.repo.breaker.read()
        ops = w.service.breaker
        assert ops._auto_close(dict(stored), w.now[0]) == "breaker_closed_by_itself"
        assert ops._auto_close(dict(stored), w.now[0]) == "breaker_raced"  # its version moved
        assert ops.sweep(w.now[0]).get("breaker_closed_by_itself") is None
        assert len(sent(w, NotificationKind.BREAKER_CLOSED)) == 1
        assert w.repo.breaker.read()["version"] == stored["version"] + 1 + 1  # closed, then the release


@pytest.mark.parametrize("how", ["lose", "refuse"])
def test_a_close_whose_answer_was_lost_mails_once_through_the_outbox_and_a_refused_one_is_retried(
        how: str) -> None:
    """The close commits with its notice in the outbox: a sweep that dies after the commit
    (lost response) leaves the e-mail owed, and the outbox's sweep sends it, once; a refused
    write closes nothing, and the next minute's sweep closes it."""
    with world() as w:
        _tripped(w)
        w.advance(WINDOW + 60)
        w.repo.fail_once("breaker.save", how)
        with pytest.raises(Exception, match="injected"):
            w.service.breaker.sweep(w.now[0])
        closed = w.repo.breaker.read()["state"] == policy.CLOSED
        assert closed is (how == "lose") and not sent(w, NotificationKind.BREAKER_CLOSED)
        sweep_minutes(w, 4)
        assert w.repo.breaker.read()["state"] == policy.CLOSED
        assert len(sent(w, NotificationKind.BREAKER_CLOSED)) == 1
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_a_node_it_acted_on_that_faults_again_leaves_it_open_until_an_operator_resets_it() -> None:
    """Given node-x faults again after the trip (its reboot did not fix it), Then the breaker
    stays open past its window, says so once (which node, why) and `breaker show` says it
    waits for an operator; the operator's reset still works."""
    with world() as w:
        _tripped(w)
        item = w.repo.instances.get_instance_item(REBOOTED)
        assert item is not None
        w.advance(120)
        # node-x's new fault, decided after the trip (held back by the tripped breaker)
        history = [{"at": w.now[0], "cause": "xid-79", "action": "reboot", "executed": False}]
        w.repo.tables.db.apply(w.repo.instances.instance_update(
            REBOOTED, from_states=[C.InstanceState.AVAILABLE], to=C.InstanceState.SUSPECT,
            set_fields={"fault_history": history}))
        sweep_minutes(w, 15)
        stored = w.repo.breaker.read()
        assert stored["state"] == policy.TRIPPED
        assert "node-x failed again" in stored["needs_operator"]["reason"]
        [mail] = sent(w, NotificationKind.BREAKER_NEEDS_OPERATOR)
        assert ("breaker stays open until an operator resets it: node-x failed again after its "
                "remediation") in mail
        assert not sent(w, NotificationKind.BREAKER_CLOSED) and w.rebooter.calls == []
        assert reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=True, by="oncall").done
        sweep_minutes(w, 1)
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_auto_close_off_keeps_todays_behaviour(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.admin import breaker_command

    with world(remediation=RemediationSettings(breaker=BreakerPolicy(auto_close=False))) as w:
        _tripped(w)
        [trip] = sent(w, NotificationKind.BREAKER_TRIPPED)
        assert "until an operator resets the breaker;" in trip
        [held] = sent(w, NotificationKind.JOB_HELD)
        assert "closes by itself" not in held and "waiting for the breaker's reset" in held
        sweep_minutes(w, 40)
        assert w.repo.breaker.read()["state"] == policy.TRIPPED and w.rebooter.calls == []
        assert not sent(w, NotificationKind.BREAKER_CLOSED)
        assert not sent(w, NotificationKind.BREAKER_NEEDS_OPERATOR)
        assert breaker_command(argparse.Namespace(breaker_command="show", json=True), w.repo, w.now[0]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["standing"] == "open until an operator resets it"
        assert "breaker_auto_close is false" in shown["why"]


def test_breaker_show_says_it_waits_to_close_by_itself_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.admin import breaker_command

    with world() as w:
        _tripped(w)
        [trip] = sent(w, NotificationKind.BREAKER_TRIPPED)
        assert "until the breaker closes by itself (a window after this trip" in trip
        [held] = sent(w, NotificationKind.JOB_HELD)  # the HELD e-mail says so too
        assert "Job held: waiting for the breaker to close" in held
        assert "The breaker closes by itself once its window has passed" in held
        assert "Without a reset or the breaker closing the job fails at" in held
        assert breaker_command(argparse.Namespace(breaker_command="show", json=True), w.repo, w.now[0]) == 0
        out = capsys.readouterr()
        shown = json.loads(out.out)
        assert shown["standing"] == "open, waiting to close by itself"
        assert "has not passed since the trip" in shown["why"]
        assert shown["nodes_acted_on_when_tripped"] == [REBOOTED]
        assert "breaker open, waiting to close by itself: a window" in out.err
        w.advance(WINDOW + 60)
        w.service.breaker.sweep(w.now[0])
        assert breaker_command(argparse.Namespace(breaker_command="show", json=True), w.repo, w.now[0]) == 0
        assert json.loads(capsys.readouterr().out)["standing"] == "closed"
