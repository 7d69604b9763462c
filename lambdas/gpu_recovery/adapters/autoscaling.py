"""Replacing an EC2 GPU node in its Auto Scaling group (``replace_action=terminate_in_asg``)."""

from __future__ import annotations

from typing import Any


class AutoScalingReplacer:
    def __init__(self, autoscaling_client: Any) -> None:
        self._asg = autoscaling_client

    def groups_of(self, instance_ids: list[str]) -> dict[str, tuple[str, str]]:
        """instance id -> (lifecycle state, Auto Scaling group name), for those of
        ``instance_ids`` that belong to a group: 50 a call (the API's limit); none, no call
        (an empty InstanceIds would list every group instance of the account)."""
        ids = list(instance_ids)
        found: dict[str, tuple[str, str]] = {}
        for start in range(0, len(ids), 50):
            response = self._asg.describe_auto_scaling_instances(InstanceIds=ids[start:start + 50])
            for i in response.get("AutoScalingInstances") or []:
                found[str(i["InstanceId"])] = (str(i.get("LifecycleState")),
                                               str(i.get("AutoScalingGroupName")))
        return found

    def terminate_in_asg(self, instance_id: str) -> str:
        """Terminate without decrementing the desired capacity: the group launches a new
        node in its place. Returns what was done, for the instance's record."""
        response = self._asg.terminate_instance_in_auto_scaling_group(
            InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
        activity = response.get("Activity") or {}
        group = activity.get("AutoScalingGroupName", "its Auto Scaling group")
        return f"terminating in {group} (desired capacity kept: a new node is launched)"
