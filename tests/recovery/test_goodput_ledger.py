"""The goodput ledger kept by the recovery loop from the events it receives (the recovery
fakes' World: the real service and repository on moto, AWS-shaped ECS events): each cause
measured where the stack learns it, attributed to the fault's node and catalog rule."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery import metric_names as M
from gpu_recovery.constants import InstanceState, JobState, RankState
from gpu_recovery.queue.jobs_api.reads import goodput_view
from tests.recovery.fakes import CountedCalls, World, world
from tests.recovery.remediation_steps import report_xid

FAULTY, PEER = "node-b", "node-a"


def view(w: World, job: str = "j") -> dict[str, Any]:
    return goodput_view(w.repo.jobs.get_job_item(job))


def reboot_back(w: World, node: str) -> None:
    """The node's reboot: its agent disconnects, then reconnects (two sweeps a minute apart)."""
    w.ecs.agent_connected[node] = False
    w.advance(60)
    w.service.sweep()
    w.ecs.agent_connected[node] = True
    w.ecs.versions[node] = 5
    w.advance(60)
    w.service.sweep()


def test_a_gpu_fault_is_split_into_its_causes_and_charged_to_its_node_and_rule() -> None:
    """Given a job running 300 s after its checkpoint at +300, When rank 1's GPU fails at +700
    (the stack hears of it 5 s later), the peer's stop lands 8 s after, the DCGM check says
    reboot 90 s later and the node is back two minutes after that, Then the ledger has
    productive 300 + what ran since, lost work 400, detection 5, stopping 8, diagnosis 90,
    repair 120, wall = the sum, and the badput is charged to node-b and rule exit-suspect."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.advance(300)
        assert w.repo.jobs.record_checkpoint("j", 1, 60, w.now[0])
        w.advance(400)
        stop = w.task_stopped(arns[1], exit_code=1)  # stoppedAt: the fault's time
        w.advance(5)
        w.service.on_task_state_change(stop)
        w.advance(8)
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        w.advance(90)
        [task] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        reboot_back(w, FAULTY)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.AVAILABLE
        job = w.repo.jobs.get_job("j")
        assert (job.state, job.attempt) == (JobState.RUNNING, 2)
        w.advance(1000)
        ledger = view(w)
    s = ledger["seconds"]
    assert s["productive"] == pytest.approx(300 + 1000)
    assert (s["lost_work"], s["detection"], s["stopping"], s["diagnosis"]) == pytest.approx((400, 5, 8, 90))
    assert s["repair"] == pytest.approx(120) and s["restart"] == 0
    assert ledger["wall_seconds"] == pytest.approx(1923)
    assert ledger["lost_work"] == pytest.approx(400) and ledger["faults"] == 1
    assert ledger["ettr"] == pytest.approx(1300 / 1923, abs=1e-4)
    assert ledger["stack_share_seconds"] == pytest.approx(5 + 8 + 90)
    badput = 400 + 5 + 8 + 90 + 120
    assert ledger["top_nodes"] == [{"name": FAULTY, "seconds": badput}]
    assert ledger["top_rules"] == [{"name": "exit-suspect", "seconds": badput}]
    assert ledger["checkpoint"]["step"] == 60


def test_a_gang_restart_is_restart_until_rank_0_runs_marked_once() -> None:
    """Issue 52: a gang restart is RUNNING once its last rank's StartTask was accepted; its
    tasks then pull their images. Rank 0's RUNNING event 40 s later (delivered twice) marks
    those 40 s as restart, once; rank 1's marks nothing."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.advance(300)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [task] = w.ecs.health_checks_on(FAULTY)
        w.advance(90)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        reboot_back(w, FAULTY)
        assert w.repo.jobs.get_job("j").state is JobState.RUNNING
        before = view(w)["seconds"]["restart"]
        w.advance(40)
        rank0, rank1 = w.repo.jobs.get_rank("j", 0), w.repo.jobs.get_rank("j", 1)
        assert rank0 is not None and rank1 is not None and rank0.attempt == 2
        w.service.on_task_state_change(w.task_running(rank1.task_arn, FAULTY, w.now[0]))
        event = w.task_running(rank0.task_arn, PEER, w.now[0])
        w.service.on_task_state_change(event)
        w.advance(5)
        w.service.on_task_state_change(event)  # at-least-once delivery
        w.advance(100)
        ledger = view(w)
        history = (w.repo.jobs.get_job_item("j") or {}).get("history") or []
    assert ledger["seconds"]["restart"] == pytest.approx(before + 40)
    assert sum(1 for h in history if h.get("reason") == "rank 0 running") == 1


def test_a_restarted_ranks_running_event_reads_the_job_only_for_rank_0() -> None:
    """A gang restart's ranks go RUNNING one event each: only rank 0's marks the attempt, so
    only rank 0's reads the job (a job of 8,192 ranks: 8,191 GetItems fewer per restart)."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [task] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        reboot_back(w, FAULTY)
        rank0, rank1 = w.repo.jobs.get_rank("j", 0), w.repo.jobs.get_rank("j", 1)
        assert rank0 is not None and rank1 is not None and rank1.attempt == 2
        reads = CountedCalls(w.repo.jobs, ("get_job",))
        w.service.on_task_state_change(w.task_running(rank1.task_arn, FAULTY, w.now[0]))
        assert reads.calls == [] and w.repo.jobs.get_rank("j", 1).state is RankState.RUNNING
        w.service.on_task_state_change(w.task_running(rank0.task_arn, PEER, w.now[0]))
        assert reads.calls == ["get_job"]


def test_a_fault_before_any_checkpoint_has_unknown_lost_work() -> None:
    """Given a job that never reported a checkpoint, When its GPU fails, Then its lost work
    is "unknown" (not 0, not guessed) and the time before the fault stays productive."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.advance(500)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.advance(10)
        ledger = view(w)
    assert ledger["lost_work"] == "unknown" and ledger["lost_work_unknown_faults"] == 1
    assert ledger["seconds"]["productive"] == pytest.approx(500)
    assert ledger["seconds"]["diagnosis"] == pytest.approx(10)


def test_an_application_error_is_the_jobs_own_time_not_a_nodes_cost() -> None:
    """Given XID 13 (the catalog: an application error) on node-b and an application-restart
    budget, When rank 1 exits 1 there, Then the job restarts in place and the time from its
    last checkpoint to the restart is application_error: out of ETTR, no node's cost."""
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.advance(100)
        assert w.repo.jobs.record_checkpoint("j", 1, 50, w.now[0])
        w.advance(100)
        report_xid(w, FAULTY, 13)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        w.advance(7)
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: restart"))
        assert w.repo.jobs.get_job("j").attempt == 2  # restarted once the gang stopped
        w.advance(300)
        ledger = view(w)
    s = ledger["seconds"]
    assert s["application_error"] == pytest.approx(100 + 7)
    assert s["productive"] == pytest.approx(100 + 300)
    assert s["lost_work"] == 0 and s["stopping"] == 0
    assert ledger["own_seconds"] == pytest.approx(107) and ledger["ettr"] == pytest.approx(1.0)
    assert ledger["top_nodes"] == []


@pytest.mark.parametrize("ended_by", ["completion", "fault"])
def test_a_restart_whose_rank_0_running_event_never_came_is_restart_until_its_tasks_started(
        ended_by: str) -> None:
    """Given a gang restart whose tasks pulled for 40 s and whose rank 0 RUNNING event never
    arrived (every delivery failed), When the attempt ends 300 s later (its ranks complete, or
    rank 1 fails), Then those 40 s are restart, from the stopping task's own startedAt: not
    training (the ledger had them productive)."""
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.advance(100)
        report_xid(w, FAULTY, 13)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: restart"))
        job = w.repo.jobs.get_job("j")
        assert (job.state, job.attempt) == (JobState.RUNNING, 2)
        before = view(w)["seconds"]
        ranks = [w.repo.jobs.get_rank("j", r) for r in (0, 1)]
        for rank in ranks:
            assert rank is not None and rank.attempt == 2
            w.ecs.tasks[rank.task_arn].started_at = w.now[0] + 40  # its image pulled 40 s
        w.advance(300)
        if ended_by == "completion":
            for rank in ranks:
                w.service.on_task_state_change(w.task_stopped(rank.task_arn, exit_code=0))
            assert w.repo.jobs.get_job("j").state is JobState.COMPLETE
        else:
            w.service.on_task_state_change(w.task_stopped(ranks[1].task_arn, exit_code=1))
            assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK
        s = view(w)["seconds"]
    assert s["restart"] == pytest.approx(before["restart"] + 40)
    assert s["productive"] == pytest.approx(before["productive"] + 260)


def test_waiting_for_a_node_to_relocate_to_is_waiting_for_capacity() -> None:
    """Given a relocatable job on a full cluster, When node-b's DCGM check says replace,
    Then the job waits for a free node (relocation) and that time is waiting_for_capacity,
    until job k ends and the job restarts there."""
    with world(relocation_wait_seconds=1800) as w:
        other = w.register_job("k", ["node-c"])
        arns = w.register_job("j", [PEER, FAULTY], tags={C.TAG_RELOCATABLE: "true"})
        w.advance(50)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        w.advance(30)
        [task] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 2))
        assert w.repo.jobs.get_job("j").relocation_wait is not None
        for _ in range(3):
            w.advance(60)
            w.service.sweep()
        w.service.on_task_state_change(w.task_stopped(other[0], exit_code=0))  # k completes
        assert w.repo.jobs.get_job("j").attempt == 2  # restarted on node-c at once
        w.advance(60)
        ledger = view(w)
    s = ledger["seconds"]
    assert s["diagnosis"] == pytest.approx(30)
    assert s["waiting_for_capacity"] == pytest.approx(180)
    assert s["productive"] == pytest.approx(50 + 60)
    assert ledger["top_rules"][0]["name"] == "exit-suspect"


class _Metrics:
    """What the recovery functions' Powertools adapter receives (runtime.PowertoolsMetrics)."""

    def __init__(self) -> None:
        self.plain: list[tuple[str, str, float]] = []
        self.by: list[tuple[str, str, float, dict[str, str]]] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.plain.append((name, unit, value))

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        self.plain.append((name, unit, value))

    def add_dimensioned_metric(self, name: str, unit: str, value: float, dimensions: dict[str, str]) -> None:
        self.by.append((name, unit, value, dimensions))


def test_a_finished_job_emits_its_gpu_hours_lost_per_cause_and_its_ettr_once() -> None:
    """Given a 2-GPU job that lost 107 s to an application error and restarted, When every
    rank of its second attempt exits 0 (and the last stop event is delivered twice), Then the
    job's end emits GpuHoursLost once, by Cause only (never a job or a node), 107 s x 2 GPUs,
    and its ETTR (100 %: an application error is the job's own time) once."""
    with world(max_app_restarts=1) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.advance(100)
        assert w.repo.jobs.record_checkpoint("j", 1, 50, w.now[0])
        w.advance(100)
        report_xid(w, FAULTY, 13)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.advance(7)
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: restart"))
        assert w.repo.jobs.get_job("j").attempt == 2
        w.advance(300)
        metrics = _Metrics()
        w.service.metrics = metrics
        second = [arn for arn, task in w.ecs.tasks.items() if task.last_status == "RUNNING"
                  and task.started_by != "gpu-health-check"]
        assert len(second) == 2
        stops = [w.task_stopped(arn, exit_code=0) for arn in second]
        for stop in [*stops, stops[-1]]:
            w.service.on_task_state_change(stop)
        assert w.repo.jobs.get_job("j").state is JobState.COMPLETE
    lost = [m for m in metrics.by if m[0] == M.METRIC_GPU_HOURS_LOST]
    assert lost == [(M.METRIC_GPU_HOURS_LOST, "None", pytest.approx(107 * 2 / 3600), {M.DIMENSION_CAUSE:
                                                                                     "application_error"})]
    assert [m for m in metrics.plain if m[0] == M.METRIC_JOB_ETTR] == [(M.METRIC_JOB_ETTR, "Percent", 100.0)]
