"""Issue 49: the false-repair figure. The simulated cluster records every repair and hold it
carries out (reboot, GPU reset, quarantine, replacement, a cordon) with the truth only the
simulation knows, whether the node's hardware was healthy then (``sim.repair_ledger``); every
campaign flow owes zero of them (``CampaignResult.problems``), and any flow runs with 1 % of
its AWS calls failing (``runner.calls_failing``)."""

from __future__ import annotations

from typing import Any

from gpu_recovery.adapters import aws
from gpu_recovery.domain import placement
from local_mode.campaigns.runner import CampaignResult, Scenario, calls_failing, run_flow
from local_mode.sim.repair_ledger import CORDON_MARGIN_SECONDS
from local_mode.world import World, build_world


def _cordon(world: World, node: str, value: str | None) -> None:
    ecs = aws.client("ecs")  # the handlers' session: what the simulated AWS carries out
    arn = world.ecs.node(node).container_instance_arn
    if value is None:
        ecs.delete_attributes(cluster=world.aws.cluster_name,
                              attributes=[{"name": placement.UNAVAILABLE_ATTRIBUTE, "targetId": arn}])
    else:
        ecs.put_attributes(cluster=world.aws.cluster_name, attributes=[
            {"name": placement.UNAVAILABLE_ATTRIBUTE, "value": value, "targetId": arn}])


def test_the_ledger_judges_each_repair_by_the_nodes_true_health_then() -> None:
    with build_world(handlers=False, sweep_every_seconds=None) as world:
        sim = world.ecs
        for node in ("node-a", "node-b", "node-c", "node-d", "node-e"):
            sim.add_node(node, gpus=8)
        sim.node("node-b").health = "reboot_fixable"
        sim.fabric.degrade_link("node-c", "node-e")
        ec2 = aws.client("ec2")
        ec2.reboot_instances(InstanceIds=[sim.node(n).instance_id for n in ("node-a", "node-b", "node-c")])
        sim.warn_gpu("node-d", remap_pending=True)
        _cordon(world, "node-d", placement.CORDONED)  # a warned node: known bad, not healthy
        _cordon(world, "node-e", placement.RESERVED)  # a reservation condemns nothing
        sim.run_for(60)
        assert [str(r) for r in sim.repairs.false_repairs()] == [
            "reboot of healthy node-a (EC2 RebootInstances)"]
        assert {(r.node, r.action) for r in sim.repairs.repairs()} == {
            ("node-a", "reboot"), ("node-b", "reboot"), ("node-c", "reboot"), ("node-d", "cordon")}


def test_a_cordon_of_a_healthy_node_is_a_hold_only_past_a_check() -> None:
    with build_world(handlers=False, sweep_every_seconds=None) as world:
        sim = world.ecs
        sim.add_node("node-a", gpus=8)
        sim.add_node("node-b", gpus=8)
        limit = sim.dcgm_seconds + CORDON_MARGIN_SECONDS
        _cordon(world, "node-a", placement.CORDONED)  # a suspect's check: then its verdict
        sim.run_for(limit - 60)
        _cordon(world, "node-a", None)
        _cordon(world, "node-b", placement.CORDONED)  # held, never checked
        sim.run_for(limit + 60)
        (held,) = sim.repairs.false_repairs()
        assert held.node == "node-b" and held.action == "cordon" and held.seconds > limit


class _RebootsAHealthyNode(Scenario[CampaignResult]):
    """A flow whose only act is a reboot of a healthy node (what the stack must never do)."""

    def set_up(self, world: World) -> list[str]:
        world.ecs.add_node("node-a", gpus=8)
        world.ecs.reboot("node-a")  # the set-up's: not the flow's
        world.ecs.run_for(300)
        return []

    def start(self, world: World) -> None:
        world.ecs.reboot("node-a")

    def result(self, world: World, common: dict[str, Any]) -> CampaignResult:
        return CampaignResult(**common)


def test_every_flow_owes_zero_false_repairs_with_and_without_calls_failing() -> None:
    result = run_flow(_RebootsAHealthyNode())
    assert result.false_repairs == ["reboot of healthy node-a (direct)"]
    assert any("1 false repair(s) of healthy nodes" in p for p in result.problems())
    with calls_failing(0.01, 1):
        failing = run_flow(_RebootsAHealthyNode())
    assert failing.failing == (0.01, 1) and failing.false_repairs == result.false_repairs
