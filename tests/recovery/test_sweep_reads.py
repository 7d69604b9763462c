"""The sweep's reads of the job table's deadline index: read whole once a minute (the holds
need the jobs holding nodes), and the due job items' Query made only when that read shows
one due or something was written since."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import JobState
from gpu_recovery.domain.models import Instance
from gpu_recovery.recovery import sweep as sweep_module
from tests.recovery.fakes import CountedCalls, World, world


def index_reads(w: World) -> CountedCalls:
    """The whole reads of the job table's deadline index and the due job items' Queries
    (pages asked for), counted on the real repository under the Flaky wrapper."""
    return CountedCalls(w.repo._repo.deadlines, ("job_items", "due_job_item_pages"))


def _waiting_for_its_check(w: World, job_id: str = "j", nodes: tuple[str, ...] = ("node-a", "node-b")
                           ) -> float:
    """A 2-rank job whose rank 1 exited 1: PENDING_HEALTHCHECK, its deadline a minute away."""
    arns = w.register_job(job_id, list(nodes))
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    item = w.repo.jobs.get_job_item(job_id)
    assert item is not None and item["job_state"] == JobState.PENDING_HEALTHCHECK.value
    return float(item["deadline_at"])


def test_an_idle_minute_reads_the_index_once() -> None:
    """Nothing due: one read of the index, no Query of the due job items."""
    with world() as w:
        reads = index_reads(w)
        assert w.service.sweep().action == "swept"
        assert reads.calls == ["job_items"]


def test_a_due_job_item_is_queried_and_moved_on() -> None:
    """The read shows the job's deadline passed: its page is queried and its step runs (the
    job re-armed a minute on); before it was due, the Query was not made."""
    with world() as w:
        deadline = _waiting_for_its_check(w)
        reads = index_reads(w)
        w.service.sweep()
        assert reads.calls == ["job_items"]  # not due yet
        w.now[0] = deadline + 1
        reads.calls.clear()
        w.service.sweep()
        assert reads.calls == ["job_items", "due_job_item_pages"]
        item = w.repo.jobs.get_job_item("j")
        assert item is not None and float(item["deadline_at"]) > w.now[0]


def test_a_step_rearmed_for_the_next_sweep_is_taken_by_it_though_that_sweep_starts_early() -> None:
    """EventBridge runs the sweep's rule within its minute, not on the same second each minute:
    a job rearmed a minute after one sweep's start (1.5 s into its minute) is stepped by the next
    sweep, which starts 3 s short of a minute later, not left for the one after."""
    with world() as w:
        deadline = _waiting_for_its_check(w)
        w.now[0] = deadline + 1.5
        w.service.sweep()
        item = w.repo.jobs.get_job_item("j")
        assert item is not None and float(item["deadline_at"]) == pytest.approx(w.now[0] + 60)
        reads = index_reads(w)
        w.now[0] += 60 - 3
        w.service.sweep()
        assert reads.calls == ["job_items", "due_job_item_pages"]
        item = w.repo.jobs.get_job_item("j")
        assert item is not None and float(item["deadline_at"]) == pytest.approx(w.now[0] + 60)


def test_an_item_rearmed_within_the_lead_is_stepped_once_a_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that rearms its item a few seconds on (its own deadline, within the sweep's lead)
    meets it again in a later page of the same pass: it is stepped once, the next sweep takes it."""
    with world() as w:
        _waiting_for_its_check(w)
        deadline = _waiting_for_its_check(w, "k", ("node-c", "node-d"))
        w.now[0] = deadline + 1
        monkeypatch.setattr(sweep_module, "DUE_PAGE", 1)
        stepped: list[str] = []

        def rearm_shortly(item: dict[str, object], now: float) -> str:
            job = w.repo.jobs.job_from_item(dict(item))
            stepped.append(job.job_id)
            w.repo.deadlines.rearm_job(job, now + 5)
            return "rearmed_shortly"

        def rearm_node_shortly(instance: Instance, now: float) -> str:
            stepped.append(instance.container_inst_id)
            w.repo.deadlines.rearm_instance(instance.container_inst_id, instance.state, now + 5)
            return "rearmed_shortly"

        for node in ("node-b", "node-d"):  # due too, a second apart
            instance = w.repo.instances.get_instance(node)
            assert instance is not None
            w.repo.deadlines.rearm_instance(node, instance.state, w.now[0] - (2 if node == "node-b" else 1))
        monkeypatch.setattr(w.service.sweeper, "_job_item", rearm_shortly)
        monkeypatch.setattr(w.service.sweeper, "_instance", rearm_node_shortly)
        handled = w.service.sweep().detail["handled"]
        assert sorted(stepped) == ["j", "k", "node-b", "node-d"], stepped
        assert handled.get("rearmed_shortly") == 4, handled


def test_a_write_before_the_job_items_brings_the_query_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing due at the read, but the holds' refresh wrote (it may have made an item due):
    the Query is made, as it was before the read was shared."""
    with world() as w:
        reads = index_reads(w)
        cordons = w.service.sweeper.cordons
        monkeypatch.setattr(cordons, "sweep", lambda *a, **k: {"holds_changed": 1})
        w.service.sweep()
        assert reads.calls == ["job_items", "due_job_item_pages"]


def test_a_failed_read_of_the_index_leaves_the_minute_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's whole read throttled (past botocore's retries) once: the holds read the
    index themselves and the attribute syncs run, and the due job items are queried, as
    before the read was shared; nothing fails."""
    with world() as w:
        reads = index_reads(w)
        real = w.repo._repo.deadlines.job_items
        failures = [TimeoutError("Query: ThrottlingException (retries exhausted)")]

        def throttled_once() -> list[dict[str, object]]:
            if failures:
                raise failures.pop()
            return list(real())

        monkeypatch.setattr(w.repo._repo.deadlines, "job_items", throttled_once)
        handled = w.service.sweep().detail["handled"]
        assert "error" not in handled and handled.get("no_holds") == 1, handled
        assert reads.calls == ["job_items", "due_job_item_pages"]  # the holds' own read


def test_a_throttled_read_of_the_due_instances_leaves_the_due_job_items_to_run() -> None:
    """The due instances' Query throttled: the sweep logs it and still works the due job items
    (the job re-armed a minute on), instead of failing whole for the minute (8 % sweep
    time_sharing s50: a launch's resume held back by the instance index's read)."""
    with world() as w:
        deadline = _waiting_for_its_check(w)
        w.now[0] = deadline + 1
        w.repo.fail_once("deadlines.due_instance_pages", "refuse")
        outcome = w.service.sweep()
        assert outcome.action == "swept" and outcome.detail["handled"].get("error") == 1, outcome
        assert w.repo.armed() == []  # the premise: the instances' Query was refused
        item = w.repo.jobs.get_job_item("j")
        assert item is not None and float(item["deadline_at"]) > w.now[0]


def test_a_waiting_fault_whose_step_fails_is_still_due_again_in_a_minute() -> None:
    """A PENDING_HEALTHCHECK job's step that fails at a call after its visit (here the latch's
    read) leaves the job due again a minute on, committed first: it is tried again then and not
    left overdue (8 % sweep preflight_forged_loopback s19: overdue 16 minutes, every try failing
    at some call)."""
    with world() as w:
        deadline = _waiting_for_its_check(w)
        w.now[0] = deadline + 1
        w.repo.fail_once("latches.complete", "refuse")
        outcome = w.service.sweep()
        assert outcome.detail["handled"].get("error") == 1, outcome
        assert w.repo.armed() == []  # the premise: the step failed at the latch's read
        item = w.repo.jobs.get_job_item("j")
        assert item is not None and item["job_state"] == JobState.PENDING_HEALTHCHECK.value
        assert float(item["deadline_at"]) - w.now[0] == pytest.approx(60)
