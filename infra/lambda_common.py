"""Shared Lambda defaults: one place for runtime, layer, tracing, logs and environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aws_cdk import Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from gpu_recovery.constants import (
    ENV_POWERTOOLS_METRICS_NAMESPACE,
    ENV_POWERTOOLS_SERVICE_NAME,
    METRICS_NAMESPACE,
)
from infra import LAMBDAS_DIR
from infra.config import POWERTOOLS_LAYER_ACCOUNT, RecoveryConfig
from infra.nag import acknowledge

RUNTIME = lambda_.Runtime.PYTHON_3_12
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
ASSET_EXCLUDES = ["**/__pycache__", "**/*.pyc", "**/.mypy_cache", "**/.pytest_cache"]


def powertools_layer_arn(config: RecoveryConfig) -> str:
    """Public Powertools v3 layer for python3.12 in the deployment region."""
    return Fn.sub(
        "arn:${AWS::Partition}:lambda:${AWS::Region}:"
        f"{POWERTOOLS_LAYER_ACCOUNT}:layer:AWSLambdaPowertoolsPythonV3-python312-"
        f"{config.lambda_architecture}:{config.powertools_layer_version}"
    )


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
                stack, "PowertoolsLayer", powertools_layer_arn(self.config)
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
                "python312 build and the handlers are tested on 3.12.",
            ),
        )

    def add_to_policy(self, *statements: iam.PolicyStatement) -> None:
        for statement in statements:
            self.statements.append(statement)
            self.role.add_to_principal_policy(statement)
