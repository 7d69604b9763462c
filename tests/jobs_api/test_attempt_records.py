"""The jobs API's attempts: the launcher's records completed from the job's history."""

from __future__ import annotations

from gpu_recovery.queue.attempts import attempt_records


def _t(at: float, to: str, reason: str = "") -> dict[str, object]:
    return {"at": at, "from": "X", "to": to, "reason": reason, "actor": "test"}


LAUNCHED_1 = {"attempt": 1, "started_at": 100.0, "ended_at": None, "outcome": "STARTED",
              "failure_kind": "", "reason": ""}


def test_a_gang_restart_after_a_fault_shows_both_attempts_and_how_each_ended():
    """Given attempt 1 launched by the scheduler, a fault, a gang restart and completion,
    then attempt 1 ended at the fault (FAULT, its reason) and attempt 2 ended COMPLETE."""
    history = [_t(99, "QUEUED"), _t(100, "STARTING"), _t(105, "RUNNING"),
               _t(300, "PENDING_HEALTHCHECK", "rank 1 exited 1: XID 79"),
               _t(301, "PENDING_RESTART", "REBOOT"),
               _t(480, "STARTING", "gang restart, attempt 2"), _t(481, "RUNNING"),
               _t(900, "COMPLETE", "every rank exited 0")]
    records = attempt_records([LAUNCHED_1], history, 2)
    assert [(r["attempt"], r["started_at"], r["ended_at"], r["outcome"], r["reason"]) for r in records] == [
        (1, 100.0, 300, "FAULT", "rank 1 exited 1: XID 79"),
        (2, 480, 900, "COMPLETE", "every rank exited 0")]


def test_a_running_attempt_is_open_and_a_suspension_ends_the_one_before():
    history = [_t(100, "STARTING"), _t(105, "RUNNING"), _t(200, "SUSPENDING"),
               _t(230, "SUSPENDED", "suspended by alice"), _t(400, "STARTING"), _t(405, "RUNNING")]
    records = attempt_records([LAUNCHED_1, {**LAUNCHED_1, "attempt": 2, "started_at": 400.0}], history, 2)
    assert [(r["attempt"], r["ended_at"], r["outcome"]) for r in records] == [
        (1, 230, "SUSPENDED"), (2, None, "STARTED")]


def test_a_failed_launch_keeps_its_own_record_and_a_trimmed_history_counts_back_from_the_current():
    """The launcher's START_FAILED record is exact; a history that lost its oldest entries
    still numbers the attempts it has from the job's current attempt."""
    failed = {"attempt": 4, "started_at": 50.0, "ended_at": 51.0, "outcome": "START_FAILED",
              "failure_kind": "INSUFFICIENT_RESOURCES", "reason": "no room"}
    history = [_t(50, "STARTING"), _t(51, "PENDING_RESOURCES", "start failed"), _t(60, "STARTING"),
               _t(61, "RUNNING")]
    records = attempt_records([failed], history, 5)
    assert [(r["attempt"], r["outcome"], r["failure_kind"]) for r in records] == [
        (4, "START_FAILED", "INSUFFICIENT_RESOURCES"), (5, "STARTED", "")]
    assert records[1]["started_at"] == 60


def test_no_history_keeps_the_stored_records():
    assert attempt_records([LAUNCHED_1], [], 1) == [LAUNCHED_1]
