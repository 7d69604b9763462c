"""Template assertions on a small test stack with NodeApi + NodeAgentDaemon, and cdk-nag
AwsSolutions clean on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from gpu_recovery.api_routes import NODE_TOKEN_HEADER_PATTERN
from infra.config import RecoveryConfig
from infra.lambda_common import LambdaDefaults
from infra.nag import add_nag_checks, read_findings
from infra.node_agent import NodeAgentDaemon
from infra.node_api import HeartbeatConfig, NodeApi
from infra.notifications import Notifications
from infra.recovery import ClusterAccess
from infra.tables import RecoveryTables


def _synth(outdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(app, "HeartbeatTest", env=cdk.Environment(account="111122223333", region="us-east-1"))
    config = RecoveryConfig(cluster_name="gpu-cluster", instance_tag_value="gpu-cluster")
    tables = RecoveryTables(stack, "Tables", removal_policy="destroy")
    notifications = Notifications(stack, "Notifications", alert_email=None)
    defaults = LambdaDefaults(config=config, environment={
        "TRAINING_JOB_TABLE_NAME": tables.job_table.table_name,
        "CONTAINER_INSTANCE_TABLE_NAME": tables.instance_table.table_name,
        "ECS_CLUSTER_NAME": "gpu-cluster", "SNS_TOPIC_ARN": notifications.topic.topic_arn})
    api = NodeApi(stack, "NodeApi", defaults=defaults, tables=tables, notifications=notifications,
                  access=ClusterAccess(stack, config), heartbeat=HeartbeatConfig(hang_seconds=900),
                  removal_policy="destroy")
    NodeAgentDaemon(stack, "NodeAgent", cluster_name="gpu-cluster", api_url=api.url)
    # What the stack hands the scheduler: the stage URL without a reference to the stage.
    cdk.CfnOutput(stack, "StageUrl", value=api.stage_url)
    add_nag_checks(app)
    error = None
    try:
        app.synth()
    except RuntimeError as exc:
        error = str(exc)
    template = json.loads((outdir / "HeartbeatTest.template.json").read_text())
    return template, read_findings(outdir), error


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list, str | None]:
    return _synth(tmp_path_factory.mktemp("hb-cdk"))


def _resources(template: dict[str, Any], type_name: str) -> dict[str, Any]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def test_nag_clean(synth) -> None:
    """Given the test stack with the AwsSolutions pack, Then no unacknowledged finding."""
    _, findings, error = synth
    assert error is None, findings
    assert findings == []


def test_every_method_is_authorized(synth) -> None:
    """Every API method has an authorization type other than NONE; node routes use the
    token authorizer."""
    template, _, _ = synth
    methods = _resources(template, "AWS::ApiGateway::Method")
    assert len(methods) == 2
    for method in methods.values():
        props = method["Properties"]
        assert props["AuthorizationType"] not in (None, "NONE")
        assert props["AuthorizationType"] == "CUSTOM" and "AuthorizerId" in props
        assert props["HttpMethod"] == "POST"
    (authorizer,) = _resources(template, "AWS::ApiGateway::Authorizer").values()
    assert authorizer["Properties"]["Type"] == "TOKEN"
    assert authorizer["Properties"]["IdentitySource"] == "method.request.header.Authorization"
    # API Gateway refuses a malformed header (401) with the runtime's own pattern.
    assert authorizer["Properties"]["IdentityValidationExpression"] == NODE_TOKEN_HEADER_PATTERN


def test_stage_has_throttling_logs_and_tracing(synth) -> None:
    template, _, _ = synth
    Template.from_json(template).has_resource_properties("AWS::ApiGateway::Stage", {
        "StageName": "prod", "TracingEnabled": True,
        "AccessLogSetting": Match.object_like({"DestinationArn": Match.any_value()}),
        "MethodSettings": Match.array_with([Match.object_like({
            "ThrottlingRateLimit": 1000, "ThrottlingBurstLimit": 2000, "LoggingLevel": "ERROR"})]),
    })


def test_sweep_schedule_and_env(synth) -> None:
    template, _, _ = synth
    t = Template.from_json(template)
    t.has_resource_properties("AWS::Events::Rule", {"ScheduleExpression": "rate(1 minute)"})
    t.has_resource_properties("AWS::Lambda::Function", {
        "Handler": "handlers.heartbeat_sweep.lambda_handler",
        "Environment": {"Variables": Match.object_like({
            "HEARTBEAT_STALE_SECONDS": "180", "NODE_LOST_FAIL_SECONDS": "1800", "HANG_SECONDS": "900",
            "HANG_ACTION": "notify", "NODE_TOKEN_TABLE_NAME": Match.any_value()})}})


def test_sweep_target_retries_deliveries_like_the_other_schedules(synth) -> None:
    """The sweep's EventBridge target retries a failed delivery (8 attempts, as the recovery
    sweep's and the scheduler's) within the tick's 5 minutes, then dead-letters it."""
    template, _, _ = synth
    (rule,) = [r for r in _resources(template, "AWS::Events::Rule").values()
               if r["Properties"].get("ScheduleExpression") == "rate(1 minute)"]
    (target,) = rule["Properties"]["Targets"]
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 300, "MaximumRetryAttempts": 8}
    assert "DeadLetterConfig" in target


def test_stage_url_refers_to_the_rest_api_only(synth) -> None:
    """NodeApi.stage_url is the prod stage's URL built from the RestApi id, region and URL
    suffix: a function holding it depends on the RestApi, not on the stage or deployment."""
    template, _, _ = synth
    (api_id,) = _resources(template, "AWS::ApiGateway::RestApi")
    assert template["Outputs"]["StageUrl"]["Value"] == {"Fn::Join": ["", [
        "https://", {"Ref": api_id}, ".execute-api.", {"Ref": "AWS::Region"}, ".",
        {"Ref": "AWS::URLSuffix"}, "/prod/"]]}


def test_token_table_is_protected(synth) -> None:
    template, _, _ = synth
    tables = [t for t in _resources(template, "AWS::DynamoDB::Table").values()
              if t["Properties"]["KeySchema"] == [{"AttributeName": "node_id", "KeyType": "HASH"}]]
    (table,) = tables
    props = table["Properties"]
    assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert props["SSESpecification"]["SSEEnabled"] is True


def test_authorizer_reads_only_the_token_table(synth) -> None:
    """The authorizer's role may only GetItem on the token table (plus logs/X-Ray)."""
    template, _, _ = synth
    policies = _resources(template, "AWS::IAM::Policy")
    auth = [p for k, p in policies.items() if k.startswith("NodeApiAuthorizer")]
    actions = {a for p in auth for s in p["Properties"]["PolicyDocument"]["Statement"]
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert "dynamodb:GetItem" in actions
    assert not {a for a in actions if a.startswith("dynamodb:") and a != "dynamodb:GetItem"}


def test_agent_daemon_service(synth) -> None:
    template, _, _ = synth
    t = Template.from_json(template)
    t.has_resource_properties("AWS::ECS::Service", {"SchedulingStrategy": "DAEMON",
                                                    "Cluster": "gpu-cluster", "LaunchType": "EC2"})
    (task,) = _resources(template, "AWS::ECS::TaskDefinition").values()
    container = task["Properties"]["ContainerDefinitions"][0]
    assert container["Command"][:2] == ["python3", "-c"] and "def run_cycle" in container["Command"][2]
    assert task["Properties"]["PidMode"] == "host" and task["Properties"]["NetworkMode"] == "host"
    assert not any(e["Name"].split("_")[-1] == "TOKEN" for e in container["Environment"])
