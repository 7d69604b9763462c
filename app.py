#!/usr/bin/env python3
"""CDK app: ``cdk synth -c cluster_name=<your ECS cluster>`` (options: infra/config.py)."""

from __future__ import annotations

import os

import aws_cdk as cdk

from infra.config import RecoveryConfig
from infra.nag import add_nag_checks
from infra.stack import GpuRecoveryStack

STACK_NAME = "GpuTrainingRecovery"


def build_app(
    app: cdk.App | None = None, env: cdk.Environment | None = None
) -> tuple[cdk.App, GpuRecoveryStack]:
    """The app with its stack and the cdk-nag AwsSolutions checks (tests reuse this)."""
    app = app or cdk.App()
    config = RecoveryConfig.from_context(app.node.try_get_context)
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


if __name__ == "__main__":
    build_app()[0].synth()
