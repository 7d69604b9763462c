"""Hot spares (issue 19) end to end under the emulator: the scheduler keeps a spare free
of queue work, and a relocatable job whose GPU dies moves onto it and completes."""

from __future__ import annotations

from gpu_recovery import constants as C
from local_mode.remediation_scenarios import MIN, world
from tests.remediation.test_relocation_wait import _wait_entries
from tests.remediation.test_remediation_paths import _submit


def test_a_dead_gpu_relocates_the_job_onto_the_spare_the_scheduler_kept_free() -> None:
    """Given node-a/node-b running a relocatable job, node-c free, spare_nodes=1 and a
    queued one-node job (scheduler running), Then the queued job does not take node-c;
    When node-b's GPU dies (DCGM: replace), Then the job restarts on node-a + node-c
    without waiting, and completes; node-b is quarantined, nothing fails."""
    from handlers import queue_scheduler

    with world(spare_nodes="1") as w:
        for node in ("node-a", "node-b", "node-c"):
            w.sim.add_node(node)
        w.sim.start_job("reloc", w.td, ["node-a", "node-b"], extra_tags={C.TAG_RELOCATABLE: "true"})
        w.bus.add_schedule("queue-scheduler", 60, queue_scheduler.lambda_handler, "queue_scheduler")
        _submit(w, "queued", nnodes=1, priority=10, at=w.sim.now())
        w.sim.run_for(4 * MIN)
        assert w.job("queued")["job_state"] in ("QUEUED", "PENDING_RESOURCES")  # node-c is the spare
        fault_at = w.sim.now() + MIN
        w.sim.inject_gpu_fault("node-b", after=MIN, health="replace", nccl_cascade=True)
        w.sim.run_for(10 * MIN)
        assert w.ranks_on("reloc") == ["node-a", "node-c"]
        job = w.job("reloc")
        assert (job["job_state"], job["attempt"], job["recoveries_used"]) == ("RUNNING", 2, 1)
        assert _wait_entries(job) == []  # a spare was free: no wait
        restarted = min(float(h["at"]) for h in job["history"] if h["to"] == "RUNNING" and h["at"] > fault_at)
        assert restarted - fault_at <= 3 * MIN, restarted - fault_at  # the diag (~2 min), no reboot, no wait
        assert w.node_item("node-b")["instance_state"] == "QUARANTINED"
        w.sim.run_for(65 * MIN)
        assert w.job("reloc")["job_state"] == "COMPLETE"
        assert not [n for n in w.local.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert not w.bus.dead_letters
