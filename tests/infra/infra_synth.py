"""Shared by the infra tests: contexts, the ``Synth`` result and ``synthesize``.

Test modules import from here, not from ``conftest``: tests/infra has no __init__.py, so
``conftest`` is a top-level module name that other rootless test folders (tests/jobs_api)
also use; in a combined pytest run ``from conftest import ...`` would get theirs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk.assertions import Template

from app import STACK_NAME, build_app
from infra.nag import read_findings

ACCOUNT = "111122223333"
REGION = "us-east-1"
CLUSTER = "gpu-cluster"
CLUSTER_ARN = f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{CLUSTER}"
CUSTOM_TASK_ARN = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/my-dcgm:3"

DEFAULT_CONTEXT = {"cluster_name": CLUSTER}
CATALOG_OVERRIDE = Path(__file__).resolve().parent / "fixtures" / "fault_catalog_override.yaml"
CUSTOM_CONTEXT = {
    "cluster_name": CLUSTER,
    # Remediation: a catalog override (YAML), replacement by termination, observe-only reboots.
    "fault_catalog_file": str(CATALOG_OVERRIDE),
    "replace_action": "terminate_in_asg",
    "remediation_mode": "enforce,reboot=observe",
    "breaker_max_nodes": "4",
    "max_app_restarts": "1",
    "relocate_instead_of_wait": "true",
    "alert_email": "oncall@example.com",
    "table_removal_policy": "destroy",
    "health_check_task_arn": CUSTOM_TASK_ARN,
    "suspect_exit_codes": "1,134",
    "health_check_all_nodes": "true",
    "instance_tag_key": "team",
    "instance_tag_value": "ml-platform",
    "lambda_architecture": "arm64",
    # Large jobs: the ECS budget, health checks at once, the gang workers, one start per rank.
    "ecs_api_rate_per_second": "18.5",
    "ecs_api_burst": "40",
    "max_health_checks_per_job": "16",
    "max_health_checks_in_flight": "64",
    "gang_worker_concurrency": "6",
    "batch_identical_starts": "false",
}
# Node agent daemon on, every heartbeat / API / queue option changed (-c style strings).
AGENT_CONTEXT = {
    "cluster_name": CLUSTER,
    "node_agent_daemon": "true",
    "heartbeat_stale_seconds": "240",
    "node_lost_fail_seconds": "0",
    "hang_seconds": "900",
    "hang_action": "recover",
    "api_throttle_rate": "250.5",
    "api_throttle_burst": "500",
    "training_log_groups": '["/ecs/*", "/aws/batch/job"]',
}


@dataclass
class Synth:
    stack: cdk.Stack
    template: dict[str, Any]
    outdir: Path
    error: str | None
    findings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def assertions(self) -> Template:
        return Template.from_json(self.template)

    def resources(self, type_name: str) -> dict[str, dict[str, Any]]:
        return {
            k: v for k, v in self.template["Resources"].items() if v["Type"] == type_name
        }


PARTITIONS = {"us-east-1": "aws", "cn-north-1": "aws-cn", "us-gov-west-1": "aws-us-gov"}


def with_partition(node: Any, partition: str) -> Any:
    """The template with ``{"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ...]]}``
    joined into plain strings (as CloudFormation will in ``partition``), so tests can
    compare ARNs as text. Joins holding other tokens are left as they are."""
    if isinstance(node, list):
        return [with_partition(n, partition) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: with_partition(v, partition) for k, v in node.items()}
    if list(node) == ["Ref"] and node["Ref"] == "AWS::Partition":
        return partition
    if list(node) == ["Fn::Join"]:
        sep, parts = node["Fn::Join"]
        if isinstance(parts, list) and all(isinstance(x, str) for x in parts):
            return sep.join(parts)
        if sep == "" and isinstance(parts, list):  # merge adjacent text around other tokens
            merged: list[Any] = []
            for part in parts:
                if isinstance(part, str) and merged and isinstance(merged[-1], str):
                    merged[-1] += part
                else:
                    merged.append(part)
            return {"Fn::Join": ["", merged]}
    return node


def synthesize(context: dict[str, Any], outdir: Path, region: str = REGION) -> Synth:
    """Synthesize the real app (with the cdk-nag plugin) into ``outdir``.

    ``template`` has the partition resolved for ``region`` (see :func:`with_partition`);
    the file in ``outdir`` is the raw template (cfn-lint reads it)."""
    app = cdk.App(outdir=str(outdir), context=context)
    _, stack = build_app(app, env=cdk.Environment(account=ACCOUNT, region=region))
    error = None
    try:
        app.synth()
    except RuntimeError as exc:  # cdk-nag findings interrupt synthesis
        error = str(exc)
    template = json.loads((outdir / f"{STACK_NAME}.template.json").read_text())
    template = with_partition(template, PARTITIONS[region])
    return Synth(stack, template, outdir, error, read_findings(outdir))


def statement_actions(statement: dict[str, Any]) -> set[str]:
    """An IAM statement's actions as a set (CloudFormation allows a string or a list)."""
    action = statement["Action"]
    return {action} if isinstance(action, str) else set(action)


def statement_resources(statement: dict[str, Any]) -> list[Any]:
    """An IAM statement's resources as a list (a string or a list in the template)."""
    resource = statement["Resource"]
    return resource if isinstance(resource, list) else [resource]
