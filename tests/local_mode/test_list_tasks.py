"""ListTasks as ECS answers it, in both worlds: ``startedBy`` only as the one filter (an
InvalidParameterException otherwise: "When you specify startedBy as the filter, it must be the
only filter that you use"), and then only the tasks whose desired status is RUNNING (ECS's
default filter), so a task asked to stop is no longer listed."""

from __future__ import annotations

import pytest

from gpu_recovery.adapters import aws
from gpu_recovery.adapters.ecs import EcsAdapter
from local_mode.sim.aws_calls import ClientFailure
from local_mode.sim.contract.requests import ContractViolation
from local_mode.world import build_world


def test_moto_world_lists_by_started_by_alone_and_refuses_it_beside_another_filter() -> None:
    """Given the moto world with one rank started with startedBy "gpujobs"
    When ListTasks names startedBy with desiredStatus, then startedBy alone, then again once the
    rank was asked to stop
    Then the first is refused, the second lists the rank, the third lists nothing."""
    with build_world(handlers=False) as world:
        world.ecs.add_node("node-a")
        td = world.ecs.register_training_task_definition("train", gpus=8)
        (arn,) = world.ecs.start_job("one-rank", td, ["node-a"], started_by="sb-one")
        world.ecs.run_for(30)
        ecs = aws.client("ecs")
        cluster = world.aws.cluster_name
        # The request guard refuses it before the emulator (sim/contract/requests.py); the
        # emulator's own answer, as ECS's, is InvalidParameterException.
        with pytest.raises(ContractViolation, match="startedBy must be the only filter"):
            ecs.list_tasks(cluster=cluster, startedBy="sb-one", desiredStatus="RUNNING")
        world.aws.requests.take()
        _, answer = world.ecs._before_list_tasks({"cluster": cluster, "startedBy": "sb-one",
                                                   "desiredStatus": "RUNNING"}, {})
        assert answer["Error"]["Code"] == "InvalidParameterException"
        adapter = EcsAdapter(ecs, cluster)
        assert adapter.tasks_started_by("sb-one") == [arn]
        ecs.stop_task(cluster=cluster, task=arn, reason="test")
        assert adapter.tasks_started_by("sb-one") == []
        assert ecs.list_tasks(cluster=cluster, desiredStatus="STOPPED")["taskArns"] == [arn]


def test_scale_world_lists_by_started_by_alone_and_refuses_it_beside_another_filter() -> None:
    """The same in the scale world's control plane."""
    with build_world(backend="scale", seed=3, sweep_every_seconds=None, copies=1) as world:
        node = world.cluster.add_node("n0")
        world.cluster.register_task_definition("train", gpus=8)
        client = world.cluster.client()
        name = world.cluster.name
        started = world.sim.run_process(lambda: client.start_task(
            cluster=name, taskDefinition="train", containerInstances=[node.container_instance_arn],
            startedBy="sb-one"))
        arn = started["tasks"][0]["taskArn"]
        with pytest.raises(ContractViolation, match="startedBy must be the only filter"):
            world.sim.run_process(lambda: client.list_tasks(cluster=name, startedBy="sb-one",
                                                            desiredStatus="RUNNING"))
        world.requests.take()
        with pytest.raises(ClientFailure) as refused:
            world.cluster.list_tasks({"cluster": name, "startedBy": "sb-one", "desiredStatus": "RUNNING"})
        assert refused.value.code == "InvalidParameterException"
        listed = world.sim.run_process(lambda: client.list_tasks(cluster=name, startedBy="sb-one"))
        assert listed["taskArns"] == [arn]
        world.sim.run_process(lambda: client.stop_task(cluster=name, task=arn, reason="test"))
        listed = world.sim.run_process(lambda: client.list_tasks(cluster=name, startedBy="sb-one"))
        assert listed["taskArns"] == []
