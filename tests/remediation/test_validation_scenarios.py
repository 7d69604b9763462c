"""Validation after repair end to end under the emulator (issue 43): the deployed handlers, the
simulated ECS data plane (a node whose repair does not hold passes idle checks and fails under
load), every event delivered twice. The stage's every branch is tested with fakes
(tests/recovery/test_validations.py); its every AWS call broken, by the crash campaign
``validation``."""

from __future__ import annotations

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain import placement
from gpu_recovery.domain.validation import ValidationPolicy
from local_mode.remediation_scenarios import MIN, world
from local_mode.world import World

ON = ValidationPolicy(enabled=True, dcgm_level=1, load_seconds=30)


def attributes(w: World, node: str) -> dict[str, str]:
    """node's custom ECS attributes, as every other scheduler sees them (the emulator's own
    client: not the stack's calls)."""
    [ci] = w.aws.client("ecs").describe_container_instances(
        cluster=w.aws.cluster_name, containerInstances=[w.ecs.node(node).container_instance_arn]
    )["containerInstances"]
    return {a["name"]: a.get("value", "") for a in ci.get("attributes") or [] if a["name"].startswith("gpu-")}


# Slow tier (CI runs it: make test-slow): a whole emulated recovery with two reboots (~4-6 s);
# the quick tier covers its stage with fakes (tests/recovery/test_validations.py).
@pytest.mark.slow
def test_a_repair_that_does_not_hold_is_caught_by_validation_never_by_the_job() -> None:
    """XID 79 (the fast path) reboots node-b, whose repair does not hold: back, it fails its
    validation under load, is rebooted again and validated again; the job restarts on it only
    then, never runs on it while the fault was latent, and completes."""
    with world(extra_env={C.ENV_POST_REPAIR_VALIDATION: ON.to_json()}) as w:
        for node in ("node-a", "node-b"):
            w.ecs.add_node(node)
        w.ecs.plan_family("train", run_seconds=3 * MIN, exit_code=0)
        w.ecs.start_job("train", w.training_task_definition, ["node-a", "node-b"])
        w.ecs.run_for(MIN)
        w.ecs.repair_does_not_hold("node-b", 1)
        w.ecs.inject_xid("node-b", 79, after=MIN, nccl_cascade=True)

        def validating() -> bool:
            return any(t.validation for t in w.ecs.tasks.values())

        assert w.ecs.run_until_true(validating, max_seconds=10 * MIN)
        # Every other scheduler keeps off it while it proves itself.
        assert attributes(w, "node-b").get(placement.UNAVAILABLE_ATTRIBUTE) == placement.VALIDATING
        assert w.node_item("node-b")["instance_state"] == "REBOOTING"
        w.ecs.run_for(20 * MIN)
        job = w.job("train")
        assert (job["job_state"], job["attempt"], int(job["recoveries_used"])) == ("COMPLETE", 2, 1)
        node_b = w.ecs.node("node-b")
        assert node_b.reboots == 2 and node_b.latent is None
        ran = [t for t in w.ecs.tasks.values() if t.validation and t.node == "node-b"]
        assert [t.exit_code for t in ran] == [1, 0]
        assert [p for p in w.ecs.placements if p.training and p.latent] == []  # never onto it
        item = w.node_item("node-b")
        assert item["instance_state"] == "AVAILABLE" and item["last_validation"]["result"] == "passed"
        assert [(r["action"], r["cause"]) for r in item["fault_history"]] == [("reboot", "xid-79")] * 2
        assert placement.UNAVAILABLE_ATTRIBUTE not in attributes(w, "node-b")
        kinds = [n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) for n in w.aws.notifications()]
        assert 1 <= kinds.count("validation_failed") <= 2 and "recovered" in kinds
        history = [h["reason"] for h in w.job("train")["history"]]
        node_id = w.ecs.node("node-b").container_instance_id
        assert any(f"{node_id} failed its validation after its reboot" in h for h in history)
        passed = f"validated {node_id} after its reboot (DCGM level 1 + 30 s GPU load): passed in"
        assert any(passed in h for h in history)
        assert not w.bus.dead_letters


def test_the_node_a_group_launches_for_a_terminated_one_is_validated_before_it_takes_work() -> None:
    """replace_action terminate_in_asg: XID 64 replaces node-b (drained, terminated in its
    group, the job moved to node-c); the node the group launches registers, is adopted in
    validation (``gpu-recovery.unavailable=validating``) and is AVAILABLE once it passed."""
    with world(remediation={"replace_action": "terminate_in_asg"}, replacement_seconds=120,
               extra_env={C.ENV_POST_REPAIR_VALIDATION: ON.to_json()}) as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.put_in_auto_scaling_group(["node-a", "node-b", "node-c"])
        w.ecs.start_job("asg-job", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_RELOCATABLE: "true"})
        w.ecs.run_for(MIN)
        w.ecs.inject_xid("node-b", 64, after=MIN, health="replace", nccl_cascade=True)

        def validating() -> bool:
            return any(t.validation for t in w.ecs.tasks.values())

        assert w.ecs.run_until_true(validating, max_seconds=15 * MIN)
        assert attributes(w, "node-b-r1").get(placement.UNAVAILABLE_ATTRIBUTE) == placement.VALIDATING
        w.ecs.run_for(3 * MIN)
        new = w.node_item("node-b-r1")
        assert new["instance_state"] == "AVAILABLE" and new["last_validation"]["result"] == "passed"
        assert new["last_validation"]["repair"] == "replacement"
        assert w.node_item("node-b")["replaced_by"] == w.ecs.node("node-b-r1").container_instance_id
        assert placement.UNAVAILABLE_ATTRIBUTE not in attributes(w, "node-b-r1")
        assert [p for p in w.ecs.placements if p.node == "node-b-r1" and p.training] == []
