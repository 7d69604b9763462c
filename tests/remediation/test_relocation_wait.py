"""No healthy node free: a relocatable job waits for one instead of failing (issue 19),
end to end under the emulator (events delivered at least once: every one twice here)."""

from __future__ import annotations

import json

import pytest

from gpu_recovery import constants as C
from local_mode.remediation_scenarios import MIN, world
from local_mode.world import World
from tests.remediation.steps import (
    queue_job_running_on_three_nodes,
    relocation_wait_entries,
    submit_queued_job,
)


def _full_cluster(w: World, other_runs_seconds: float) -> None:
    """node-a/node-b: the relocatable job (60 min); node-c: another job that ends after
    ``other_runs_seconds``. Nothing is free."""
    for node in ("node-a", "node-b", "node-c"):
        w.ecs.add_node(node)
    short = w.ecs.register_training_task_definition("short", gpus=8)
    w.ecs.plan_family("short", run_seconds=other_runs_seconds, exit_code=0)
    w.ecs.start_job("other", short, ["node-c"])
    w.ecs.start_job("reloc", w.training_task_definition, ["node-a", "node-b"],
                    extra_tags={C.TAG_RELOCATABLE: "true"})


# Slow tier: ~20 s; the crash campaigns' relocation-wait flow runs it with every call broken, and
# the queue-job variant below stays in make test.
@pytest.mark.slow
def test_a_dead_gpu_in_a_full_cluster_waits_then_moves_to_the_node_that_frees_and_completes() -> None:
    """Given a full cluster (and a queued one-node job waiting for GPUs, scheduler running),
    When node-b's GPU dies (DCGM: replace), Then the relocatable job waits in
    PENDING_RESTART instead of failing; When the other job completes and frees node-c,
    Then the waiting job (not the queued one) gets node-c, restarts there and completes;
    its budget is charged once and the queued job runs after it."""

    with world(relocation_wait_seconds=1800) as w:
        _full_cluster(w, other_runs_seconds=20 * MIN)
        w.schedule_queue_scheduler()
        submit_queued_job(w, "queued", nnodes=1, priority=10, at=w.ecs.now())
        w.ecs.inject_gpu_fault("node-b", after=5 * MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(15 * MIN)
        job = w.job("reloc")
        assert job["job_state"] == "PENDING_RESTART" and job["relocation_wait"]["attempt"] == 1
        assert w.node_item("node-b")["instance_state"] == "QUARANTINED"
        assert len(relocation_wait_entries(job)) == 1  # duplicate deliveries wrote nothing twice
        assert w.ranks_on("reloc") == []
        assert w.job("queued")["job_state"] in ("QUEUED", "PENDING_RESOURCES")

        w.ecs.run_for(8 * MIN)  # "other" completes at ~20 min: node-c frees
        assert w.job("other")["job_state"] == "COMPLETE"
        assert w.ranks_on("reloc") == ["node-a", "node-c"]
        job = w.job("reloc")
        assert (job["job_state"], job["attempt"], job["recoveries_used"]) == ("RUNNING", 2, 1)
        moves = [m.get("moves") for m in job["relocations"]]
        node_b, node_c = (w.ecs.node(n).container_instance_id for n in ("node-b", "node-c"))
        assert moves == [{node_b: node_c}]
        assert "after waiting" in json.dumps(job["relocations"])
        assert w.job("queued")["job_state"] in ("QUEUED", "PENDING_RESOURCES")

        w.ecs.run_for(65 * MIN)
        assert w.job("reloc")["job_state"] == "COMPLETE"
        assert w.job("queued")["job_state"] in ("STARTING", "RUNNING", "COMPLETE")
        assert not [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert not w.bus.dead_letters


# Slow tier (CI runs it: make test-slow): ~7 s of a full cluster; tests/recovery/test_relocation_wait.py
# covers the bound with fakes in make test.
@pytest.mark.slow
def test_no_node_frees_within_the_wait_and_the_job_fails_with_that_reason() -> None:
    with world(relocation_wait_seconds=600) as w:
        _full_cluster(w, other_runs_seconds=60 * MIN)
        w.ecs.inject_gpu_fault("node-b", after=5 * MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(12 * MIN)
        job = w.job("reloc")
        assert job["job_state"] == "PENDING_RESTART"
        waited_from = float(job["relocation_wait"]["since"])
        w.ecs.run_for(12 * MIN)
        job = w.job("reloc")
        assert job["job_state"] == "FAILED" and job["recoveries_used"] == 1
        assert job["last_error"].startswith("no healthy node freed within 600 s to relocate the ranks on "
                                            f"{w.ecs.node('node-b').container_instance_id}")
        failed_at = max(float(h["at"]) for h in job["history"] if h["to"] == "FAILED")
        assert 600 <= failed_at - waited_from <= 600 + 2 * MIN
        assert len(relocation_wait_entries(job)) == 1
        failed = [n for n in w.aws.notifications()
                  if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert len(failed) == 1 and "no healthy node freed within 600 s" in str(failed[0]["message"])
        assert w.job("other")["job_state"] == "RUNNING"
        assert not w.bus.dead_letters


def test_a_queue_job_in_a_full_cluster_goes_back_to_the_queue_head_and_starts_when_a_node_frees() -> None:
    """Given a full cluster (a 2-node queue job, a tag-registered job on the third node),
    When a GPU of the queue job dies (replace), Then the job does not fail: it goes back to
    the queue at the head of its priority and waits there; When the other job completes,
    Then the scheduler starts it on the healthy nodes (attempt 2)."""
    from gpu_recovery.repository.scheduling import SchedulingRepository

    with world() as w:
        queue_job_running_on_three_nodes(w)
        assert w.job("q-job")["job_state"] == "RUNNING"
        nodes, _ = SchedulingRepository(w.repo.jobs).plan_nodes("q-job", 1, 2)
        used = [w.node_name(n.rsplit("/", 1)[-1]) for n in nodes]
        [free] = sorted({"node-0", "node-1", "node-2"} - set(used))
        short = w.ecs.register_training_task_definition("short", gpus=8)
        w.ecs.plan_family("short", run_seconds=20 * MIN, exit_code=0)
        w.ecs.start_job("other", short, [free])
        w.ecs.inject_gpu_fault(used[1], after=MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(10 * MIN)
        job = w.job("q-job")
        assert job["job_state"] == "PENDING_RESOURCES" and job["recoveries_used"] == 1
        assert str(job[C.QUEUE_SK]).startswith(f"{999 - 10:03d}#{C.RELOCATED_QUEUE_MARK}")
        assert w.ranks_on("q-job") == []
        w.ecs.run_for(15 * MIN)  # "other" completes at ~22 min
        job = w.job("q-job")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2)
        assert w.ranks_on("q-job") == sorted([used[0], free])
        assert not w.bus.dead_letters
