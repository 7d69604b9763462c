"""Placement you can trust (issue 41), end to end under the emulator, each in a cluster that
another scheduler shares (``local_mode.sim.eager_scheduler``):

1. no placement of the stack's onto a node whose rank's stop is not handled yet, and a node
   judged bad is kept off every scheduler from the moment its verdict commits, whatever call
   failed after it;
2. a recovering job keeps its nodes (``reserved``) until its restart is placed;
3. a restart never fails for a placement race: it waits, then fails only after its bound.
"""

from __future__ import annotations

from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain import placement
from local_mode.remediation_scenarios import MIN, world
from local_mode.sim.api_errors import ATTEMPTS
from local_mode.sim.eager_scheduler import STARTED_BY, EagerScheduler
from tests.remediation.steps import relocation_wait_entries


def _late_stop_on(w: Any, node: str, seconds: float = 90.0) -> Any:
    """A delivery delay for the STOPPED events of the training tasks on ``node``: 90 s (a
    sweep runs in between, and the container-instance event of the node that freed comes
    first). ECS's task events carry no tags: the node tells whose they are."""
    arn = w.ecs.node(node).container_instance_arn

    def delay(event: dict[str, Any]) -> float:
        detail = event.get("detail") or {}
        return seconds if event.get("detail-type") == "ECS Task State Change" and \
            detail.get("lastStatus") == "STOPPED" and detail.get("containerInstanceArn") == arn \
            and not str(detail.get("group", "")).startswith(C.HEALTH_CHECK_GROUP) else 0.0
    return delay


def _started_on(w: Any, node: str, *, by_stack: bool) -> list[tuple[float, str]]:
    """(time, health) of the training tasks placed on ``node`` by the stack (a restart or a
    relocation: not the user's own starts) or by anyone else."""
    own = ("gpujobs", STARTED_BY, "other-team")
    return [(p.time, p.health) for p in w.ecs.placements
            if p.node == node and p.training and (p.started_by not in own) == by_stack]


def _full_cluster_with_a_relocatable_job(w: Any) -> None:
    """node-a..d full: the relocatable job on node-a and node-b, a job on node-c, and another
    team's job on node-d that ends after 12 minutes."""
    for node in ("node-a", "node-b", "node-c", "node-d"):
        w.ecs.add_node(node)
    w.ecs.start_job("reloc", w.training_task_definition, ["node-a", "node-b"],
                    extra_tags={C.TAG_RELOCATABLE: "true"})
    w.ecs.start_job("victim", w.training_task_definition, ["node-c"])
    other = w.ecs.register_training_task_definition("other", gpus=8)
    w.ecs.plan_family("other", run_seconds=12 * MIN, exit_code=0)
    w.ecs.start_job("other", other, ["node-d"], started_by="other-team")


def test_a_relocation_never_takes_a_node_whose_rank_stopped_before_its_stop_is_handled() -> None:
    """Given a relocatable job waiting for a free node (its node-b dead, the cluster full),
    When the GPU of node-c dies under another job's rank and that rank's STOPPED event is
    late (90 s, so the container-instance event and a sweep come first), Then node-c, free in
    ECS but with a rank the stack still records there, is never given to the waiting job:
    the job moves once node-d frees, and node-c is checked and quarantined."""
    with world(relocation_wait_seconds=1800) as w:
        _full_cluster_with_a_relocatable_job(w)
        w.ecs.inject_gpu_fault("node-b", after=MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(6 * MIN)
        assert w.job("reloc")["job_state"] == "PENDING_RESTART" and w.job("reloc").get("relocation_wait")
        w.ecs.delivery_delay = _late_stop_on(w, "node-c")
        w.ecs.inject_gpu_fault("node-c", after=20, health="replace")
        w.ecs.run_for(4 * MIN)
        w.ecs.delivery_delay = None
        assert _started_on(w, "node-c", by_stack=True) == [], "a rank was relocated onto the faulted node"
        w.ecs.run_for(12 * MIN)
        assert w.ranks_on("reloc") == ["node-a", "node-d"], w.job("reloc")["history"]
        assert w.node_item("node-c")["instance_state"] == "QUARANTINED"
        assert _started_on(w, "node-c", by_stack=True) == []
        assert not w.bus.dead_letters


def test_a_waiting_relocation_handles_a_stop_whose_event_never_came_and_takes_the_node() -> None:
    """Given a relocatable job waiting for a free node (its node-b dead, the cluster full),
    When another team's job on node-d ends and its STOPPED event never arrives (dead-lettered),
    Then the waiting relocation finds the node's recorded rank stopped in ECS, handles that
    stop as its event, and moves onto node-d (not failing after its bound)."""
    with world(relocation_wait_seconds=1800) as w:
        _full_cluster_with_a_relocatable_job(w)
        w.ecs.delivery_delay = _late_stop_on(w, "node-d", seconds=10**7)
        w.ecs.inject_gpu_fault("node-b", after=MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(6 * MIN)
        assert w.job("reloc")["job_state"] == "PENDING_RESTART" and w.job("reloc").get("relocation_wait")
        w.ecs.run_for(10 * MIN)
        assert w.job("other")["job_state"] == "COMPLETE", w.job("other")["history"]
        assert w.ranks_on("reloc") == ["node-a", "node-d"], w.job("reloc")["history"]


def test_a_node_judged_dead_takes_no_work_from_another_scheduler_even_if_its_drain_call_fails() -> None:
    """Given a job on node-a/node-b and another scheduler that fills every node the placement
    constraint allows the moment it frees, When node-b's diag says replace and the drain's
    call fails (throttled on every attempt), Then node-b carries ``cordoned`` from its
    verdict's commit (the first effect of the decision): the other scheduler never places on
    it, and the sweep drains it within a minute."""
    with world() as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("dead", w.training_task_definition, ["node-a", "node-b"])
        eager = EagerScheduler(w.ecs, run_seconds=40 * MIN).attach()
        assert [n for _, n, _ in eager.started] == ["node-c"]
        w.aws.faults.inject("ecs", "UpdateContainerInstancesState", count=ATTEMPTS)  # the drain's one call
        w.ecs.inject_gpu_fault("node-b", after=MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(8 * MIN)
        item = w.node_item("node-b")
        judged = float(item["last_fault"]["at"])
        assert item["instance_state"] == "QUARANTINED" and w.job("dead")["job_state"] == "FAILED"
        assert [(t, n) for t, n, _ in eager.started if n == "node-b" and t >= judged] == []
        assert w.ecs.ci_description(w.ecs.node("node-b"))["status"] == "DRAINING"
        assert not w.bus.dead_letters


def test_a_recovering_job_keeps_its_healthy_node_from_a_scheduler_that_places_as_soon_as_it_frees() -> None:
    """Given a job on node-a/node-b and another scheduler that keeps the cluster full, When
    node-b's GPU faults (DCGM: reboot), Then from the fault until the restart is placed,
    node-a (whose rank the stack stops) carries ``reserved`` and the other scheduler never
    takes it; the job restarts on node-a and node-b after the reboot, and node-a's
    reservation goes once every rank is placed."""
    with world() as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("keeps", w.training_task_definition, ["node-a", "node-b"])
        eager = EagerScheduler(w.ecs, run_seconds=40 * MIN).attach()
        w.ecs.inject_gpu_fault("node-b", after=MIN, health="reboot_fixable", nccl_cascade=True)
        w.ecs.run_for(MIN + 10)
        assert _attribute(w, "node-a") == placement.RESERVED
        w.ecs.run_for(9 * MIN)
        assert w.ranks_on("keeps") == ["node-a", "node-b"], w.job("keeps")["history"]
        job = w.job("keeps")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2)
        assert [n for _, n, _ in eager.started if n in ("node-a", "node-b")] == []
        assert _attribute(w, "node-a") is None and w.repo.cordons.worklist().holds == {}
        assert not w.bus.dead_letters


def test_a_restart_whose_node_is_taken_waits_for_it_instead_of_failing_and_says_why() -> None:
    """Given a job (not relocatable) on node-a/node-b, and a scheduler that ignores the
    placement constraint and takes node-a the moment its rank stops, When node-b's GPU faults
    (reboot) and the restart finds node-a busy, Then the job does not fail (today: "restart
    failed" after three RESOURCE:GPU answers): it waits in PENDING_RESTART with the reason
    (node-a, RESOURCE:GPU, the task holding it) shown by the jobs API, and restarts on
    node-a as soon as that task ends."""
    with world(relocation_wait_seconds=1800) as w:
        rogue = _restart_on_a_taken_node(w, 8 * MIN)
        assert [n for _, n, _ in rogue.started] == ["node-a"]
        job = w.job("waits")
        assert job["job_state"] == "PENDING_RESTART", job["history"]
        node_a = w.ecs.node("node-a").container_instance_id
        blocked = job["restart_wait"]["blocked"]
        assert list(blocked) == [node_a] and blocked[node_a].startswith("RESOURCE:GPU")
        assert "started by eager-scheduler" in blocked[node_a]
        from gpu_recovery.queue.jobs_api.reads import _wait_reason

        assert node_a in _wait_reason(job, w.repo.jobs.job_from_item(job))
        w.ecs.run_for(6 * MIN)  # the rogue task ends at ~13 min
        job = w.job("waits")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2), job["history"]
        assert w.ranks_on("waits") == ["node-a", "node-b"]
        assert not [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert relocation_wait_entries(job) == []
        assert not w.bus.dead_letters


def _restart_on_a_taken_node(w: Any, seconds: float) -> EagerScheduler:
    """The job "waits" on node-a/node-b, a scheduler that ignores the placement constraint
    taking node-a the moment its rank stops (its task runs 12 minutes), and node-b's GPU fault
    (reboot); ``seconds`` on, that scheduler places no more (returned, with what it started)."""
    for node in ("node-a", "node-b"):
        w.ecs.add_node(node)
    w.ecs.start_job("waits", w.training_task_definition, ["node-a", "node-b"])
    w.ecs.run_for(MIN)
    rogue = EagerScheduler(w.ecs, run_seconds=12 * MIN, honours_constraint=False,
                           nodes=frozenset({"node-a"})).attach()
    w.ecs.inject_gpu_fault("node-b", after=10, health="reboot_fixable", nccl_cascade=True)
    w.ecs.run_for(seconds)
    rogue.active = False
    return rogue


def _attribute(w: Any, name: str) -> str | None:
    ci = w.ecs.ci_description(w.ecs.node(name))
    values = {a["name"]: a.get("value") for a in ci.get("attributes") or []}
    return values.get(placement.UNAVAILABLE_ATTRIBUTE)


def test_a_waiting_restart_outlasts_an_ecs_outage_at_the_moment_its_node_frees() -> None:
    """Given the waiting restart above (node-a taken by a scheduler that ignores the placement
    constraint), When the reads of the restart's look fail on every attempt, first those that
    ask what holds node-a (ListTasks, DescribeTasks) while it is taken, then the one that says
    whether it is free (DescribeContainerInstances) across the moment it frees, Then the job
    never fails, and while it waits its ``since`` is the same (a look that failed does not reset
    the wait's bound); it restarts on node-a and node-b once ECS answers again,
    with no failure e-mail and no dead letter."""
    with world(relocation_wait_seconds=1800) as w:
        _restart_on_a_taken_node(w, 9 * MIN)
        before = w.job("waits")
        assert before["job_state"] == "PENDING_RESTART" and before.get("restart_wait"), before["history"]
        for phase, operations, minutes in ((1, ("ListTasks", "DescribeTasks"), 2.5),
                                           (2, ("DescribeContainerInstances",), 3.5)):  # frees at ~13 min
            for operation in operations:
                w.aws.faults.persistent("ecs", operation)
            w.ecs.run_for(minutes * MIN)
            failed = {operation: w.aws.faults.count("ecs", operation) for operation in operations}
            for operation in operations:
                w.aws.faults.clear("ecs", operation)
            assert failed[operations[0]] > 0, f"phase {phase}: the look never asked ECS: {failed}"
            during = w.job("waits")
            assert during["job_state"] in ("PENDING_RESTART", "STARTING", "RUNNING"), \
                (phase, during["history"])
            if during["job_state"] == "PENDING_RESTART":
                assert during["restart_wait"]["since"] == before["restart_wait"]["since"], phase
        w.ecs.run_for(4 * MIN)
        job = w.job("waits")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2), job["history"]
        assert w.ranks_on("waits") == ["node-a", "node-b"]
        assert not [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert not w.bus.dead_letters
