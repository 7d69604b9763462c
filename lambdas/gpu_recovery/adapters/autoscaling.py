"""Replacing an EC2 GPU node in its Auto Scaling group (``replace_action=terminate_in_asg``)."""

from __future__ import annotations

from typing import Any


class AutoScalingReplacer:
    def __init__(self, autoscaling_client: Any) -> None:
        self._asg = autoscaling_client

    def lifecycle_state(self, instance_id: str) -> str | None:
        """The instance's lifecycle state in its group (``InService``, ``Terminating``...),
        or None when it belongs to no Auto Scaling group (or is gone)."""
        response = self._asg.describe_auto_scaling_instances(InstanceIds=[instance_id])
        found = response.get("AutoScalingInstances") or []
        return str(found[0].get("LifecycleState")) if found else None

    def terminate_in_asg(self, instance_id: str) -> str:
        """Terminate without decrementing the desired capacity: the group launches a new
        node in its place. Returns what was done, for the instance's record."""
        response = self._asg.terminate_instance_in_auto_scaling_group(
            InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
        activity = response.get("Activity") or {}
        group = activity.get("AutoScalingGroupName", "its Auto Scaling group")
        return f"terminating in {group} (desired capacity kept: a new node is launched)"
