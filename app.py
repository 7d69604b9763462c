#!/usr/bin/env python3
"""CDK app: ``cdk synth -c cluster_name=<your ECS cluster>`` (options: infra/config/).

A bad or unknown context key stops synthesis with one line naming the key (exit 1).
"""

from __future__ import annotations

import os
import sys

import aws_cdk as cdk

from infra.config import ConfigError, RecoveryConfig
from infra.nag import add_nag_checks
from infra.stack import GpuRecoveryStack

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
