"""Shared Lambda defaults: one place for runtime, layer, tracing, logs and environment.

What is tested is what runs: the functions import Powertools (and, through it, pydantic)
from the public Powertools layer of exactly the version ``requirements.txt`` pins, the
version the tests install. Powertools publishes each release's layer ARN as a public SSM
parameter ``/aws/service/powertools/python/<arch>/<runtime>/<version>``; the template
resolves it at deploy time (a CloudFormation parameter of type
``AWS::SSM::Parameter::Value<String>``), so synthesis needs no network and no Docker, and
a deploy to a region without that release fails before it changes anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from gpu_recovery.constants import (
    ENV_POWERTOOLS_METRICS_NAMESPACE,
    ENV_POWERTOOLS_SERVICE_NAME,
    SCHEDULED_MAX_EVENT_AGE_SECONDS,
)
from gpu_recovery.constants import (
    SCHEDULED_ASYNC_RETRIES as SCHEDULED_ASYNC_RETRIES,  # re-exported: the scheduled functions' infra
)
from gpu_recovery.metric_names import METRICS_NAMESPACE
from infra import LAMBDAS_DIR, REPO_ROOT
from infra.config import RecoveryConfig
from infra.nag import acknowledge

RUNTIME = lambda_.Runtime.PYTHON_3_12
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
ASSET_EXCLUDES = ["**/__pycache__", "**/*.pyc", "**/.mypy_cache", "**/.pytest_cache"]
REQUIREMENTS = REPO_ROOT / "requirements.txt"
POWERTOOLS_PACKAGE = "aws-lambda-powertools"
# Scheduled functions (recovery sweep, heartbeat sweep, queue scheduler): a run that fails
# (say, one throttled DynamoDB call) is retried by Lambda after about 1 and 2 more
# minutes; only a tick that failed three times lands in the DLQ (and alarms). Every run
# is idempotent (conditional writes; the scheduler also holds a lease), so a retry that
# overlaps the next tick is harmless. Older than 5 minutes, a tick is worth nothing.
# (The numbers live in gpu_recovery.constants: the local simulators read them too.)
SCHEDULED_MAX_EVENT_AGE = Duration.seconds(SCHEDULED_MAX_EVENT_AGE_SECONDS)


def pinned_version(package: str, requirements: Path = REQUIREMENTS) -> str:
    """The exact version ``requirements`` pins for ``package`` (``name[extras]==X.Y.Z``)."""
    wanted = re.sub(r"[-_.]+", "-", package).lower()
    for line in requirements.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
        if match and re.sub(r"[-_.]+", "-", match.group(1)).lower() == wanted:
            return match.group(3)
    raise ValueError(f"{requirements} must pin {package} with '==' (the Lambdas deploy that version)")


def powertools_parameter_name(architecture: str, version: str | None = None) -> str:
    """Public SSM parameter holding the ARN of the Powertools layer of ``version``."""
    version = version or pinned_version(POWERTOOLS_PACKAGE)
    return f"/aws/service/powertools/python/{architecture}/{RUNTIME.name}/{version}"


def powertools_layer_arn(scope: Construct, config: RecoveryConfig) -> str:
    """The layer ARN of the pinned Powertools release, resolved at deploy time."""
    return ssm.StringParameter.value_for_string_parameter(
        Stack.of(scope), powertools_parameter_name(config.lambda_architecture))


@dataclass
class LambdaDefaults:
    """What every function of the stack shares; constructs added later reuse it."""

    config: RecoveryConfig
    environment: Mapping[str, str] = field(default_factory=dict)
    # Layers every function also gets (the deployment's fault-catalog override).
    extra_layers: list[lambda_.ILayerVersion] = field(default_factory=list)
    _layer: lambda_.ILayerVersion | None = None
    _code: lambda_.Code | None = None

    def layer(self, scope: Construct) -> lambda_.ILayerVersion:
        if self._layer is None:
            stack = Stack.of(scope)
            self._layer = lambda_.LayerVersion.from_layer_version_arn(
                stack, "PowertoolsLayer", powertools_layer_arn(stack, self.config)
            )
        return self._layer

    def code(self) -> lambda_.Code:
        if self._code is None:
            self._code = lambda_.Code.from_asset(str(LAMBDAS_DIR), exclude=ASSET_EXCLUDES)
        return self._code

    @property
    def architecture(self) -> lambda_.Architecture:
        if self.config.lambda_architecture == "arm64":
            return lambda_.Architecture.ARM_64
        return lambda_.Architecture.X86_64


class RecoveryFunction(Construct):
    """A Lambda function with its own role (least privilege) and its own log group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        defaults: LambdaDefaults,
        handler: str,
        service_name: str,
        description: str,
        timeout: Duration = Duration.seconds(60),
        memory_size: int = 256,
        extra_environment: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.service_name = service_name
        self.statements: list[iam.PolicyStatement] = []
        self.log_group = logs.LogGroup(
            self,
            "LogGroup",
            retention=LOG_RETENTION,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"{service_name}: GPU training recovery function role",
        )
        # Instead of AWSLambdaBasicExecutionRole (AwsSolutions-IAM4): write to own log group only.
        self.log_group.grant_write(self.role)
        environment = {
            **defaults.environment,
            ENV_POWERTOOLS_SERVICE_NAME: service_name,
            ENV_POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
            "POWERTOOLS_LOG_LEVEL": "INFO",
            **(extra_environment or {}),
        }
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=defaults.architecture,
            handler=handler,
            code=defaults.code(),
            layers=[defaults.layer(self), *defaults.extra_layers],
            role=self.role,
            log_group=self.log_group,
            tracing=lambda_.Tracing.ACTIVE,
            timeout=timeout,
            memory_size=memory_size,
            description=description,
            environment=environment,
        )
        acknowledge(
            self.function,
            (
                "AwsSolutions-L1",
                "Python 3.12 is pinned on purpose: the Powertools public layer used is the "
                "python3.12 build of the pinned release and the handlers are tested on 3.12.",
            ),
        )

    def add_to_policy(self, *statements: iam.PolicyStatement) -> None:
        for statement in statements:
            self.statements.append(statement)
            self.role.add_to_principal_policy(statement)
