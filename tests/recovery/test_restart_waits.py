"""A restart's look at its nodes (``recovery.restart_waits``), on fakes of its ports: what it
asks ECS is bounded by what its wait names, not by how many nodes are blocked."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import JobState, RankState
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.restart_wait import NAMED_BLOCKED_NODES, RestartWait
from gpu_recovery.recovery.restart_waits import RestartWaits

NODES = [f"node-{i:02d}" for i in range(12)]


class Ranks:
    def __init__(self) -> None:
        self.ranks = [Rank(job_id="j", rank=i, state=RankState.STOPPED, attempt=1, task_arn=f"task-{i}",
                           task_definition_arn="td", container_inst_id=node, gpus=8)
                      for i, node in enumerate(NODES)]

    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]:
        return self.ranks[first:last]


class BusyCluster:
    """Every node ACTIVE, its agent connected, all its GPUs held by another scheduler's task."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def describe_container_instances(self, refs: Any) -> dict[str, dict[str, Any]]:
        return {ref: {"status": "ACTIVE", "agentConnected": True,
                      "remainingResources": [{"name": "GPU", "type": "STRINGSET", "stringSetValue": []}]}
                for ref in refs}

    def tasks_on(self, container_instance: str) -> list[dict[str, Any]]:
        self.asked.append(container_instance)
        return [{"taskArn": f"arn:aws:ecs:us-east-1:1:task/c/{container_instance}-web", "group": "family:web",
                 "startedBy": "other-scheduler"}]


def test_a_restart_blocked_on_many_busy_nodes_asks_what_holds_only_the_nodes_its_wait_names() -> None:
    """Given a 12-rank job's restart whose 12 nodes are all busy, When it looks at its nodes, Then
    every node is blocked, ECS is asked what holds the first five only (ListTasks and
    DescribeTasks each: not two calls per blocked node), and the wait names those five with
    their holders and counts the seven others."""
    ecs = BusyCluster()
    waits = RestartWaits(Ranks(), None, ecs, lambda *_: None,  # type: ignore[arg-type]
                         wait_seconds=1800, metrics=None)  # type: ignore[arg-type]
    blocked = waits.blocked(Job("j", JobState.PENDING_RESTART, len(NODES)))
    assert sorted(blocked) == NODES
    assert ecs.asked == NODES[:NAMED_BLOCKED_NODES]
    wait = RestartWait.start(1, 0.0, 1800, blocked)
    reason = wait.waiting_reason()
    assert all(f"{node}: RESOURCE:GPU" in reason and f"held by task {node}-web (group family:web" in reason
               for node in NODES[:NAMED_BLOCKED_NODES])
    assert reason.endswith("and 7 more node(s)") and wait.total == len(NODES)


def _taken_task(node: str) -> dict[str, Any]:
    return {"taskArn": f"arn:aws:ecs:us-east-1:1:task/c/{node}-web", "group": "family:web",
            "startedBy": "other-scheduler", "lastStatus": "RUNNING"}


def test_a_waiting_restart_looks_at_the_nodes_its_wait_names_alone_while_one_is_still_taken(
        monkeypatch: Any) -> None:
    """Given a 12-rank job (not relocatable) whose restart finds 7 of its nodes taken by another
    scheduler, When it waits and the sweep tries it again each minute, Then the wait names five
    (with the GPUs their ranks need) and counts 7; while one of those five is still taken a
    sweep minute reads no rank and describes those five only; once they are free the sweep
    looks at every node again (two still taken: it keeps waiting), and once all are free the
    job restarts on its nodes."""
    from tests.recovery.fakes import world

    with world(max_app_restarts=1, relocation_wait_seconds=1800) as w:
        arns = w.register_job("w", NODES)
        for node in NODES[:7]:
            w.ecs.taken[node] = _taken_task(node)
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        for arn in arns[:-1]:
            w.service.on_task_state_change(w.task_stopped(
                arn, exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [check] = [t for t in w.ecs.health_checks_on(NODES[-1]) if t.last_status == "RUNNING"]
        w.service.on_health_check_stopped(w.health_check_stopped(check, 0))  # healthy: an application error
        job = w.repo.jobs.get_job("w")
        assert job.state is JobState.PENDING_RESTART and job.restart_wait is not None
        assert [n for n, _ in job.restart_wait.blocked] == NODES[:NAMED_BLOCKED_NODES]
        assert job.restart_wait.total == 7
        # The fakes' tasks report no gpuIds: the look counts one GPU for such a rank.
        assert job.restart_wait.named_needs() == dict.fromkeys(NODES[:NAMED_BLOCKED_NODES], 1)

        rank_reads: list[tuple[int, int]] = []
        described: list[list[str]] = []
        get_rank_range, describe = w.repo.jobs.get_rank_range, w.ecs.describe_container_instances

        def spied_rank_range(job_id: str, first: int, last: int) -> Any:
            rank_reads.append((first, last))
            return get_rank_range(job_id, first, last)

        def spied_describe(refs: Any) -> Any:
            described.append(sorted(str(r).rsplit("/", 1)[-1] for r in refs))
            return describe(refs)

        monkeypatch.setattr(w.repo.jobs, "get_rank_range", spied_rank_range)
        monkeypatch.setattr(w.ecs, "describe_container_instances", spied_describe)
        for node in NODES[:4]:
            del w.ecs.taken[node]  # the fifth named node is still taken
        for _ in range(3):
            w.advance(60)
            w.service.sweep()
        assert w.repo.jobs.get_job("w").state is JobState.PENDING_RESTART
        assert rank_reads == [] and described == [NODES[:NAMED_BLOCKED_NODES]] * 3

        del w.ecs.taken[NODES[4]]  # the named ones free, two others still taken
        w.advance(60)
        w.service.sweep()
        job = w.repo.jobs.get_job("w")
        assert job.state is JobState.PENDING_RESTART and (0, len(NODES)) in rank_reads
        assert described[-1] == NODES

        w.ecs.taken.clear()
        w.advance(60)
        w.service.sweep()
        job = w.repo.jobs.get_job("w")
        assert job.state in (JobState.STARTING, JobState.RUNNING) and job.attempt == 2


def test_a_waiting_restart_ends_at_its_own_wait_not_at_the_sweeps_earlier_backstop() -> None:
    """Given a job (not relocatable) whose restart waits for a node another scheduler holds, in
    a deployment whose health check and reboot bounds (5 min each) put the sweep's backstop for a
    restart (20 min after the fault) before the wait's end (relocation_wait_seconds, 30 min),
    When the sweep runs every minute, Then the job waits past that backstop, and fails only at
    its wait's end with the wait's reason: the node and what holds it (not "the gang restart
    did not happen in time")."""
    from tests.recovery.fakes import world

    nodes = NODES[:2]
    with world(max_app_restarts=1, relocation_wait_seconds=1800, health_check_timeout_seconds=300,
               reboot_timeout_seconds=300) as w:
        arns = w.register_job("w", nodes)
        w.ecs.taken[nodes[0]] = _taken_task(nodes[0])
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        [check] = [t for t in w.ecs.health_checks_on(nodes[-1]) if t.last_status == "RUNNING"]
        w.service.on_health_check_stopped(w.health_check_stopped(check, 0))  # healthy: an application error
        job = w.repo.jobs.get_job("w")
        assert job.state is JobState.PENDING_RESTART and job.restart_wait is not None
        until = job.restart_wait.until
        while w.now[0] + 60 < until:
            w.advance(60)
            w.service.sweep()
            job = w.repo.jobs.get_job("w")
            assert job.state is JobState.PENDING_RESTART, job.last_error
        for _ in range(2):
            w.advance(60)
            w.service.sweep()
        job = w.repo.jobs.get_job("w")
        assert job.state is JobState.FAILED
        why = job.last_error
        assert why.startswith("restart could not be placed within 1800 s (relocation_wait_seconds)")
        assert f"{nodes[0]}: RESOURCE:GPU" in why and f"held by task {nodes[0]}-web" in why
        [mail] = [n for n in w.notifier.sent if n.job_id == "w" and "Job failed" in n.subject]
        assert f"held by task {nodes[0]}-web" in mail.body
