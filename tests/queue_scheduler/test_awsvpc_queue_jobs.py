"""Queue jobs whose task definition is in the awsvpc network mode (issue 40, defect 5): the
spec's ``network`` is checked at submission against the task definition, given to every
StartTask of the launch and of the gang restart (ECS refuses such a start without it)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.queue.jobs_api.errors import InvalidRequest
from gpu_recovery.queue.models import JobSpec
from local_mode.emulator import LocalAws
from tests.fixtures.queue_cluster import QueueCluster

MIN = 60


def _vpc() -> tuple[str, str]:
    local = LocalAws.active()  # the set-up's own client: no handler made these calls
    assert local is not None
    ec2 = local.client("ec2")
    subnet = ec2.describe_subnets()["Subnets"][0]
    group = ec2.create_security_group(GroupName="training", Description="NCCL", VpcId=subnet["VpcId"])
    return subnet["SubnetId"], group["GroupId"]


def _spec(td: str, **extra: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "vpc-train", "task_definition": td, "nnodes": 2,
                                   "gpus_per_node": 8, "priority": "NORMAL", **extra})


def test_submission_checks_the_network_against_the_task_definition(qc: QueueCluster) -> None:
    """An awsvpc task definition without ``network``, a host-mode one with it: 400 naming
    ``network`` and what to do; an awsvpc one with it: the job item keeps its
    awsvpcConfiguration (no public IP: EC2 container instances get none)."""
    subnet, group = _vpc()
    vpc_td = qc.sim.register_training_task_definition("train-vpc", network_mode="awsvpc")
    service = qc.jobs_service()
    network = {"subnets": [subnet], "security_groups": [group]}
    for td, extra, says in ((vpc_td, {}, "uses the awsvpc network mode"),
                            (qc.train_td, {"network": network}, "only for task definitions in the awsvpc")):
        with pytest.raises(InvalidRequest) as refused:
            service.submit(_spec(td, **extra), "alice")
        assert refused.value.field == "network" and says in str(refused.value)
    job = service.submit(_spec(vpc_td, network=network), "alice")["job_id"]
    assert qc.item(job)["network"] == {"subnets": [subnet], "securityGroups": [group],
                                       "assignPublicIp": "DISABLED"}


@pytest.mark.parametrize("network", [{"subnets": []},
                                     {"subnets": ["subnet-0a1b2c3d"], "assign_public_ip": "ENABLED"},
                                     {"subnets": ["subnet-0a1b2c3d"], "security_groups": ["default"]}])
def test_a_network_ecs_would_refuse_is_refused_by_the_spec(network: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="network"):
        _spec("train-vpc:1", network=network)


def test_an_awsvpc_queue_job_is_launched_and_gang_restarted_with_its_network(qc: QueueCluster) -> None:
    """Given a 2-node awsvpc queue job, When the scheduler launches it, Then both ranks start
    with their network interface in the spec's subnet; When rank 1's node faults and is
    rebooted, Then the gang restarts (attempt 2) with the same network."""
    subnet, group = _vpc()
    td = qc.sim.register_training_task_definition("train-vpc", network_mode="awsvpc")
    qc.sim.plan_family("train-vpc", run_seconds=3600, exit_code=0)
    job = qc.submit(nnodes=2, gpus=8, task_definition=td,
                    network={"subnets": [subnet], "securityGroups": [group], "assignPublicIp": "DISABLED"})
    assert qc.scheduler().tick().admitted == [job]
    qc.sim.run_for(MIN)
    assert qc.state(job) is JobState.RUNNING
    tasks = sorted(qc.live_tasks(job), key=lambda t: int(t.tags[C.TAG_RANK]))
    assert [t.attachments[0]["details"][0] for t in tasks] == [{"name": "subnetId", "value": subnet}] * 2
    qc.sim.inject_gpu_fault(tasks[1].node, after=MIN, health="reboot_fixable")
    qc.sim.run_for(15 * MIN)
    assert qc.repo.jobs.get_job(job).attempt == 2 and qc.state(job) is JobState.RUNNING
    restarted = qc.live_tasks(job)
    assert len(restarted) == 2 and {t.arn for t in restarted}.isdisjoint(t.arn for t in tasks)
    assert all(t.attachments[0]["details"][0] == {"name": "subnetId", "value": subnet} for t in restarted)
