"""The reboot-only SSM Command document: how the recovery loop reboots ECS Anywhere hosts.

It has no parameters and runs one fixed command (``REBOOT_COMMAND``: reboot after 5 s,
so SSM can report success first). ``ssm:SendCommand`` on this document and on the
cluster's tagged managed instances lets the recovery loop reboot those hosts and do
nothing else; ``AWS-RunShellScript`` would have let it run any root command.
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from gpu_recovery.adapters.compute import REBOOT_COMMAND


class RebootDocument(Construct):
    """Attributes: ``document`` (CfnDocument), ``name`` (its name), ``arn``."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.document = ssm.CfnDocument(
            self, "Document",
            document_type="Command",
            document_format="JSON",
            content={
                "schemaVersion": "2.2",
                "description": "GPU training recovery: reboot this host (no parameters).",
                "mainSteps": [{
                    "action": "aws:runShellScript",
                    "name": "reboot",
                    "precondition": {"StringEquals": ["platformType", "Linux"]},
                    "inputs": {"runCommand": [REBOOT_COMMAND], "timeoutSeconds": "60"},
                }],
            },
        )
        stack = Stack.of(self)
        self.name: str = self.document.ref  # Ref of AWS::SSM::Document is its name
        self.arn = f"arn:{stack.partition}:ssm:{stack.region}:{stack.account}:document/{self.name}"
