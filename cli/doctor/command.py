"""The ``doctor`` command: every check in turn, the findings printed (or as JSON)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cli.doctor.findings import FAIL, REDEPLOY, SKIP, Finding, error_text, render
from cli.doctor.outputs import (
    DEFAULT_STACK_NAME,
    GANG_DLQ,
    GANG_QUEUE,
    REQUIRED_OUTPUTS,
    OutputsError,
    resolve_outputs,
)
from cli.doctor.stack import StackChecks
from cli.doctor.state import StateChecks


class Doctor(StateChecks, StackChecks):
    """The checks; ``run()`` returns one or more findings per check, never raises for AWS
    errors (an unreadable resource is a FAIL naming the error)."""


    # ------------------------------------------------------------------ runner
    def run(self) -> list[Finding]:
        findings: list[Finding] = []
        missing = [k for k in REQUIRED_OUTPUTS if not self.out(k)]
        if missing:
            findings.append(Finding("stack outputs", FAIL, f"missing {', '.join(missing)}",
                                    f"{REDEPLOY}, or pass them with --output KEY=VALUE"))
        checks: list[tuple[str, Callable[[], list[Finding]], tuple[str, ...]]] = [
            ("cluster", self.check_cluster, ("ClusterName",)),
            ("GPU instances", self.check_gpu_instances, ("ClusterName",)),
            ("reboot tag", self.check_reboot_tag, ("ClusterName", "InstanceTagKey")),
            ("SSM reachability", self.check_ssm, ("ClusterName",)),
            ("health check", self.check_health_check, ("HealthCheckTaskDefinitionArn",)),
            ("alerts", self.check_alerts, ("AlertTopicArn",)),
            ("rules", self.check_rules, ()),
            ("gang queue", self.check_gang_queue, (GANG_QUEUE, GANG_DLQ)),
            ("tables PITR", self.check_tables, ()),
            ("node tokens", self.check_node_tokens, ("NodeTokenTableName", "ClusterName")),
            ("breaker", self.check_breaker, ("InstanceTableName",)),
            ("overdue jobs", self.check_overdue_jobs, ("JobTableName",)),
        ]
        for name, check, needs in checks:
            absent = [k for k in needs if not self.out(k)]
            if absent:
                findings.append(Finding(name, SKIP, f"needs stack output {', '.join(absent)}"))
                continue
            try:
                findings.extend(check())
            except (ClientError, BotoCoreError) as error:
                findings.append(Finding(name, FAIL, f"could not read: {error_text(error)}",
                                        "run doctor with read access to the stack's resources "
                                        "(e.g. ReadOnlyAccess) in the stack's region"))
        return findings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack-name", default=DEFAULT_STACK_NAME,
                        help=f"deployed stack whose outputs to read (default {DEFAULT_STACK_NAME})")
    parser.add_argument("--outputs-file", type=Path,
                        help="read the outputs from `cdk deploy --outputs-file` instead of CloudFormation")
    parser.add_argument("--output", action="append", default=[], metavar="KEY=VALUE",
                        help="an output value (overrides; with every required key, no stack is read)")
    parser.add_argument("--cluster", help="the ECS cluster you expect the stack to guard")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")



def run(args: argparse.Namespace, session: Any, print_fn: Callable[[str], None] = print) -> int:
    try:
        outputs = resolve_outputs(args, session)
    except OutputsError as error:
        print_fn(f"doctor: {error}")
        return 2
    findings = Doctor(session, outputs, expected_cluster=args.cluster).run()
    if args.json:
        print_fn(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        region = getattr(session, "region_name", None) or "?"
        print_fn(render(findings, f"gpu-recovery-admin doctor: stack {args.stack_name}, cluster "
                                  f"{outputs.get('ClusterName', '?')}, region {region}"))
    return 1 if any(f.status == FAIL for f in findings) else 0
