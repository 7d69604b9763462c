"""cdk-nag 3.x wiring: the AwsSolutions pack as a CDK policy-validation plugin.

cdk-nag 3 runs as a ``Validations`` plugin during ``app.synth()``. Any unacknowledged
finding makes synthesis raise ``RuntimeError("ValidationFailed ...")`` and is listed in
``<outdir>/validation-report.json`` (``pluginReports[].violations[]``). Findings are
acknowledged per construct and per finding id (``AwsSolutions-IAM5[Resource::...]``);
there is no prefix/bulk suppression, so each acknowledgement names exactly one finding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aws_cdk import Acknowledgment, App, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

VALIDATION_REPORT = "validation-report.json"


def add_nag_checks(app: App) -> None:
    """Run the AwsSolutions rule pack on every stack of the app at synth time."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(construct: IConstruct, *rules: tuple[str, str]) -> None:
    """Acknowledge findings on ``construct`` (and its children): ``(finding_id, reason)``."""
    for rule_id, reason in rules:
        if len(reason) < 20:
            raise ValueError(f"acknowledgement of {rule_id} needs a real reason")
        Validations.of(construct).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def read_findings(outdir: str | Path) -> list[dict[str, Any]]:
    """Every violation in the assembly's validation report: rule, severity, construct path."""
    path = Path(outdir) / VALIDATION_REPORT
    if not path.exists():
        return []
    report = json.loads(path.read_text())
    findings = []
    for plugin in report.get("pluginReports", []):
        for violation in plugin.get("violations", []):
            for construct in violation.get("violatingConstructs", []) or [{}]:
                findings.append(
                    {
                        "plugin": plugin.get("pluginName"),
                        "rule": violation.get("ruleName"),
                        "severity": violation.get("severity"),
                        "path": construct.get("constructPath"),
                        "description": violation.get("description"),
                    }
                )
    return findings
