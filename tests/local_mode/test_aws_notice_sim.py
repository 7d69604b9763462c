"""The simulation's side of AWS's notices (docs/aws-notices.md): the ECS filter that finds a
notice's nodes (``ec2InstanceId in [...]``, the cluster query language), and the events the
simulated bus sends, read back into the notice they announce (the documented shapes)."""

from __future__ import annotations

import pytest

from gpu_recovery.domain import aws_notices as n
from local_mode import cluster_query
from local_mode.sim.aws_notices import notice_event


def test_ec2_instance_id_filters_as_the_cluster_query_language_documents() -> None:
    assert cluster_query.matches("ec2InstanceId in ['i-abcd1234', 'i-wxyx7890']", {}, None, "i-wxyx7890")
    assert not cluster_query.matches("ec2InstanceId in ['i-abcd1234']", {}, None, "i-wxyx7890")
    assert cluster_query.matches("ec2InstanceId == i-abcd1234", {}, None, "i-abcd1234")
    with pytest.raises(ValueError):
        cluster_query.matches("ec2InstanceId in i-abcd1234", {}, None, "i-abcd1234")


@pytest.mark.parametrize(("kind", "lead", "want"), [
    ("spot_interruption", n.SPOT_WARNING_SECONDS, n.NoticeKind.SPOT_INTERRUPTION),
    ("capacity_block_expiry", n.CAPACITY_BLOCK_TERMINATION_LEAD_SECONDS, n.NoticeKind.CAPACITY_BLOCK_EXPIRY),
    ("scheduled_maintenance", 3600, n.NoticeKind.REBOOT_MAINTENANCE),
    ("scheduled_retirement", 3600, n.NoticeKind.RETIREMENT),
])
def test_each_simulated_event_reads_back_into_its_notice(kind: str, lead: float, want: n.NoticeKind) -> None:
    now = 1_800_000_000.0
    event, deadline = notice_event(kind, now=now, region="us-east-1", account="123456789012",
                                   instance_id="i-0123", reservation_id="cr-0123", lead_seconds=3600)
    notice = n.parse_notice(event)
    assert notice is not None and notice.kind is want
    assert notice.deadline == deadline == now + lead


def test_the_playground_injects_a_notice_the_stack_acts_on() -> None:
    """``gpu-recovery-admin inject-fault spot-interruption --node node-a``: the event on the
    simulated bus reaches the instance monitor through the deployed rule; the node is cordoned."""
    import argparse

    from cli.inject_fault import add_arguments, fault_body
    from local_mode.playground.fault_injection import FaultInjector
    from local_mode.world import build_world

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    body = fault_body(parser.parse_args(["spot-interruption", "--node", "node-a"]))
    assert body == {"kind": "spot_interruption", "node": "node-a"}
    with build_world() as world:
        world.ecs.add_node("node-a", gpus=8)
        done = FaultInjector(world.ecs, None, None, lambda *_: None, world.repo).inject(body)  # type: ignore[arg-type]
        assert "Spot interruption warning" in done["detail"]
        world.ecs.run_for(5)
        item = world.repo.instances.get_instance_item(world.ecs.node("node-a").container_instance_id) or {}
        assert item["notice"]["kind"] == "spot_interruption" and item["cordon"]["notice"]
        assert any(d.rule == "ec2-capacity-notices" and d.ok for d in world.bus.deliveries)


def test_scheduled_maintenance_takes_its_lead_and_retirement_from_the_cli() -> None:
    import argparse

    from cli.inject_fault import add_arguments, fault_body

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["scheduled-maintenance", "--node", "node-3", "--lead-seconds", "600",
                              "--retirement"])
    assert fault_body(args) == {"kind": "scheduled_maintenance", "node": "node-3", "lead_seconds": 600.0,
                                "retirement": True}


def test_a_job_with_nowhere_to_go_waits_in_the_queue_with_the_notice_as_its_reason() -> None:
    """Two nodes, a two-node queue job, AWS takes one: the job moves at its checkpoint, cannot be
    placed elsewhere, and waits (SUSPENDED, queued) with the notice in its wait reason; at the
    deadline nothing of it is on the node; never FAILED."""
    from gpu_recovery import constants as C
    from local_mode.campaigns.time_sharing import Rank0ControlPoller
    from local_mode.sim.aws_notices import announce
    from local_mode.world import build_world

    with build_world(extra_env={C.ENV_CONTROL_API_URL: "https://control.invalid/prod",
                                "POWERTOOLS_LOG_LEVEL": "CRITICAL"}) as world:
        sim = world.ecs
        world.schedule_queue_scheduler(60)
        for node in ("node-a", "node-b"):
            sim.add_node(node, gpus=8)
        definition = sim.register_training_task_definition("train", gpus=8)
        sim.plan_family("train", run_seconds=3600, exit_code=0)
        job_id = world.submit_queue_job({"name": "wide", "task_definition": definition, "nnodes": 2,
                                         "gpus_per_node": 8}, "alice")
        sim.run_for(65)
        Rank0ControlPoller(sim, world.repo, job_id).start()
        sim.run_for(30)
        announce(sim, "spot_interruption", "node-b")
        sim.run_for(5 * 60)
        item = world.repo.jobs.get_job_item(job_id) or {}
        assert item["job_state"] == C.JobState.SUSPENDED.value
        assert [m["outcome"] for m in item["moves"]] == ["moved"]
        assert "moved off a node AWS takes away: Spot interruption" in str(item.get("wait_reason"))
        assert not any(t.node == "node-b" and t.done is False for t in sim.tasks.values())
