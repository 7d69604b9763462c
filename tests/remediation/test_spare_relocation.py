"""Hot spares (issue 19) end to end under the emulator: the scheduler keeps a spare free
of queue work, and a relocatable job whose GPU dies moves onto it at once (spare first:
without waiting for the DCGM verdict), while the node is still diagnosed and quarantined."""

from __future__ import annotations

from gpu_recovery import constants as C
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
        after = w.repo.db.get(w.aws.job_table, {C.JOB_PK: C.suspect_item_key("reloc", 1, node_b)})
        assert after["after_leaving"]["node_state"] == "QUARANTINED"
        job = w.job("reloc")
        assert (job["attempt"], job["recoveries_used"]) == (2, 1)  # the verdict charged nothing more
        w.ecs.run_for(65 * MIN)
        assert w.job("reloc")["job_state"] == "COMPLETE"
        assert not [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        assert not w.bus.dead_letters
