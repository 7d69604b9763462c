"""The EventBridge patterns of the recovery rules: deployed by ``infra/recovery.py``, matched
in local mode by the same code (``local_mode/sim/deployment.py``).

Kept to what AWS and moto's matcher both evaluate identically: plain values and prefix on
top-level detail strings. Exit codes (an array of objects) are read in code.
"""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import HEALTH_CHECK_GROUP, JOB_GROUP_PREFIX


def training_task_pattern(cluster_arn: str, registration: str = "both") -> dict[str, Any]:
    """Training task state changes: with ``registration`` "convention" only the tasks of the
    convention's group (other workloads' tasks never invoke the handler); otherwise
    everything in the cluster not in the HC group (tag-registered tasks look alike)."""
    group: list[Any] = ([{"prefix": JOB_GROUP_PREFIX}] if registration == "convention"
                        else [{"anything-but": {"prefix": HEALTH_CHECK_GROUP}}])
    return {
        "source": ["aws.ecs"],
        "detail-type": ["ECS Task State Change"],
        "detail": {
            "clusterArn": [cluster_arn],
            "group": group,
            # The handler acts on these two only (PROVISIONING, PENDING... cost nothing).
            "lastStatus": ["RUNNING", "STOPPED"],
        },
    }


def health_check_task_pattern(cluster_arn: str) -> dict[str, Any]:
    """The health-check task stopped."""
    return {
        "source": ["aws.ecs"],
        "detail-type": ["ECS Task State Change"],
        "detail": {
            "clusterArn": [cluster_arn],
            "group": [{"prefix": HEALTH_CHECK_GROUP}],
            "lastStatus": ["STOPPED"],
        },
    }


def container_instance_pattern(cluster_arn: str) -> dict[str, Any]:
    return {
        "source": ["aws.ecs"],
        "detail-type": ["ECS Container Instance State Change"],
        "detail": {"clusterArn": [cluster_arn]},
    }
