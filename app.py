#!/usr/bin/env python3
"""CDK app: ``make synth CDK_ARGS="-c cluster_name=<your ECS cluster>"`` (``cdk synth -c
cluster_name=...`` with the CDK CLI; options: infra/config/).

A bad or unknown context key stops synthesis with one line naming the key (exit 1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def quiet_node_banner() -> None:
    """jsii (aws_cdk's runtime) prints an eleven-line banner when the Node.js running it is
    past its support, on stderr, which jsii's Python side echoes as Python bytes (b'!! ...').
    The Node.js version is the environment's (docs/testing.md); silence the banner for it.
    Before aws_cdk is imported: its first import starts the jsii runtime."""
    os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
    if "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION" in os.environ:
        return
    node = shutil.which("node")
    try:
        version = subprocess.run([node or "node", "--version"], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.strip() if node else ""
    except (OSError, subprocess.SubprocessError):
        version = ""
    major = version.lstrip("v").split(".", 1)[0]
    if major.isdigit():
        os.environ["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = major


quiet_node_banner()

import aws_cdk as cdk  # noqa: E402  (after the banner is silenced)

from infra.config import ConfigError, RecoveryConfig  # noqa: E402
from infra.nag import add_nag_checks  # noqa: E402
from infra.stack import GpuRecoveryStack  # noqa: E402

STACK_NAME = "GpuTrainingRecovery"


def build_app(
    app: cdk.App | None = None, env: cdk.Environment | None = None
) -> tuple[cdk.App, GpuRecoveryStack]:
    """The app with its stack and the cdk-nag AwsSolutions checks (tests reuse this)."""
    app = app or cdk.App()
    # Every context key (cdk.json, cdk.context.json, -c): unknown ones of ours are errors.
    config = RecoveryConfig.from_context(app.node.get_all_context())
    stack = GpuRecoveryStack(
        app,
        STACK_NAME,
        config=config,
        env=env
        or cdk.Environment(
            account=os.environ.get("CDK_DEFAULT_ACCOUNT"),
            region=os.environ.get("CDK_DEFAULT_REGION"),
        ),
    )
    add_nag_checks(app)
    return app, stack


def main() -> int:
    try:
        app, _ = build_app()
    except ConfigError as error:
        print(f"configuration error: {error}", file=sys.stderr)
        return 1
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
