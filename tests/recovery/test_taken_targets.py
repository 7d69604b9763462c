"""A relocation's target another scheduler took before the moved rank started there
(``recovery.taken_targets``), with fakes of the ports: the rank moves to another free node at
once instead of waiting for the taken one until the restart fails."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.adapters.ecs import StartResult
from gpu_recovery.constants import JobState
from gpu_recovery.recovery.taken_targets import TakenTargets
from tests.recovery.fakes import FakeEcs, FakeTask, World, world

FAULTY, PEER = "node-b", "node-a"
FREE = ["node-c", "node-d"]
RELOCATABLE = {C.TAG_RELOCATABLE: "true"}


def _take_the_target_first(monkeypatch: pytest.MonkeyPatch, w: World, taken: list[str], *,
                           free_left: bool = True) -> None:
    """Another scheduler's task lands on the relocation's target just before the moved rank's
    StartTask; ECS refuses every start on a taken node (RESOURCE:GPU) from then on. With
    ``free_left`` false the other free node is taken as well (nothing to move to)."""
    real = FakeEcs.start_task

    def start_task(self: FakeEcs, **kwargs: Any) -> StartResult:
        instances = list(kwargs.pop("container_instance_arns", ()) or []) \
            or [kwargs.pop("container_instance_arn", "")]
        target = (w.repo.faults.placement("j", 2).get(FAULTY) or {}).get("node")
        if target and not taken and any(i.rsplit("/", 1)[-1] == target for i in instances):
            for node in [target] if free_left else FREE:
                taken.append(node)
                arn = f"arn:aws:ecs:us-east-1:123456789012:task/gpu-cluster/web-{node}"
                self.tasks[arn] = FakeTask(arn, node, "another-scheduler", "family:web",
                                           task_definition="web", created_at=clock.now(),
                                           started_at=clock.now())
                self.taken[node] = {"taskArn": arn, "group": "family:web", "startedBy": "another-scheduler"}
        refused = [i for i in instances if i.rsplit("/", 1)[-1] in taken]
        placed = [i for i in instances if i not in refused]
        result = real(self, container_instance_arns=placed, **kwargs) if placed else StartResult([], [], {})
        return StartResult(result.task_arns, [*result.failures, *({"arn": i, "reason": "RESOURCE:GPU"}
                                                               for i in refused)], result.placed)

    monkeypatch.setattr(FakeEcs, "start_task", start_task)


def _dead_gpu(w: World, arns: list[str]) -> None:
    """Rank 1 exits 1, rank 0 is stopped by us, node-b's DCGM diag says replace (exit 2)."""
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
    [task] = w.ecs.health_checks_on(FAULTY)
    w.service.on_health_check_stopped(w.health_check_stopped(task, 2))


def _training_on(w: World) -> list[str]:
    """The nodes the job's training tasks run on (not a check's, not the other scheduler's)."""
    return sorted(t.node for t in w.ecs.tasks.values()
                  if t.last_status == "RUNNING" and t.group != C.HEALTH_CHECK_GROUP
                  and t.started_by != "another-scheduler")


def test_a_taken_target_moves_the_rank_to_another_free_node_instead_of_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a relocatable job on node-a/node-b and two free nodes, When node-b's GPU is dead
    (replace) and another scheduler's task takes the relocation's target just before the moved
    rank's StartTask (refused: RESOURCE:GPU), Then the move names the other free node at once
    (the restart does not wait for the taken one), it is reserved for the job, and the restart's
    next send (the sweep's) starts rank 1 there: the job runs on node-a and the other node."""
    taken: list[str] = []
    with world(relocation_wait_seconds=1800) as w:
        w.ecs.spare_nodes = list(FREE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        _take_the_target_first(monkeypatch, w, taken)
        _dead_gpu(w, arns)
        assert taken, "the premise: the relocation's target was taken before its StartTask"
        [first] = taken
        [other] = [n for n in FREE if n != first]
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.STARTING and job.attempt == 2 and job.restart_wait is None
        move = w.repo.faults.placement("j", 2)[FAULTY]
        assert move["node"] == other and f"{first} taken by another task" in move["why"]
        assert (w.repo.cordons.worklist().holds.get(other) or {}).get("job") == "j"
        for _ in range(3):
            w.advance(61)
            w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.RUNNING and job.attempt == 2
        assert _training_on(w) == sorted([PEER, other])
        assert not [n for n in w.notifier.sent if n.kind is C.NotificationKind.FAILED]


def test_with_no_other_free_node_the_restart_waits_for_its_target_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the same, When both free nodes are taken (nothing to move to), Then the move stays
    and the restart waits for its target (STARTING with its wait, naming what holds it)."""
    taken: list[str] = []
    with world(relocation_wait_seconds=1800) as w:
        w.ecs.spare_nodes = list(FREE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        _take_the_target_first(monkeypatch, w, taken, free_left=False)
        _dead_gpu(w, arns)
        job = w.repo.jobs.get_job("j")
        target = w.repo.faults.placement("j", 2)[FAULTY]["node"]
        assert job.state is JobState.STARTING and job.restart_wait is not None
        assert target in taken and "held by task web-" in job.last_error + str(job.restart_wait)


def test_the_same_refusal_delivered_again_moves_the_rank_once_and_starts_no_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the rank moved off its taken target, When the same refusal is handled again (its
    batch delivered again), Then the move stands (not moved a second time) and the restart
    does not wait for the taken node."""
    taken: list[str] = []
    with world(relocation_wait_seconds=1800) as w:
        w.ecs.spare_nodes = list(FREE)
        arns = w.register_job("j", [PEER, FAULTY], tags=RELOCATABLE)
        _take_the_target_first(monkeypatch, w, taken)
        moved: list[Any] = []
        real_not_placed = TakenTargets.not_placed

        def not_placed(self: TakenTargets, job: Any, rank: Any, why: str) -> None:
            moved.append((job, rank, why))
            real_not_placed(self, job, rank, why)

        monkeypatch.setattr(TakenTargets, "not_placed", not_placed)
        _dead_gpu(w, arns)
        [(job, rank, why)] = moved
        before = w.repo.faults.placement("j", 2)
        w.service.taken_targets.not_placed(job, rank, why)
        assert w.repo.faults.placement("j", 2) == before and before[FAULTY]["node"] != taken[0]
        fresh = w.repo.jobs.get_job("j")
        assert fresh.state is JobState.STARTING and fresh.restart_wait is None
