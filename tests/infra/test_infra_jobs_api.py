"""Template assertions for ``JobsApi`` on a test stack (one synthesis, shared)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_lambda as lambda_
from infra_synth import with_partition

from gpu_recovery.constants import (
    ENV_CLUSTER_NAME,
    ENV_IDEMPOTENCY_TABLE,
    ENV_JOB_TABLE,
    ENV_QUOTA_TABLE,
    ENV_SCHEDULER_FUNCTION,
    table_definitions,
)
from infra.config import RecoveryConfig
from infra.jobs_api import JOBS_API_HANDLER, ROUTES, JobsApi
from infra.lambda_common import LambdaDefaults
from infra.nag import add_nag_checks, read_findings
from infra.tables import RecoveryTables

ACCOUNT, REGION, CLUSTER = "111122223333", "us-east-1", "gpu-cluster"
CLUSTER_ARN = f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{CLUSTER}"


class _Synth:
    def __init__(self, template: dict[str, Any], findings: list[dict[str, Any]], error: str | None):
        self.template = template
        self.findings = findings
        self.error = error

    def resources(self, type_name: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == type_name}


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> _Synth:
    outdir: Path = tmp_path_factory.mktemp("jobs-api")
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(app, "JobsApiTest", env=cdk.Environment(account=ACCOUNT, region=REGION))
    rest_api = apigateway.RestApi(stack, "Api", rest_api_name="gpu-jobs-test")
    tables = RecoveryTables(stack, "Tables", removal_policy="destroy")
    scheduler = lambda_.Function(
        stack, "Scheduler", runtime=lambda_.Runtime.PYTHON_3_12, handler="index.handler",
        code=lambda_.Code.from_inline("def handler(event, context):\n    return None\n"),
    )
    JobsApi(
        stack, "JobsApi", rest_api=rest_api, job_table=tables.job_table, cluster_name=CLUSTER,
        defaults=LambdaDefaults(config=RecoveryConfig(cluster_name=CLUSTER)),
        scheduler_function=scheduler, quota_table=tables.quota_table,
    )
    add_nag_checks(app)
    error = None
    try:
        app.synth()
    except RuntimeError as exc:  # nag findings interrupt synthesis
        error = str(exc)
    template = with_partition(json.loads((outdir / "JobsApiTest.template.json").read_text()), "aws")
    return _Synth(template, read_findings(outdir), error)


def _jobs_function(synth: _Synth) -> tuple[str, dict[str, Any]]:
    found = [(k, v) for k, v in synth.resources("AWS::Lambda::Function").items()
             if v["Properties"].get("Handler") == JOBS_API_HANDLER]
    assert len(found) == 1
    return found[0]


def _path_of(synth: _Synth, resource_id: str) -> str:
    resources = synth.template["Resources"]
    parts = []
    ref: Any = {"Ref": resource_id}
    while isinstance(ref, dict) and "Ref" in ref and ref["Ref"] in resources and \
            resources[ref["Ref"]]["Type"] == "AWS::ApiGateway::Resource":
        props = resources[ref["Ref"]]["Properties"]
        parts.append(props["PathPart"])
        ref = props["ParentId"]
    return "/" + "/".join(reversed(parts))


def _jobs_policy_statements(synth: _Synth) -> list[dict[str, Any]]:
    _, fn = _jobs_function(synth)
    role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return statements


def test_every_jobs_method_uses_iam_authorization(synth: _Synth) -> None:
    """Given the construct on a test RestApi
    When the stack is synthesized
    Then every /v1/jobs method (and /swagger) exists and has AuthorizationType AWS_IAM."""
    methods = {}
    for method in synth.resources("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        path = _path_of(synth, props["ResourceId"]["Ref"])
        methods[f"{props['HttpMethod']} {path}"] = props
    expected = {f"{m} /{p}" for m, p in ROUTES} | {"GET /swagger"}
    # Time sharing: a user's suspend / resume and the quota routes, each its own method.
    assert {"POST /v1/jobs/{job_id}/suspend", "POST /v1/jobs/{job_id}/resume", "GET /v1/quotas",
            "PUT /v1/quotas", "DELETE /v1/quotas"} <= expected
    assert expected <= set(methods)
    for key in expected:
        assert methods[key]["AuthorizationType"] == "AWS_IAM", key
    assert all(p["AuthorizationType"] == "AWS_IAM" for k, p in methods.items() if "/v1/jobs" in k)


def test_function_environment_and_runtime(synth: _Synth) -> None:
    """Given the construct
    When synthesized
    Then the function knows its tables, cluster and scheduler, runs with the Powertools layer."""
    _, fn = _jobs_function(synth)
    env = fn["Properties"]["Environment"]["Variables"]
    assert {ENV_JOB_TABLE, ENV_IDEMPOTENCY_TABLE, ENV_SCHEDULER_FUNCTION} <= set(env)
    (quota_table,) = [k for k in synth.resources("AWS::DynamoDB::Table") if k.startswith("TablesQuotaTable")]
    assert env[ENV_QUOTA_TABLE] == {"Ref": quota_table}
    assert env[ENV_CLUSTER_NAME] == CLUSTER
    assert fn["Properties"]["Layers"], "Powertools layer expected"
    assert fn["Properties"]["TracingConfig"] == {"Mode": "Active"}


def test_idempotency_table(synth: _Synth) -> None:
    """Given no idempotency table passed in
    When synthesized
    Then one is created: PK id, TTL expiration, PITR on, encrypted."""
    tables = [t["Properties"] for t in synth.resources("AWS::DynamoDB::Table").values()
              if t["Properties"]["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]]
    assert len(tables) == 1
    table = tables[0]
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}
    assert table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["SSESpecification"]["SSEEnabled"] is True


def test_least_privilege_policy(synth: _Synth) -> None:
    """Given the function's policy
    When its statements are read
    Then no Scan, ECS writes are conditioned on the cluster, and Invoke targets the scheduler only."""
    statements = _jobs_policy_statements(synth)
    by_sid = {s.get("Sid"): s for s in statements}
    actions = [a for s in statements
               for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])]
    assert "dynamodb:Scan" not in actions
    assert not any(a.endswith(":*") for a in actions)
    for sid in ("StopTaskInCluster", "DescribeContainerInstancesInCluster"):
        assert by_sid[sid]["Condition"] == {"ArnEquals": {"ecs:cluster": CLUSTER_ARN}}
    assert by_sid["ListContainerInstancesOfCluster"]["Resource"] == CLUSTER_ARN
    assert by_sid["DescribeTaskDefinitions"]["Resource"] == "*"
    assert by_sid["DescribeTaskDefinitions"]["Action"] == "ecs:DescribeTaskDefinition"
    invoke = by_sid["TriggerScheduler"]
    assert invoke["Action"] == "lambda:InvokeFunction"
    assert "Fn::GetAtt" in invoke["Resource"]
    job_resources = json.dumps(by_sid["JobTableData"]["Resource"])
    for gsi in table_definitions()["job"]["GlobalSecondaryIndexes"]:
        assert f"/index/{gsi['IndexName']}" in job_resources
    assert "index/*" not in job_resources
    (quota_table,) = [k for k in synth.resources("AWS::DynamoDB::Table") if k.startswith("TablesQuotaTable")]
    quota = by_sid["QuotaTableData"]
    assert quota["Resource"] == {"Fn::GetAtt": [quota_table, "Arn"]}  # the table (it has no index)
    assert not {"dynamodb:Scan", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"} & set(quota["Action"])
    logs = by_sid["ReadTrainingLogs"]
    assert logs["Action"] == "logs:GetLogEvents"
    assert "log-group:/ecs/*:*" in json.dumps(logs["Resource"])


def test_no_cdk_nag_findings_in_the_construct(synth: _Synth) -> None:
    """Given the AwsSolutions pack
    When the test stack is synthesized
    Then nothing under the JobsApi construct is flagged (the test's own RestApi may be)."""
    mine = [f for f in synth.findings if "/JobsApi/" in (f.get("path") or "")]
    assert mine == []
