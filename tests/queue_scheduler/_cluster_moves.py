"""What the scheduler tests do to the simulated cluster and its launches: another tenant taking
a node's GPUs, AWS's throttle, a rank's environment, a launch cut short at one of its steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery.adapters import aws


def env_of(task: Any) -> dict[str, str]:
    [override] = task.overrides["containerOverrides"]
    return {e["name"]: e["value"] for e in override["environment"]}


def steal_gpus(qc: Any, node: str) -> str:
    """Another tenant takes every free GPU of a node (an untagged task: not a job)."""
    td = qc.sim.register_training_task_definition("thief", gpus=len(qc.sim.node(node).free_gpu_ids))
    resp = aws.client("ecs").start_task(cluster=qc.local.cluster_name, taskDefinition=td,
                                        containerInstances=[qc.sim.node(node).container_instance_arn])
    return str(resp["tasks"][0]["taskArn"])


def throttled(operation: str) -> ClientError:
    """AWS's throttle of ``operation``, past botocore's retries."""
    return ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}, operation)


def launch_dies_registering(qc: Any, monkeypatch: Any, rank: int) -> None:
    """The start fan-out of the next launch dies as it registers ``rank`` (that rank's task
    started, the ranks before it registered), once."""
    launches = qc.recovery.gang.launches
    register = launches.register

    def dies_at_rank(job: Any, template: Any, task_arn: str, started_by: str, *rest: Any) -> Any:
        if template.rank == rank:
            monkeypatch.setattr(launches, "register", register)
            raise RuntimeError("died")
        return register(job, template, task_arn, started_by, *rest)

    monkeypatch.setattr(launches, "register", dies_at_rank)


def at_start_task(qc: Any, monkeypatch: Any, call: int, action: Callable[[], None]) -> None:
    """``action`` runs as the start fan-out's ``call``-th StartTask (1: the first) is about to be
    made, once (it raises: the start dies before ECS is asked)."""
    ecs = qc.recovery.gang.ecs
    start_task = ecs.start_task
    calls = [0]

    def at_call(**kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == call:
            monkeypatch.setattr(ecs, "start_task", start_task)
            action()
        return start_task(**kwargs)

    monkeypatch.setattr(ecs, "start_task", at_call)


def launch_dies_starting(qc: Any, monkeypatch: Any, call: int) -> None:
    """The start fan-out's ``call``-th StartTask (1: the first) dies before ECS is asked, once."""

    def dies() -> None:
        raise RuntimeError("died")

    at_start_task(qc, monkeypatch, call, dies)
