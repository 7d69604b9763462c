"""The deployed stack as doctor reads it: its outputs (CloudFormation, a ``cdk deploy
--outputs-file`` file, or ``--output KEY=VALUE``) and the account's clients."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from cli.doctor.findings import error_text
from gpu_recovery import clock
from gpu_recovery.constants import ENV_STACK_OUTPUTS_FILE

DEFAULT_STACK_NAME = "GpuTrainingRecovery"
OUTPUTS_FILE_ENV = ENV_STACK_OUTPUTS_FILE  # read when --outputs-file is not given
# Outputs every check needs (stacks deployed before the doctor existed lack some).
REQUIRED_OUTPUTS = ("ClusterName", "InstanceTagKey", "InstanceTagValue", "AlertTopicArn",
                    "HealthCheckTaskDefinitionArn", "JobTableName", "InstanceTableName",
                    "NodeTokenTableName")
# Tables whose point-in-time recovery is checked (a stack from before time sharing has no
# QuotaTableName: only the tables it names are checked).
TABLE_OUTPUTS = ("JobTableName", "InstanceTableName", "NodeTokenTableName", "IdempotencyTableName",
                 "QuotaTableName")
RULE_SUFFIX, DLQ_SUFFIX = "RuleName", "DeadLetterQueueUrl"
GANG_QUEUE, GANG_DLQ, GANG_WORKER = "GangQueueUrl", "GangWorkerDeadLetterQueueUrl", "GangWorkerFunctionName"


class OutputsError(ValueError):
    """The stack's outputs could not be read."""


def stack_outputs(session: Any, stack_name: str) -> dict[str, str]:
    try:
        stacks = aws_client(session, "cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        raise OutputsError(f"stack {stack_name!r}: {error_text(error)} (deployed in another "
                           "region or account? use --region / --profile)") from error
    except (BotoCoreError, ResponseParserError) as error:  # no CloudFormation answered at all
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        if endpoint:  # an emulator (the playground's has no CloudFormation)
            raise OutputsError(f"AWS_ENDPOINT_URL={endpoint} answers no CloudFormation: give the stack's "
                               f"outputs with --outputs-file or ${OUTPUTS_FILE_ENV} (make playground exports "
                               "it)") from error
        raise OutputsError(f"stack {stack_name!r}: {error_text(error)}") from error
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def outputs_file(path: Path, stack_name: str) -> dict[str, str]:
    """``cdk deploy --outputs-file`` ({stack: {key: value}}) or a flat {key: value}."""
    data = json.loads(path.read_text())
    if isinstance(data.get(stack_name), dict):
        data = data[stack_name]
    elif data and all(isinstance(v, dict) for v in data.values()) and len(data) == 1:
        data = next(iter(data.values()))
    if not isinstance(data, dict):
        raise OutputsError(f"{path}: expected a JSON object of stack outputs")
    return {str(k): str(v) for k, v in data.items()}


def aws_client(session: Any, service: str) -> Any:
    return session.client(service, config=Config(retries={"mode": "standard", "max_attempts": 5}))


def aws_client_in(session: Any, service: str, region: str) -> Any:
    return session.client(service, region_name=region,
                          config=Config(retries={"mode": "standard", "max_attempts": 5}))



def resolve_outputs(args: argparse.Namespace, session: Any) -> dict[str, str]:
    given: dict[str, str] = {}
    for pair in args.output:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise OutputsError(f"--output {pair!r}: expected KEY=VALUE")
        given[key] = value
    from_env = os.environ.get(OUTPUTS_FILE_ENV)
    path = args.outputs_file or (Path(from_env) if from_env else None)
    if path is not None:
        try:
            return {**outputs_file(path, args.stack_name), **given}
        except (OSError, ValueError) as error:
            raise OutputsError(f"outputs file {path}: {error}") from error
    if all(k in given for k in REQUIRED_OUTPUTS):
        return given
    return {**stack_outputs(session, args.stack_name), **given}



class Account:
    """The account the checks read: its clients (standard retries, made once each) and the
    stack's outputs."""

    def __init__(self, session: Any, outputs: Mapping[str, str], *,
                 expected_cluster: str | None = None,
                 now: Callable[[], float] = clock.now) -> None:
        self.session = session
        self.outputs = dict(outputs)
        self.expected_cluster = expected_cluster
        self.now = now
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = aws_client(self.session, service)
        return self._clients[service]

    def out(self, key: str) -> str:
        return self.outputs.get(key, "")
