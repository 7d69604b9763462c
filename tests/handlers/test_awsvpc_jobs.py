"""Jobs whose task definition is in the awsvpc network mode (issue 40, defect 5), end to end.

ECS refuses a StartTask of such a task definition without ``networkConfiguration``, and
the simulated ECS does too (``ecs_model.start_task_network_refusal``): a restart that does
not give the job's subnets and security groups again never starts."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery.adapters import aws
from gpu_recovery.constants import TAG_SECURITY_GROUPS, InstanceState, JobState, NotificationKind
from local_mode.sim.ecs_model import NETWORK_NOT_VALID, NETWORK_REQUIRED
from tests.handlers.cluster import Cluster

MIN = 60


def _network() -> dict[str, Any]:
    """A subnet and a security group of the emulated account's default VPC (ECS puts the
    task's interface in them: they must exist). The set-up's own client: no handler makes
    these calls, so the request guard does not hold them to the stack's reviewed operations."""
    from local_mode.emulator import LocalAws

    ec2 = LocalAws.active().client("ec2")
    subnet = ec2.describe_subnets()["Subnets"][0]
    group = ec2.create_security_group(GroupName="training", Description="NCCL between ranks",
                                      VpcId=subnet["VpcId"])["GroupId"]
    return {"subnets": [subnet["SubnetId"]], "securityGroups": [group], "assignPublicIp": "DISABLED"}


def _awsvpc_job(cluster: Cluster, job_id: str, network: dict[str, Any], tags: dict[str, str]) -> str:
    td = cluster.sim.register_training_task_definition("train-vpc", network_mode="awsvpc")
    cluster.sim.plan_family("train-vpc", run_seconds=3600, exit_code=0)
    for node in ("node-a", "node-b"):
        cluster.sim.add_node(node)
    cluster.sim.start_job(job_id, td, ["node-a", "node-b"], extra_tags=tags, network=network)
    cluster.sim.run_for(MIN)
    return td


def test_the_simulated_ecs_refuses_a_start_whose_network_does_not_fit_the_network_mode(
        cluster: Cluster) -> None:
    """As ECS: an awsvpc task definition without networkConfiguration, and a host-mode one
    with it, are InvalidParameterException; an awsvpc task gets its network interface."""
    cluster.sim.add_node("node-a")
    network = _network()
    vpc = cluster.sim.register_training_task_definition("vpc", network_mode="awsvpc")
    ecs = aws.client("ecs")
    arn = cluster.sim.node("node-a").container_instance_arn
    for td, extra, message in ((vpc, {}, NETWORK_REQUIRED),
                               (cluster.train_td, {"networkConfiguration": {"awsvpcConfiguration": network}},
                                NETWORK_NOT_VALID)):
        with pytest.raises(ClientError) as refused:
            ecs.start_task(cluster=cluster.local.cluster_name, taskDefinition=td, containerInstances=[arn],
                           **extra)
        assert refused.value.response["Error"] == {"Code": "InvalidParameterException", "Message": message}
    started = ecs.start_task(cluster=cluster.local.cluster_name, taskDefinition=vpc, containerInstances=[arn],
                             networkConfiguration={"awsvpcConfiguration": network})["tasks"][0]["taskArn"]
    described = ecs.describe_tasks(cluster=cluster.local.cluster_name, tasks=[started])["tasks"][0]
    (eni,) = described["attachments"]
    assert eni["type"] == "ElasticNetworkInterface"
    assert {"name": "subnetId", "value": network["subnets"][0]} in eni["details"]


def test_a_tag_registered_awsvpc_job_is_gang_restarted_with_its_network(cluster: Cluster) -> None:
    """Given a 2-rank awsvpc job registered by its tags (its security groups in
    gpu-recovery:security-groups, its subnet learned from its network interface), When rank
    1's node faults and is rebooted, Then the gang restarts with the same network
    configuration: attempt 2 runs, each task with its interface in the job's subnet."""
    network = _network()
    (subnet,), (group,) = network["subnets"], network["securityGroups"]
    _awsvpc_job(cluster, "vpc-job", network, {TAG_SECURITY_GROUPS: group})
    job = cluster.job("vpc-job")
    assert job.network == network
    assert {r.subnet for r in cluster.repo.jobs.get_ranks(job)} == {subnet}
    cluster.sim.inject_gpu_fault("node-b", after=MIN, health="reboot_fixable")
    cluster.sim.run_for(15 * MIN)
    assert cluster.job("vpc-job").attempt == 2
    assert cluster.state("vpc-job") is JobState.RUNNING
    restarted = [t for t in cluster.sim.running_tasks() if t.tags.get("gpu-recovery:job-id") == "vpc-job"]
    assert len(restarted) == 2
    assert all({"name": "subnetId", "value": subnet} in t.attachments[0]["details"] for t in restarted)
    assert not cluster.bus.dead_letters


def test_an_awsvpc_job_without_its_security_groups_is_refused_loudly(cluster: Cluster) -> None:
    """Given an awsvpc job tagged for recovery but without gpu-recovery:security-groups (ECS
    tells a task's subnet, never its security groups), Then it is not registered (a restart
    could not give its network again) and operators are told once what to add."""
    _awsvpc_job(cluster, "no-groups", _network(), {})
    assert cluster.repo.jobs.get_job("no-groups") is None
    (notice,) = cluster.notifications(NotificationKind.JOB_REFUSED.value)
    assert "awsvpc" in notice["subject"] and TAG_SECURITY_GROUPS in notice["message"]
    assert cluster.instance("node-a") is None or cluster.instance("node-a").state is InstanceState.AVAILABLE
