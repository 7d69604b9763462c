"""Rebooting a GPU node: EC2 instances by API, ECS Anywhere nodes through SSM.

Managed (``mi-``) hosts are rebooted with the stack's own reboot-only SSM Command
document (``infra/reboot_document.py``): it takes no parameters and runs exactly
:data:`REBOOT_COMMAND`, so the permission to send it is not a permission to run any
root command on the fleet (as ``AWS-RunShellScript`` was).
"""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import DEFAULT_REBOOT_DOCUMENT_NAME

# Delay so SSM can report the command's success before the host goes down.
REBOOT_COMMAND = "nohup sh -c 'sleep 5; systemctl reboot || reboot' >/dev/null 2>&1 &"


class RebootAdapter:
    def __init__(self, ec2_client: Any, ssm_client: Any,
                 reboot_document: str = DEFAULT_REBOOT_DOCUMENT_NAME) -> None:
        self._ec2 = ec2_client
        self._ssm = ssm_client
        self.reboot_document = reboot_document

    def reboot(self, instance_id: str, reason: str) -> str:
        """Reboot an ``i-`` (EC2) or ``mi-`` (SSM managed, ECS Anywhere) instance.

        Returns which path was used ("ec2" or "ssm").
        """
        if instance_id.startswith("mi-"):
            self._ssm.send_command(
                InstanceIds=[instance_id],
                DocumentName=self.reboot_document,
                Comment=reason[:100],
                TimeoutSeconds=60,
            )
            return "ssm"
        if not instance_id.startswith("i-"):
            raise ValueError(f"not an EC2 or managed instance id: {instance_id!r}")
        self._ec2.reboot_instances(InstanceIds=[instance_id])
        return "ec2"
