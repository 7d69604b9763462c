"""A queue job's task definition may not reach the host the stack judges its nodes from
(queue/host_access.py), and the jobs API refuses one that does before writing anything."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from gpu_recovery.queue.host_access import host_access_refusal
from tests.jobs_api.api_harness import REGION, Api, valid_spec

GPU = {"name": "train", "image": "llm-train:latest", "memory": 1024,
       "resourceRequirements": [{"type": "GPU", "value": "8"}]}
# What multi-node GPU training on p5 uses: EFA devices, IPC_LOCK, host IPC, shared memory, FSx.
EFA_TRAINING = {
    "family": "efa-train", "ipcMode": "host",
    "volumes": [{"name": "fsx", "host": {"sourcePath": "/fsx"}},
                {"name": "data", "host": {"sourcePath": "/mnt/data/shards"}}],
    "containerDefinitions": [{**GPU, "linuxParameters": {
        "devices": [{"hostPath": f"/dev/infiniband/uverbs{i}"} for i in range(4)],
        "capabilities": {"add": ["IPC_LOCK"]}, "sharedMemorySize": 65536}}],
}


def test_what_gpu_training_needs_is_allowed() -> None:
    """Given a task definition with EFA devices, IPC_LOCK, host IPC, shared memory and data volumes
    When checked
    Then nothing is refused."""
    assert host_access_refusal(EFA_TRAINING) is None


@pytest.mark.parametrize(("change", "named"), [
    ({"pidMode": "host"}, "pidMode host"),
    ({"volumes": [{"name": "root", "host": {"sourcePath": "/"}}]}, "the host's /"),
    ({"volumes": [{"name": "v", "host": {"sourcePath": "/var"}}]}, "the host's /var"),
    ({"volumes": [{"name": "t", "host": {"sourcePath": "/etc/gpu-node-agent"}}]}, "/etc/gpu-node-agent"),
    ({"volumes": [{"name": "t", "host": {"sourcePath": "/data/../etc"}}]}, "/data/../etc"),
    ({"volumes": [{"name": "sock", "host": {"sourcePath": "/var/run/docker.sock"}}]}, "docker.sock"),
    ({"containerDefinitions": [{**GPU, "privileged": True}]}, "is privileged"),
    ({"containerDefinitions": [{**GPU, "linuxParameters": {"devices": [{"hostPath": "/dev/kmsg"}]}}]},
     "/dev/kmsg"),
    ({"containerDefinitions": [{**GPU, "linuxParameters": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}}}]},
     "SYS_ADMIN"),
])
def test_what_reaches_the_host_is_refused(change: dict[str, Any], named: str) -> None:
    """Given a task definition that gives a container the host's processes, its system
    directories, the kernel's log device, privileged mode or a capability that amounts to it
    When checked
    Then it is refused, naming what reaches the host."""
    refusal = host_access_refusal({**EFA_TRAINING, **change})
    assert refusal is not None and named in refusal


def test_a_privileged_task_definition_is_a_400_and_nothing_is_written(api: Api) -> None:
    """Given a task definition registered in ECS whose container is privileged
    When a job of it is submitted
    Then 400 naming task_definition and saying why; no job item is written."""
    boto3.client("ecs", region_name=REGION).register_task_definition(
        family="root-train", containerDefinitions=[{**GPU, "privileged": True}])
    before = api.job_table.scan()["Items"]
    status, body = api.submit(valid_spec(task_definition="root-train:1"))
    assert status == 400, body
    assert body["field"] == "task_definition" and "privileged" in body["message"]
    assert api.job_table.scan()["Items"] == before
