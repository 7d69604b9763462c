"""The EventBridge patterns of the recovery rules: deployed by ``infra/recovery.py``, matched
in local mode by the same code (``local_mode/sim/deployment.py``).

Kept to plain values and prefixes on detail strings, and one field of an array of objects
(the container instance's ``attributes``, matched by ``name`` alone: EventBridge's matcher,
Event Ruler, "crushes out" the array so that any element's field matches, aws/event-ruler
README "JSON Array Matching"; a pattern on two fields of one element could be met by two
different elements under the older matching, so none is used). Exit codes are read in code.
"""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import (
    HEALTH_CHECK_GROUP,
    JOB_GROUP_PREFIX,
    LOST_NODE_ATTRIBUTE,
    REBOOTING_ATTRIBUTE,
)
from gpu_recovery.domain import aws_notices


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
    """Container-instance state changes of the nodes the stack is rebooting: those carrying
    the custom attribute ``gpu-recovery.rebooting`` (put before the reboot is issued, deleted
    once the node is back or given up); and of the lost nodes flagged SUSPECT while their host
    still reported, whose ECS agent's reconnect starts the stack's own check
    (``gpu-recovery.lost-node``, put with the flag, deleted once the check is under way).
    ECS emits a container-instance event on every task
    placed or stopped and on every agent reconnect ("Amazon ECS container instance state
    change events"); the instance monitor acts only on these nodes, so the others never
    invoke it. The event's ``attributes`` are the ContainerInstance's, custom ones included
    (the ECS API reference: "set ... manually with the PutAttributes operation")."""
    return {
        "source": ["aws.ecs"],
        "detail-type": ["ECS Container Instance State Change"],
        "detail": {"clusterArn": [cluster_arn],
                   "attributes": {"name": [REBOOTING_ATTRIBUTE, LOST_NODE_ATTRIBUTE]}},
    }


def ec2_notice_pattern() -> dict[str, Any]:
    """EC2's own notices that instances go away (docs/aws-notices.md): a Capacity Block's
    expiration warning (by either name the EC2 documentation gives it), a Spot or an
    interruptible Capacity Reservation interruption warning, a rebalance recommendation. They
    carry no cluster: the instance monitor acts on the nodes of its cluster and drops the rest."""
    return {"source": [aws_notices.EC2_SOURCE], "detail-type": list(aws_notices.EC2_NOTICE_DETAIL_TYPES)}


def health_notice_pattern() -> dict[str, Any]:
    """AWS Health's EC2 scheduled changes that take an instance away for a window (retirement,
    reboot and system maintenance: ``domain.aws_notices.HEALTH_EVENT_CODES``)."""
    return {
        "source": [aws_notices.HEALTH_SOURCE],
        "detail-type": [aws_notices.HEALTH_DETAIL_TYPE],
        "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"],
                   "eventTypeCode": list(aws_notices.HEALTH_EVENT_CODES)},
    }
