"""Hot spares (issue 19) end to end under the emulator: the scheduler keeps a spare free
of queue work, and a relocatable job whose GPU dies moves onto it at once (spare first:
without waiting for the DCGM verdict), while the node is still diagnosed and quarantined."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain import placement
from local_mode.remediation_scenarios import MIN, world
from tests.remediation.steps import relocation_wait_entries, submit_queued_job


def test_a_dead_gpu_moves_the_job_onto_the_spare_before_the_diag_and_the_node_is_still_remediated() -> None:
    """Given node-a/node-b running a relocatable job, node-c free, spare_nodes=1 and a
    queued one-node job (scheduler running), Then the queued job does not take node-c;
    When node-b's GPU dies (DCGM: replace), Then the job runs again on node-a + node-c
    within a minute of the fault (before node-b's diag ends), charged one infrastructure
    recovery; node-b's health check still runs and quarantines it, its verdict recorded
    on the job's suspect (LEFT); the job completes, nothing fails."""

    with world(spare_nodes="1") as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("reloc", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_RELOCATABLE: "true"})
        w.schedule_queue_scheduler()
        submit_queued_job(w, "queued", nnodes=1, priority=10, at=w.ecs.now())
        w.ecs.run_for(4 * MIN)
        assert w.job("queued")["job_state"] in ("QUEUED", "PENDING_RESOURCES")  # node-c is the spare
        fault_at = w.ecs.now() + MIN
        w.ecs.inject_gpu_fault("node-b", after=MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(MIN + MIN)  # the fault, then one minute
        assert w.ranks_on("reloc") == ["node-a", "node-c"]
        job = w.job("reloc")
        assert (job["job_state"], job["attempt"], job["recoveries_used"]) == ("RUNNING", 2, 1)
        assert int(job.get("app_restarts_used") or 0) == 0  # a node fault, not the application's
        restarted = min(float(h["at"]) for h in job["history"] if h["to"] == "RUNNING" and h["at"] > fault_at)
        assert restarted - fault_at <= MIN, restarted - fault_at  # no wait for the diag (~2 min)
        assert relocation_wait_entries(job) == []
        node_b = w.ecs.node("node-b").container_instance_id
        assert w.node_item("node-b")["instance_state"] in ("HEALTH_CHECK_PENDING", "HEALTH_CHECKING")

        w.ecs.run_for(9 * MIN)
        checked = w.node_item("node-b")
        assert checked["instance_state"] == "QUARANTINED"
        assert checked["last_verdict"]["verdict"] == "replace"  # the diag ran on node-b
        assert checked["fault_history"][-1]["job_id"] == "reloc"  # the job's evidence, on the node
        suspect = w.repo.faults.get_suspect("reloc", 1, node_b)
        assert suspect.verdict.value == "LEFT"
        after = w.repo.tables.db.get(w.aws.job_table, {C.JOB_PK: C.suspect_item_key("reloc", 1, node_b)})
        assert after["after_leaving"]["node_state"] == "QUARANTINED"
        job = w.job("reloc")
        assert (job["attempt"], job["recoveries_used"]) == (2, 1)  # the verdict charged nothing more
        w.ecs.run_for(65 * MIN)
        assert w.job("reloc")["job_state"] == "COMPLETE"
        assert not [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert not w.bus.dead_letters


# ------------------------------------------------------------------------------------------
# Issue 29: a full cluster kept full by the user's own scheduler, which honours the one
# documented placement constraint (``attribute:gpu-recovery.unavailable !exists``).

class _ConstraintScheduler:
    """The user's scheduler: tag-registered jobs of one or two 8-GPU ranks, started with
    StartTask on nodes the documented constraint allows (ListContainerInstances with it as
    the ``filter``, as a scheduler that uses StartTask must, placement constraints applying
    to RunTask only), keeping the cluster full."""

    def __init__(self, w: Any) -> None:
        self.w = w
        self.count = 0
        self.started: dict[str, float] = {}
        self.relocatable: set[str] = set()
        self.placements: list[tuple[float, str]] = []  # (when, node) of each rank it started
        self.submitting = True

    def allowed_free_nodes(self) -> list[str]:
        from gpu_recovery.adapters import aws

        ecs = aws.client("ecs")
        cluster = self.w.aws.cluster_name
        arns = ecs.list_container_instances(cluster=cluster, status="ACTIVE",
                                            filter=placement.PLACEMENT_EXPRESSION)["containerInstanceArns"]
        if not arns:
            return []
        described = ecs.describe_container_instances(cluster=cluster, containerInstances=arns)
        free = []
        for ci in described["containerInstances"]:
            gpus = [r for r in ci.get("remainingResources") or [] if r["name"] == "GPU"]
            remaining = len(gpus[0].get("stringSetValue") or []) if gpus else 0
            if ci.get("agentConnected") and remaining >= 8:
                free.append(self.w.ecs.node(ci["containerInstanceArn"]).name)
        return sorted(free)

    def tick(self) -> None:
        while self.submitting:
            free = self.allowed_free_nodes()
            if not free:
                return
            ranks = min(2 if self.count % 3 == 1 else 1, len(free))  # backfill: no node left idle
            job_id = f"user-{self.count:03d}"
            relocatable = self.count % 2 == 0
            family = f"train-{job_id}"
            task_definition = self.w.ecs.register_training_task_definition(family, gpus=8)
            self.w.ecs.plan_family(family, run_seconds=(25 + self.count * 7 % 30) * MIN, exit_code=0)
            tags = {C.TAG_RELOCATABLE: "true"} if relocatable else {}
            self.w.ecs.start_job(job_id, task_definition, free[:ranks], extra_tags=tags)
            self.placements += [(self.w.ecs.now(), n) for n in free[:ranks]]
            self.started[job_id] = self.w.ecs.now()
            if relocatable:
                self.relocatable.add(job_id)
            self.count += 1


def _holds(w: Any) -> dict[str, str]:
    """node name -> why it is held (spare | reserved)."""
    return {w.node_name(n): str(h["why"]) for n, h in w.repo.cordons.worklist().holds.items()}


def _unavailable(w: Any, name: str) -> str | None:
    from gpu_recovery.adapters import aws

    ci = aws.client("ecs").describe_container_instances(
        cluster=w.aws.cluster_name, containerInstances=[w.ecs.node(name).container_instance_arn])
    values = {a["name"]: a.get("value") for a in ci["containerInstances"][0].get("attributes") or []}
    return values.get(placement.UNAVAILABLE_ATTRIBUTE)


def _status(w: Any, name: str) -> str:
    return str(w.ecs.ci_description(w.ecs.node(name))["status"])


# Slow tier: a 16-node cluster for hours (~45 s); make test-campaigns' full_cluster flow and
# the relocation bench cover it, tests/recovery/test_spare_first.py and
# test_placement_holds.py the stages.
@pytest.mark.slow
def test_a_full_cluster_whose_scheduler_honours_the_constraint_restarts_dead_gpu_jobs_on_spares() -> None:
    """Given 16 nodes, spare_nodes=2, and the user's own scheduler keeping every node the
    documented constraint allows busy (half its jobs relocatable), Then the stack marks two
    wholly free nodes ``gpu-recovery.unavailable=spare`` and the user's scheduler never
    starts a rank on them; When three relocatable jobs lose a GPU (DCGM: replace), 30
    minutes apart, Then each runs again within a minute of its fault with its dead node's
    rank on what was a spare, and completes; the pool is refilled from the next node that
    frees (before the user's scheduler sees it), and the dead nodes are drained."""
    with world(spare_nodes="2") as w:
        for i in range(16):
            w.ecs.add_node(f"node-{i:02d}")
        w.ecs.run_for(MIN)  # the stack is there before the user's scheduler fills the cluster
        spares = _holds(w)
        assert sorted(spares.values()) == ["spare", "spare"], spares
        assert all(_unavailable(w, n) == "spare" for n in spares)
        user = _ConstraintScheduler(w)
        faults: dict[str, tuple[float, str, set[str]]] = {}  # job -> (fault time, dead node, spares then)
        for minute in range(1, 95):
            held = {n for n, why in _holds(w).items() if why == "spare"}
            user.tick()
            assert not {n for at, n in user.placements if at == w.ecs.now()} & held, "a spare was taken"
            if minute in (20, 50, 80):
                busy = {t.node for t in w.ecs.running_tasks()}
                usable = {n for n in w.ecs.nodes
                          if _status(w, n) == "ACTIVE" and not w.node_item(n).get("cordon")}
                assert usable - busy == held and len(held) == 2, (usable - busy, held)  # full but for spares
                victim = sorted(j for j in user.relocatable if j not in faults and w.ranks_on(j)
                                and w.job(j).get("job_state") == "RUNNING")[0]
                dead = w.ranks_on(victim)[0]
                faults[victim] = (w.ecs.now() + 1, dead, held)
                # NCCL peers only with more than one rank (the simulation's cascade picks the
                # job's tasks when it fires, so it would also kill a restart it did not see).
                w.ecs.inject_gpu_fault(dead, after=1, health="replace",
                                       nccl_cascade=len(w.ranks_on(victim)) > 1)
            if minute == 85:
                user.submitting = False
            w.ecs.run_for(MIN)
        w.ecs.run_for(60 * MIN)  # every job runs to its end

        assert len(faults) == 3
        for job_id, (fault_at, dead, spares_then) in faults.items():
            job = w.job(job_id)
            assert job["job_state"] == "COMPLETE", (job_id, job["job_state"], job.get("last_error"))
            restarted = min(float(h["at"]) for h in job["history"]
                            if h["to"] == "RUNNING" and h["at"] >= fault_at)
            assert restarted - fault_at <= MIN, (job_id, restarted - fault_at)  # measured, not assumed
            moves = w.repo.faults.placement(job_id, 2)
            [(left, move)] = moves.items()
            assert w.node_name(left) == dead, (moves, dead)
            assert w.node_name(move["node"]) in spares_then, (moves, spares_then)  # onto a spare
            assert _status(w, dead) == "DRAINING"  # quarantined: off every scheduler's placement
        assert sorted(_holds(w).values()) == ["spare", "spare"]  # the pool refilled
        assert not [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert not w.bus.dead_letters


# ------------------------------------------------------------------------------------------
# Issue 29: spares lent to LOW-priority queue work, taken back by suspension.

# Slow tier: ~20 s of a whole cluster; the lending stages are tested with fakes (tests/recovery,
# tests/time_sharing) in make test.
@pytest.mark.slow
def test_a_spare_lent_to_a_low_queue_job_is_taken_back_by_suspending_it_for_a_relocation() -> None:
    """Given node-a/node-b running a relocatable job, node-c the spare (spare_nodes=1) and
    lend_spares on, When a LOW queue job is submitted, Then it runs on node-c, whose hold
    says it is lent (still ``spare`` for every other scheduler; no other node becomes a
    spare); a NORMAL job would not have got it. When node-b's GPU dies (DCGM: replace),
    Then the relocation waits for node-c, the LOW job is asked to suspend (preempted, its
    grace to checkpoint), is requeued, and the relocated job runs on node-a + node-c and
    completes; the LOW job runs again once nodes free, and nothing fails."""
    with world(spare_nodes="1", lend_spares=True, relocation_wait_seconds=1800) as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("reloc", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_RELOCATABLE: "true"})
        w.schedule_queue_scheduler()
        w.ecs.run_for(2 * MIN)
        assert _holds(w) == {"node-c": "spare"}
        submit_queued_job(w, "normal", nnodes=1, priority=10, at=w.ecs.now())
        submit_queued_job(w, "low", nnodes=1, priority=0, at=w.ecs.now())
        w.ecs.run_for(3 * MIN)
        assert w.job("normal")["job_state"] in ("QUEUED", "PENDING_RESOURCES")  # never lent to NORMAL
        assert (w.job("low")["job_state"], w.ranks_on("low")) == ("RUNNING", ["node-c"])
        holds = w.repo.cordons.worklist().holds
        node_c = w.ecs.node("node-c").container_instance_id
        assert placement.lent_of(holds) == {node_c: "low"} and _holds(w) == {"node-c": "spare"}
        assert _unavailable(w, "node-c") == "spare"  # the user's schedulers still keep off it

        fault_at = w.ecs.now()
        w.ecs.inject_gpu_fault("node-b", after=0, health="replace", nccl_cascade=True)
        w.ecs.run_for(20 * MIN)
        low = w.job("low")
        suspended = [h for h in low["history"] if h["to"] == "SUSPENDING"]
        assert suspended and "needed by the relocation of job reloc" in suspended[0]["reason"], low["history"]
        assert any(h["to"] == "SUSPENDED" for h in low["history"])
        job = w.job("reloc")
        assert (job["job_state"], w.ranks_on("reloc")) == ("RUNNING", ["node-a", "node-c"]), job["history"]
        assert relocation_wait_entries(job)  # it waited for the lent spare, not failed
        restarted = min(float(h["at"]) for h in job["history"] if h["to"] == "RUNNING" and h["at"] > fault_at)
        assert restarted - fault_at < 15 * MIN
        assert node_c not in placement.lent_of(w.repo.cordons.worklist().holds)
        assert w.job("low")["job_state"] == "SUSPENDED"  # queued again at its position, waiting

        w.ecs.run_for(70 * MIN)
        assert w.job("reloc")["job_state"] == "COMPLETE"
        assert w.job("low")["job_state"] in ("RUNNING", "COMPLETE")  # resumed once nodes freed
        assert w.job("low")["attempt"] >= 2
        assert not [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert not w.bus.dead_letters
