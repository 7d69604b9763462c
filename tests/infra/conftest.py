"""One synthesis per configuration, shared by every infra test (synth is slow: jsii)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from app import STACK_NAME, build_app
from infra.health_check import DEFAULT_SCRIPT, SCRIPT_ENV_VAR
from infra.nag import read_findings

ACCOUNT = "111122223333"
REGION = "us-east-1"
CLUSTER = "gpu-cluster"
CLUSTER_ARN = f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{CLUSTER}"
EVENTS_DIR = Path(__file__).resolve().parent.parent / "events"
CUSTOM_TASK_ARN = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/my-dcgm:3"

DEFAULT_CONTEXT = {"cluster_name": CLUSTER}
CUSTOM_CONTEXT = {
    "cluster_name": CLUSTER,
    "alert_email": "oncall@example.com",
    "table_removal_policy": "destroy",
    "health_check_task_arn": CUSTOM_TASK_ARN,
    "suspect_exit_codes": "1,134",
    "instance_tag_key": "team",
    "instance_tag_value": "ml-platform",
    "lambda_architecture": "arm64",
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


def synthesize(context: dict[str, Any], outdir: Path) -> Synth:
    """Synthesize the real app (with the cdk-nag plugin) into ``outdir``."""
    app = cdk.App(outdir=str(outdir), context=context)
    _, stack = build_app(app, env=cdk.Environment(account=ACCOUNT, region=REGION))
    error = None
    try:
        app.synth()
    except RuntimeError as exc:  # cdk-nag findings interrupt synthesis
        error = str(exc)
    template = json.loads((outdir / f"{STACK_NAME}.template.json").read_text())
    return Synth(stack, template, outdir, error, read_findings(outdir))


@pytest.fixture(scope="session")
def health_check_script() -> Iterator[Path]:
    """The real script; a throwaway copy under /tmp only while it does not exist yet."""
    if DEFAULT_SCRIPT.exists() or os.environ.get(SCRIPT_ENV_VAR):
        yield Path(os.environ.get(SCRIPT_ENV_VAR) or DEFAULT_SCRIPT)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dcgm_health_check.sh"
        path.write_text("#!/bin/sh\n# placeholder for tests\ndcgmi diag -r \"$DCGM_LEVEL\"\n")
        os.environ[SCRIPT_ENV_VAR] = str(path)
        try:
            yield path
        finally:
            os.environ.pop(SCRIPT_ENV_VAR, None)


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory: pytest.TempPathFactory, health_check_script: Path) -> Synth:
    return synthesize(DEFAULT_CONTEXT, tmp_path_factory.mktemp("cdk-default"))


@pytest.fixture(scope="session")
def custom_synth(tmp_path_factory: pytest.TempPathFactory, health_check_script: Path) -> Synth:
    return synthesize(CUSTOM_CONTEXT, tmp_path_factory.mktemp("cdk-custom"))


def load_event(name: str) -> dict[str, Any]:
    return json.loads((EVENTS_DIR / name).read_text())
