"""The goodput ledger (domain.goodput) over job histories as the repository writes them."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery.domain import goodput as gp
from gpu_recovery.domain.goodput_report import job_end_figures


def entry(at: float, to: str, marks: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"at": at, "to": to, "from": "", "reason": "", "actor": "test"}
    if marks:
        out[gp.GP] = marks
    return out


def ledger(entries: list[dict[str, Any]], now: float) -> gp.Ledger:
    return gp.ledger_of({"history": entries}, now)


def test_a_job_that_never_failed_is_all_productive_after_its_start() -> None:
    """Given a job queued 100 s, starting 20 s, then running to COMPLETE, Then wall time counts
    from its first start, the start is restart, the rest productive, ETTR 900/920."""
    book = ledger([entry(0, "QUEUED"), entry(100, "STARTING"), entry(120, "RUNNING"),
                   entry(1020, "COMPLETE")], now=5000)
    assert book.wall == pytest.approx(920)
    assert book.seconds["restart"] == pytest.approx(20)
    assert book.seconds["productive"] == pytest.approx(900)
    assert book.ettr == pytest.approx(900 / 920)


def test_a_gpu_fault_splits_into_lost_work_detection_diagnosis_repair_restart() -> None:
    """Given a fault at 500 (last checkpoint at 400) acted on at 510, a health check until
    600, a reboot until 800, the restart until 830, Then each cause has its share and the
    fault's node and catalog rule carry the badput."""
    marks = gp.fault_marks(fault_at=500, checkpoint_at=400, node="ci-1", rule="xid-79")
    book = ledger([entry(0, "STARTING"), entry(100, "RUNNING"), entry(510, "PENDING_HEALTHCHECK", marks),
                   entry(600, "PENDING_RESTART", gp.cause_marks("repair")), entry(800, "STARTING"),
                   entry(830, "RUNNING"), entry(1830, "COMPLETE")], now=9999)
    s = book.seconds
    assert (s["productive"], s["lost_work"], s["detection"]) == pytest.approx((300 + 1000, 100, 10))
    assert (s["diagnosis"], s["repair"], s["restart"]) == pytest.approx((90, 200, 100 + 30))
    assert book.wall == pytest.approx(1830)
    assert book.faults == 1 and book.lost_work_unknown == 0
    costs = 100 + 10 + 90 + 200 + 30
    assert book.to_view()["top_nodes"] == [{"name": "ci-1", "seconds": costs}]
    assert book.to_view()["top_rules"] == [{"name": "xid-79", "seconds": costs}]
    assert book.stack_share == pytest.approx(s["detection"] + s["diagnosis"] + s["restart"])


def test_no_checkpoint_reported_leaves_lost_work_unknown_never_guessed() -> None:
    marks = gp.fault_marks(fault_at=500, checkpoint_at=None, node="ci-1")
    book = ledger([entry(0, "STARTING"), entry(0, "RUNNING"), entry(500, "PENDING_HEALTHCHECK", marks)], 600)
    assert book.seconds["lost_work"] == 0
    assert book.lost_work_unknown == 1
    assert book.to_view()["lost_work"] == "unknown"


def test_a_checkpoint_of_an_earlier_attempt_makes_the_whole_attempt_lost() -> None:
    marks = gp.fault_marks(fault_at=900, checkpoint_at=100, node="ci-1")
    book = ledger([entry(0, "STARTING"), entry(600, "RUNNING"), entry(900, "PENDING_RESTART", marks)], 900)
    assert book.seconds["lost_work"] == pytest.approx(300)
    assert book.seconds["productive"] == 0


def test_relocation_waits_for_capacity_and_requeues_too() -> None:
    marks = gp.fault_marks(fault_at=100, checkpoint_at=100, node="ci-1")
    book = ledger([entry(0, "STARTING"), entry(0, "RUNNING"), entry(100, "PENDING_HEALTHCHECK", marks),
                   entry(150, "PENDING_RESTART", gp.cause_marks("waiting_for_capacity")),
                   entry(250, "PENDING_RESOURCES"), entry(400, "STARTING"), entry(420, "RUNNING")], 500)
    assert book.seconds["waiting_for_capacity"] == pytest.approx(100 + 150)
    assert book.seconds["queued"] == 0


def test_the_jobs_own_time_is_out_of_ettr() -> None:
    """Given a job preempted (200 s suspending and suspended), then an application error
    (its 50 s of lost work and its restart), Then those are its own and ETTR ignores them."""
    app = gp.fault_marks(fault_at=1000, checkpoint_at=950, node="ci-2", rule="app-exit", own=True)
    book = ledger([entry(0, "STARTING"), entry(0, "RUNNING"),
                   entry(300, "SUSPENDING", gp.cause_marks("preempted")), entry(310, "SUSPENDED"),
                   entry(500, "STARTING"), entry(520, "RUNNING"), entry(1000, "PENDING_RESTART", app),
                   entry(1030, "STARTING"), entry(1040, "RUNNING"), entry(1100, "USER_STOPPED")], 2000)
    s = book.seconds
    assert s["preempted"] == pytest.approx(200)
    assert s["application_error"] == pytest.approx(50 + 30 + 10)
    assert s["restart"] == pytest.approx(20)
    assert book.ettr == pytest.approx(s["productive"] / (book.wall - book.own))
    assert book.to_view()["top_nodes"] == []  # the job's own time is no node's cost


def test_a_users_suspend_is_suspended_and_hung_is_detection() -> None:
    book = ledger([entry(0, "STARTING"), entry(0, "RUNNING"),
                   entry(100, "SUSPENDING", gp.cause_marks("suspended")), entry(110, "SUSPENDED"),
                   entry(300, "STARTING"), entry(300, "RUNNING"), entry(400, "HUNG"),
                   entry(460, "RUNNING")], 500)
    assert book.seconds["suspended"] == pytest.approx(200)
    assert book.seconds["detection"] == pytest.approx(60)


def test_folding_the_history_keeps_the_same_ledger() -> None:
    """Given a history folded 50 entries at a time (as the gateway trims it), Then the ledger
    is the one of the whole history, and the folded map stays bounded."""
    entries = [entry(0, "STARTING"), entry(10, "RUNNING")]
    t = 10.0
    for i in range(1000):
        marks = gp.fault_marks(fault_at=t + 95, checkpoint_at=t + 60, node=f"ci-{i % 40}", rule=f"r{i % 13}")
        entries += [entry(t + 100, "PENDING_HEALTHCHECK", marks),
                    entry(t + 130, "PENDING_RESTART", gp.cause_marks("repair")),
                    entry(t + 170, "STARTING"), entry(t + 180, "RUNNING")]
        t += 180
    whole = ledger(entries, t + 50)
    folded: dict[str, Any] | None = None
    rest = entries
    while len(rest) > 200:
        folded = gp.advance(folded, rest[:50]).to_item()
        rest = rest[50:]
    assert len(repr(folded)) < 2000
    parts = gp.ledger_of({"goodput": folded, "history": rest}, t + 50)
    assert parts.seconds == pytest.approx(whole.seconds)
    assert parts.faults == whole.faults == 1000
    assert whole.seconds["lost_work"] == pytest.approx(1000 * 35)
    assert whole.wall == pytest.approx(t + 50)


def test_an_unknown_cause_is_refused() -> None:
    with pytest.raises(ValueError):
        gp.cause_marks("coffee")


def test_a_late_confirmation_of_the_restart_counts_from_when_rank_0_ran() -> None:
    """Given the STARTING -> RUNNING confirmation written 100 s after rank 0 was seen running
    (a retried invocation), Then the restart ends when rank 0 ran; the rest is productive."""
    book = ledger([entry(0, "STARTING"), entry(130, "RUNNING", gp.running_marks(30))], 200)
    assert book.seconds["restart"] == pytest.approx(30)
    assert book.seconds["productive"] == pytest.approx(170)


def test_a_late_completion_ends_the_training_when_its_last_task_ended() -> None:
    """Issue 52: the last rank's STOPPED (exit 0) processed 60 s late (its first delivery
    failed, Lambda retried a minute later): the training and the wall time end at the task's
    own stop time, not at the retried write (the ledger was 60 s above the truth)."""
    book = ledger([entry(0, "STARTING"), entry(10, "RUNNING"),
                   entry(1070, "COMPLETE", gp.end_marks(1010))], 5000)
    assert book.seconds["productive"] == pytest.approx(1000)
    assert book.wall == pytest.approx(1010)
    early = ledger([entry(0, "STARTING"), entry(10, "RUNNING"),
                    entry(1070, "COMPLETE", gp.end_marks(5))], 5000)
    assert early.seconds["productive"] == pytest.approx(0)  # never before the open interval


def test_a_restart_confirmed_after_its_ranks_ended_trains_until_they_ended() -> None:
    """Given a gang restart whose ranks ran from 720 and ended (exit 0) at 960, its STARTING ->
    RUNNING confirmation committed only at 1015 (its writes met failures) and its completion at
    1020 (``held_reset`` at 3 % of calls failing, seed 29), Then it trained 720 -> 960 and the wall
    ends at 960 (the ledger had counted to the confirmation: 55 s above the truth); folded at the
    confirmation, the same."""
    entries = [entry(0, "STARTING"), entry(1015, "RUNNING", gp.running_marks(720)),
               entry(1020, "COMPLETE", gp.end_marks(960))]
    book = ledger(entries, 5000)
    assert book.seconds["restart"] == pytest.approx(720)
    assert book.seconds["productive"] == pytest.approx(240)
    assert book.wall == pytest.approx(960)
    folded = gp.ledger_of({"goodput": gp.advance(None, entries[:2]).to_item(), "history": entries[2:]}, 5000)
    assert folded.seconds == pytest.approx(book.seconds)
    # Confirmed in time, an end mark before the open interval still counts nothing back.
    on_time = ledger([entry(0, "STARTING"), entry(720, "RUNNING", gp.running_marks(720)),
                      entry(1020, "COMPLETE", gp.end_marks(700))], 5000)
    assert on_time.seconds["productive"] == pytest.approx(0) and on_time.wall == pytest.approx(720)


def test_rank_0_s_late_running_mark_after_a_late_confirmation_keeps_the_end_taking_training_back() -> None:
    """Given a relocation's ranks that ran 1205 -> 1445 (exit 0), the restart's confirmation
    committed at 1560, then rank 0's RUNNING event handled at 1640 (its mark: restart until 1205,
    already counted), and the completion at 1880 (8 % sweep ``relocation`` s2), Then the training
    is 1205 -> 1445: the late mark changes nothing (the ledger had kept 1205 -> 1560)."""
    book = ledger([entry(0, "STARTING"), entry(1560, "RUNNING", gp.running_marks(1205)),
                   entry(1640, "RUNNING", gp.interval_marks(gp.RESTART, 1205)),
                   entry(1880, "COMPLETE", gp.end_marks(1445))], 5000)
    assert book.seconds["restart"] == pytest.approx(1205)
    assert book.seconds["productive"] == pytest.approx(240)
    assert book.wall == pytest.approx(1445)


def test_a_fault_before_a_late_confirmation_is_detection_and_lost_work_from_its_checkpoint() -> None:
    """Given a gang restart whose ranks ran from 720, checkpointed at 800 and failed at 900, its
    confirmation committed only at 1015 and the fault's entry at 1030, Then it trained 720 -> 800,
    lost 800 -> 900 and 900 -> 1030 was detection (the ledger had counted to the confirmation as
    training and clipped the fault to it); folded at the confirmation, the same."""
    fault = gp.fault_marks(fault_at=900, checkpoint_at=800, node="ci-1", rule="xid-79")
    entries = [entry(0, "STARTING"), entry(1015, "RUNNING", gp.running_marks(720)),
               entry(1030, "PENDING_HEALTHCHECK", fault)]
    book = ledger(entries, 1030)
    assert book.seconds["restart"] == pytest.approx(720)
    assert book.seconds["productive"] == pytest.approx(80)
    assert book.seconds["lost_work"] == pytest.approx(100)
    assert book.seconds["detection"] == pytest.approx(130)
    assert book.wall == pytest.approx(1030)
    folded = gp.ledger_of({"goodput": gp.advance(None, entries[:2]).to_item(), "history": entries[2:]}, 1030)
    assert folded.seconds == pytest.approx(book.seconds)
    # Its checkpoint after the confirmation: only the time since it is lost.
    later = ledger([entry(0, "STARTING"), entry(1015, "RUNNING", gp.running_marks(720)),
                    entry(1130, "PENDING_HEALTHCHECK", gp.fault_marks(fault_at=1100, checkpoint_at=1050))],
                   1130)
    assert later.seconds["productive"] == pytest.approx(330)
    assert later.seconds["lost_work"] == pytest.approx(50) and later.seconds["detection"] == pytest.approx(30)


def test_a_gang_restart_is_restart_until_rank_0_ran_and_the_preflight_until_it_concluded() -> None:
    """Issue 52: a gang restart is RUNNING once its last rank's StartTask was accepted; its
    tasks then pull their image: rank 0's RUNNING event (at 70) marks the time before it as
    restart; the preflight's conclusion (at 130) marks the time before it as preflight."""
    book = ledger([entry(0, "STARTING"), entry(10, "RUNNING"),
                   entry(75, "RUNNING", gp.interval_marks(gp.RESTART, 70)),
                   entry(131, "RUNNING", gp.interval_marks(gp.PREFLIGHT, 130)),
                   entry(1131, "COMPLETE")], 5000)
    assert book.seconds["restart"] == pytest.approx(10 + 60)
    assert book.seconds["preflight"] == pytest.approx(60)
    assert book.seconds["productive"] == pytest.approx(1001)  # from the preflight's end, not its write
    with pytest.raises(ValueError):
        gp.interval_marks("coffee", 1)


def test_a_preflight_that_pinned_nodes_was_preflight_until_the_fault() -> None:
    book = ledger([entry(0, "STARTING"), entry(10, "RUNNING"),
                   entry(70, "PENDING_HEALTHCHECK", gp.interval_marks(gp.PREFLIGHT, 70))], 100)
    assert book.seconds["preflight"] == pytest.approx(60) and book.seconds["productive"] == 0


def test_the_nodes_validation_after_repair_is_its_own_cause_in_the_wait() -> None:
    """Issue 52: the job waits for its node's reboot (repair) and then for the node's
    validation after repair (200 to 260): the restart's RUNNING carries the validation's span,
    which moves from ``repair`` to ``validation``."""
    marks = gp.validation_marks([{"result": "passed", "since": 200, "at": 260}])
    book = ledger([entry(0, "STARTING"), entry(10, "RUNNING"),
                   entry(100, "PENDING_RESTART", gp.cause_marks(gp.REPAIR)),
                   entry(270, "STARTING"), entry(280, "RUNNING", marks)], 300)
    assert book.seconds["validation"] == pytest.approx(60)
    assert book.seconds["repair"] == pytest.approx(170 - 60)
    assert gp.validation_marks([{"result": "off", "since": 1, "at": 2}]) == {}


def test_a_fault_while_the_job_was_lost_opens_a_recovery_charged_to_its_node() -> None:
    """Given a job NODE_LOST (its node silent) whose rank then exits on a GPU fault, Then the
    fault counts, the silent time is detection, and all of it is charged to the node."""
    marks = gp.fault_marks(fault_at=300, checkpoint_at=250, node="ci-9", rule="xid-79")
    book = ledger([entry(0, "STARTING"), entry(0, "RUNNING"), entry(200, "NODE_LOST"),
                   entry(300, "PENDING_HEALTHCHECK", marks), entry(400, "PENDING_RESTART")], 450)
    assert book.faults == 1
    assert book.seconds["detection"] == pytest.approx(100)
    assert book.nodes == {"ci-9": pytest.approx(100 + 100 + 50)}


def test_a_finished_jobs_metric_figures_are_gpu_hours_per_badput_cause_and_ettr_percent() -> None:
    """Given a 2-node x 8-GPU job that lost 90 s to diagnosis and 180 s to repair and ran
    900 s, When it ends, Then its metric figures are those causes in GPU-hours (16 GPUs), no
    productive and no zero cause, and ETTR in percent."""
    marks = gp.fault_marks(fault_at=500, checkpoint_at=500, node="ci-1", rule="xid-79")
    item = {"world_size": 2, "gpus_per_node": 8, "history": [
        entry(0, "STARTING"), entry(0, "RUNNING"), entry(500, "PENDING_HEALTHCHECK", marks),
        entry(590, "PENDING_RESTART", gp.cause_marks("repair")), entry(770, "RUNNING"),
        entry(1170, "COMPLETE")]}
    lost, ettr = job_end_figures(item, now=9999)
    assert lost == pytest.approx({"diagnosis": 90 * 16 / 3600, "repair": 180 * 16 / 3600})
    assert ettr == pytest.approx(100 * 900 / 1170, abs=1e-3)


def test_a_restart_never_marked_running_is_restart_until_the_ended_task_started() -> None:
    """Given a gang restart RUNNING at 100 whose rank 0 RUNNING mark never came, When its attempt
    ends (a fault at 400, or its completion at 400) carrying the stopping task's startedAt 140,
    Then 100-140 is restart and only then training; a startedAt at or before the interval's start
    changes nothing, one past its end is the end."""
    fault = {**gp.fault_marks(fault_at=400, checkpoint_at=None), **gp.ran_from_marks(140)}
    ended = {**gp.end_marks(400), **gp.ran_from_marks(140)}
    for closing, to in ((fault, "PENDING_HEALTHCHECK"), (ended, "COMPLETE")):
        book = ledger([entry(0, "STARTING"), entry(100, "RUNNING"), entry(400, to, closing)], 400)
        assert (book.seconds["restart"], book.seconds["productive"]) == pytest.approx((140, 260))
    early = ledger([entry(0, "STARTING"), entry(100, "RUNNING"),
                    entry(400, "COMPLETE", {**gp.end_marks(400), **gp.ran_from_marks(60)})], 400)
    assert (early.seconds["restart"], early.seconds["productive"]) == pytest.approx((100, 300))
    late = ledger([entry(0, "STARTING"), entry(100, "RUNNING"),
                   entry(400, "COMPLETE", {**gp.end_marks(400), **gp.ran_from_marks(900)})], 400)
    assert (late.seconds["restart"], late.seconds["productive"]) == pytest.approx((400, 0))
    assert gp.ran_from_marks(None) == {}
