"""Rebooting a GPU node: EC2 instances by API, ECS Anywhere nodes through SSM."""

from __future__ import annotations

from typing import Any

REBOOT_DOCUMENT = "AWS-RunShellScript"
# Delay so SSM can report the command's success before the host goes down.
REBOOT_COMMAND = "nohup sh -c 'sleep 5; systemctl reboot || reboot' >/dev/null 2>&1 &"


class RebootAdapter:
    def __init__(self, ec2_client: Any, ssm_client: Any) -> None:
        self._ec2 = ec2_client
        self._ssm = ssm_client

    def reboot(self, instance_id: str, reason: str) -> str:
        """Reboot an ``i-`` (EC2) or ``mi-`` (SSM managed, ECS Anywhere) instance.

        Returns which path was used ("ec2" or "ssm").
        """
        if instance_id.startswith("mi-"):
            self._ssm.send_command(
                InstanceIds=[instance_id],
                DocumentName=REBOOT_DOCUMENT,
                Comment=reason[:100],
                Parameters={"commands": [REBOOT_COMMAND]},
                TimeoutSeconds=60,
            )
            return "ssm"
        if not instance_id.startswith("i-"):
            raise ValueError(f"not an EC2 or managed instance id: {instance_id!r}")
        self._ec2.reboot_instances(InstanceIds=[instance_id])
        return "ec2"
