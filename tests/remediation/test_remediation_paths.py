"""The remediation paths beyond the demo's scenarios, end to end under the emulator: the
application-error budget and the XID repeat rule, replacement in an Auto Scaling group,
ECS Anywhere, a queue job relocated through the scheduler, relocate_instead_of_wait."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_recovery import constants as C
from local_mode.remediation_scenarios import MIN, world
from local_mode.sim.api_errors import THROTTLING
from tests.fixtures.history import state_changes
from tests.remediation.steps import queue_job_running_on_three_nodes, submit_queued_job


def _job_history(job: dict[str, Any]) -> list[str]:
    return [str(h.get("to")) for h in state_changes(job.get("history", []))]


# Slow tier (CI runs it: make test-slow): a whole emulated remediation (~3-5 s); make test
# covers the same stage with fakes (tests/recovery/test_remediation_stages.py and the like).
@pytest.mark.slow
def test_application_xid_restarts_within_its_budget_and_a_repeat_earns_a_health_check() -> None:
    """Given a job with one application-error restart, When XID 13 (an application error by
    NVIDIA's catalog) kills a rank, Then the job restarts on the same nodes with no diag and
    no node action; When XID 13 repeats on the same GPU (within 24 h), Then the catalog's
    repeat rule runs the DCGM diag, which finds the GPU healthy: an application error with
    no restart left, the job FAILS."""
    with world() as w:
        for node in ("node-a", "node-b"):
            w.ecs.add_node(node)
        w.ecs.start_job("app-err", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_MAX_APP_RESTARTS: "1"})
        w.ecs.inject_xid("node-b", 13, after=5 * MIN, health="healthy", nccl_cascade=True)
        w.ecs.run_for(10 * MIN)
        job = w.job("app-err")
        assert job["job_state"] == "RUNNING" and job["attempt"] == 2
        assert (job["app_restarts_used"], job["recoveries_used"]) == (1, 0)
        assert w.ecs.counters["health_checks_started"] == 0 and w.ecs.counters["reboots"] == 0
        assert "PENDING_RESTART" in _job_history(job) and "PENDING_HEALTHCHECK" not in _job_history(job)
        record = w.fault_record("app-err", 1)
        assert record["plan"]["decision"]["rule_id"] == "xid-13"
        # The node's history has it too, with its evidence, though nothing was done to it.
        node_item = w.aws.resource("dynamodb").Table(w.aws.instance_table).get_item(
            Key={C.INSTANCE_PK: w.ecs.node("node-b").container_instance_id})["Item"]
        [entry] = [h for h in node_item["fault_history"] if h.get("job_id") == "app-err"]
        assert entry["evidence"]["spent"] == "application" and entry["charged_job"] is False

        w.ecs.inject_xid("node-b", 13, after=5 * MIN, health="healthy")
        w.ecs.run_for(10 * MIN)
        job = w.job("app-err")
        assert job["job_state"] == "FAILED"
        assert w.ecs.counters["health_checks_started"] == 1 and w.ecs.counters["reboots"] == 0
        second = w.fault_record("app-err", 2)
        assert second["plan"]["decision"]["repeated"] is False  # decided after the diag
        assert "application error" in job["last_error"]
        assert not w.bus.dead_letters


def test_replace_terminates_the_node_in_its_auto_scaling_group_and_the_job_moves() -> None:
    """Given replace_action terminate_in_asg and nodes in an Auto Scaling group, When XID 64
    (row-remap failure: replace, definitive) kills a rank, Then the node is drained and
    terminated in its group without decrementing capacity (the group launches a new node),
    and the relocatable job moves to the spare node and completes."""
    with world(remediation={"replace_action": "terminate_in_asg"}, replacement_seconds=120) as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.put_in_auto_scaling_group(["node-a", "node-b", "node-c"])
        first = w.ecs.start_job("asg-job", w.training_task_definition, ["node-a", "node-b"],
                                extra_tags={C.TAG_RELOCATABLE: "true"})
        w.ecs.inject_xid("node-b", 64, after=5 * MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(10 * MIN)
        assert w.ranks_on("asg-job") == ["node-a", "node-c"]
        # moved, each rank item keeps its attempt-1 task (`gpujobs logs --attempt 1` reads it)
        job = w.repo.jobs.get_job("asg-job")
        assert job is not None and job.attempt == 2
        assert [r.task_of_attempt(1).task_arn for r in w.repo.jobs.get_ranks(job)] == first  # type: ignore[union-attr]
        node_b = w.node_item("node-b")
        assert node_b["instance_state"] == "QUARANTINED" and "terminat" in node_b["terminate_result"]
        assert w.ecs.counters["terminations"] == 1 and w.ecs.counters["reboots"] == 0
        assert "node-b-r1" in w.ecs.nodes  # the group's new node registered
        asg = w.aws.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"][0]
        assert asg["DesiredCapacity"] == 3  # capacity kept
        w.ecs.run_for(70 * MIN)
        assert w.job("asg-job")["job_state"] == "COMPLETE"
        assert not w.bus.dead_letters


def test_an_ecs_anywhere_node_is_quarantined_and_the_operator_told_instead_of_terminated() -> None:
    with world(remediation={"replace_action": "terminate_in_asg"}) as w:
        w.ecs.add_node("node-a")
        w.ecs.add_node("node-b", kind="anywhere")
        w.ecs.start_job("onprem", w.training_task_definition, ["node-a", "node-b"])
        w.ecs.inject_xid("node-b", 64, after=5 * MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(10 * MIN)
        assert w.node_item("node-b")["instance_state"] == "QUARANTINED"
        assert w.ecs.counters["terminations"] == 0
        kinds = [n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) for n in w.aws.notifications()]
        assert "operator_action" in kinds
        told = next(n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "operator_action")
        assert "ECS Anywhere" in told["subject"] + str(told["message"])
        assert w.job("onprem")["job_state"] == "FAILED"  # not relocatable: its tasks lack the tag


def test_relocate_instead_of_wait_moves_the_job_while_its_node_reboots() -> None:
    """Given relocate_instead_of_wait and a healthy free node, When XID 79 needs node-b
    rebooted, Then the job restarts on node-a and the spare at once (not ~3 minutes later,
    after the reboot), and node-b is still rebooted and back in service."""
    with world(relocate_instead_of_wait=True) as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("fast-move", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_RELOCATABLE: "true"})
        w.ecs.inject_xid("node-b", 79, after=5 * MIN, nccl_cascade=True)
        w.ecs.run_for(5 * MIN + 40)
        assert w.ranks_on("fast-move") == ["node-a", "node-c"]
        assert w.ecs.node("node-b").rebooting
        job = w.job("fast-move")
        assert "relocate_instead_of_wait" in json.dumps(job["relocations"])
        w.ecs.run_for(10 * MIN)
        assert w.node_item("node-b")["instance_state"] == "AVAILABLE"
        assert not w.bus.dead_letters


def test_a_queue_job_is_relocated_through_the_scheduler_at_the_head_of_its_priority() -> None:
    """Given a queue job on node-0 and node-1, and a job of the same priority submitted
    earlier but waiting (too big for the free node), When node-1's GPU dies (DCGM: replace),
    Then the job goes back to the queue ahead of the earlier one (its own submission time
    kept in its queue key), and the scheduler starts it on healthy nodes with a new
    MASTER_ADDR; its history says which node it left, where it went and why; the e-mail
    carries the fault's evidence."""

    with world() as w:
        queue_job_running_on_three_nodes(w)
        first = w.job("q-job")
        assert first["job_state"] == "RUNNING"
        submitted = float(first["submitted_at"])
        submit_queued_job(w, "early-job", nnodes=3, priority=10, at=submitted - 100)  # waits: 1 node free
        w.ecs.run_for(MIN)
        early = w.job("early-job")
        assert early["job_state"] in ("QUEUED", "PENDING_RESOURCES")
        from gpu_recovery.repository.scheduling import SchedulingRepository

        nodes, _ = SchedulingRepository(w.repo.jobs).plan_nodes("q-job", 1, 2)
        victim = w.node_name(nodes[1].rsplit("/", 1)[-1])
        w.ecs.inject_gpu_fault(victim, after=MIN, health="replace", nccl_cascade=True)
        seen: list[str] = []

        def requeued() -> bool:
            order = str(w.job("q-job").get(C.QUEUE_SK, ""))
            if order:
                seen.append(order)
            return bool(order)

        w.ecs.run_until_true(requeued, max_seconds=15 * MIN)
        assert seen[0] == C.relocated_queue_order(10, submitted, "q-job")
        assert seen[0].startswith(f"{999 - 10:03d}#{C.RELOCATED_QUEUE_MARK}")
        assert seen[0] < str(early[C.QUEUE_SK])  # ahead of the job submitted before it
        assert submitted - 100 < submitted
        w.ecs.run_for(5 * MIN)
        job = w.job("q-job")
        assert job["job_state"] == "RUNNING" and job["attempt"] == 2
        assert job["recoveries_used"] == 1
        assert w.node_item(victim)["instance_state"] == "QUARANTINED"
        assert victim not in w.ranks_on("q-job") and len(w.ranks_on("q-job")) == 2
        (moved,) = job["relocations"]
        assert moved["reason"].startswith("node(s) unusable")
        assert moved["master_addr"] == job["launch"]["master_addr"]
        assert moved["left"] == [w.ecs.node(victim).container_instance_id] and moved["nodes"] == 2
        left = w.ecs.node(victim).container_instance_id
        assert any(h["reason"].startswith(f"relocated (attempt 2) off {left} to 2 healthy node(s)")
                   for h in job["history"])
        assert w.job("early-job")["job_state"] in ("QUEUED", "PENDING_RESOURCES")  # still behind it
        relocated = [n for n in w.aws.notifications()
                     if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "relocated"]
        assert len(relocated) == 1
        assert "DCGM health check: replace" in str(relocated[0]["message"])
        assert "Decision for" in str(relocated[0]["message"])
        assert not w.bus.dead_letters


def test_reboot_observed_the_node_is_left_alone_and_the_job_moves_to_a_spare() -> None:
    """Given remediation_mode enforce,reboot=observe, When XID 79 (reboot, definitive) kills
    a rank of a relocatable job, Then the node is never rebooted (its history records the
    reboot as not executed), the job's ranks are stopped and it restarts on the healthy
    node and the spare, and one 'observed' e-mail says what was not done."""
    with world(remediation={"remediation_mode": "enforce,reboot=observe"}) as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("obs-reboot", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_RELOCATABLE: "true"})
        w.ecs.inject_xid("node-b", 79, after=5 * MIN, nccl_cascade=True)
        w.ecs.run_for(10 * MIN)
        assert w.ecs.counters["reboots"] == 0 and w.ecs.counters["health_checks_started"] == 0
        assert w.ranks_on("obs-reboot") == ["node-a", "node-c"]
        node_b = w.node_item("node-b")
        # SUSPECT: the heartbeat service's own flag on the XID report (not a remediation).
        assert node_b["instance_state"] == "SUSPECT" and "breaker_blocked" not in node_b
        assert [(r["action"], r["executed"]) for r in node_b["fault_history"]] == [("reboot", False)]
        job = w.job("obs-reboot")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2)
        observed = [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "observed"]
        assert len(observed) == 1
        assert "Would have done (not carried out): reboot (observe mode)" in str(observed[0]["message"])
        assert not w.bus.dead_letters


# Slow tier (CI runs it: make test-slow): a whole emulated remediation (~3-5 s); make test
# covers the same stage with fakes (tests/recovery/test_remediation_stages.py and the like).
@pytest.mark.slow
def test_drain_observed_a_node_to_replace_is_not_drained_and_the_job_moves() -> None:
    """Given remediation_mode enforce,drain=observe, When the DCGM diag says replace (a dead
    GPU), Then the container instance stays ACTIVE (no drain), its history records the
    replacement as not executed, the relocatable job moves to the spare and completes, and
    the operator is told what was not done."""
    with world(remediation={"remediation_mode": "enforce,drain=observe"}) as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("obs-drain", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_RELOCATABLE: "true"})
        w.ecs.inject_gpu_fault("node-b", after=5 * MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(15 * MIN)
        assert w.ecs.counters["health_checks_started"] == 1 and w.ecs.counters["reboots"] == 0
        assert w.ranks_on("obs-drain") == ["node-a", "node-c"]
        ecs = w.aws.client("ecs")
        [described] = ecs.describe_container_instances(
            cluster=w.aws.cluster_name,
            containerInstances=[w.ecs.node("node-b").container_instance_arn])["containerInstances"]
        assert described["status"] == "ACTIVE"
        node_b = w.node_item("node-b")
        assert node_b["instance_state"] != "QUARANTINED" and "drain_pending" not in node_b
        assert [(r["action"], r["executed"]) for r in node_b["fault_history"]] == [("replace", False)]
        summary = node_b["fault_history"][0]["evidence"]
        assert summary["dcgm"]["verdict"] == "replace"
        observed = [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "observed"]
        assert len(observed) == 1 and "drain" in str(observed[0]["message"])
        w.ecs.run_for(70 * MIN)
        assert w.job("obs-drain")["job_state"] == "COMPLETE"
        assert not w.bus.dead_letters


# Slow tier (CI runs it: make test-slow): a whole emulated remediation (~3-5 s); make test
# covers the same stage with fakes (tests/recovery/test_remediation_stages.py and the like).
@pytest.mark.slow
def test_a_job_placed_on_a_node_the_stack_is_about_to_reboot_is_recovered_not_failed() -> None:
    """Given XID 79 on node-b (fast path: reboot) and RebootInstances failing for a while (the
    reboot is late, as in the soak's seed 4 at 1 %), When the user's scheduler starts another
    job with a rank on node-b in that window and the reboot then kills that rank (exit 137),
    Then that job is not FAILED nor charged an application error: its rank's stop is an
    infrastructure fault of node-b, whose verdict (reboot) is already known; the job waits
    for node-b and restarts on it once it is back. (The first job has no recovery left, so
    node-b is free for the second one after the reboot.)"""
    with world() as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        # The first job has no recovery left: its fault ends it, node-b is the second job's after.
        w.ecs.start_job("first", w.training_task_definition, ["node-b"],
                        extra_tags={C.TAG_MAX_INFRA_RECOVERIES: "0"})
        w.aws.faults.persistent("ec2", "RebootInstances", error=THROTTLING)
        w.ecs.inject_xid("node-b", 79, after=2 * MIN, health="reboot_fixable")
        w.ecs.run_for(4 * MIN)
        assert w.node_item("node-b")["instance_state"] == "REBOOTING" and w.ecs.counters["reboots"] == 0

        w.ecs.start_job("placed", w.training_task_definition, ["node-a", "node-b"])
        w.ecs.run_for(1 * MIN)
        assert w.job("placed")["job_state"] == "RUNNING"
        w.aws.faults.clear()
        w.ecs.run_for(10 * MIN)

        assert w.ecs.counters["reboots"] == 1
        placed = w.job("placed")
        assert placed["job_state"] == "RUNNING" and placed["attempt"] == 2, placed.get("last_error")
        assert placed.get("app_restarts_used", 0) == 0
        assert "PENDING_HEALTHCHECK" in _job_history(placed)
        assert sorted(w.ranks_on("placed")) == ["node-a", "node-b"]
        assert w.ecs.counters["health_checks_started"] == 0  # the verdict was known: no diag
        assert w.job("first")["job_state"] == "FAILED"
        assert not w.bus.dead_letters


def test_a_simulated_gpu_report_is_checked_as_the_node_api_checks_a_real_one() -> None:
    """Given the node agent's GPU report as local mode sends it, When it is out of the node
    API's bounds or names another node, Then it is refused as the route refuses it (nothing
    written, the agent retries); a good one is accepted and flags the node's XID."""
    from handlers.node_api import ApiError

    with world() as w:
        for node in ("node-a", "node-b"):
            w.ecs.add_node(node)
        node_id = w.ecs.node("node-a").container_instance_id
        body = w.ecs.gpu_report_body(w.ecs.node("node-a"), {0: [79]})
        too_hot = {**body, "gpus": [{**body["gpus"][0], "temperature_c": 1000}, *body["gpus"][1:]]}
        with pytest.raises(ApiError) as refused:
            w.ecs.gpu_reporter("node-a", too_hot)
        assert (refused.value.status, refused.value.code, refused.value.field) == (
            400, "invalid_report", "gpus.0.temperature_c")
        other = {**body, "node_id": w.ecs.node("node-b").container_instance_id}
        with pytest.raises(ApiError) as mismatch:
            w.ecs.gpu_reporter("node-a", other)
        assert mismatch.value.status == 403
        heartbeats = w.aws.resource("dynamodb").Table(w.aws.instance_table)
        assert "Item" not in heartbeats.get_item(Key={C.INSTANCE_PK: node_id})  # nothing written
        accepted = w.ecs.gpu_reporter("node-a", body)
        assert accepted.node_id == node_id and accepted.gpus == 8 and accepted.suspect
        assert "Item" in heartbeats.get_item(Key={C.INSTANCE_PK: node_id})
