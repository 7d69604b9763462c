"""Narrower IAM (issue 8): no unused DynamoDB actions, PassRole limited to the task-role
prefix, a reboot-only SSM document, partition-aware ARNs (aws-cn, aws-us-gov), API
Gateway's own errors in the APIs' error shape."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from infra_synth import DEFAULT_CONTEXT, Synth, statement_actions, statement_resources, synthesize

from gpu_recovery.adapters.compute import REBOOT_COMMAND
from gpu_recovery.api_routes import GATEWAY_ERRORS
from gpu_recovery.constants import (
    ENV_JOBS_ADMIN_ROLES,
    ENV_JOBS_ALLOWED_FAMILIES,
    ENV_JOBS_TASK_ROLE_PREFIXES,
    ENV_REBOOT_DOCUMENT,
)

SECURITY_CONTEXT = {**DEFAULT_CONTEXT, "admin_roles": "gpu-ops", "team_roles": '["ml-team"]',
                    "allowed_task_families": "llama-*,bert-train", "task_role_name_prefix": "ml-jobs-",
                    "reserved_priority_roles": "gpu-ops", "telemetry_notify_interval_seconds": "600"}


def _statements_by_role(synth: Synth) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for policy in synth.resources("AWS::IAM::Policy").values():
        for role in policy["Properties"]["Roles"]:
            found.setdefault(role["Ref"], []).extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def _function_role(synth: Synth, service: str) -> str:
    for function in synth.resources("AWS::Lambda::Function").values():
        env = function["Properties"].get("Environment", {}).get("Variables", {})
        if env.get("POWERTOOLS_SERVICE_NAME") == service:
            return function["Properties"]["Role"]["Fn::GetAtt"][0]
    raise AssertionError(service)


def _environment(synth: Synth, service: str) -> dict[str, Any]:
    for function in synth.resources("AWS::Lambda::Function").values():
        env = function["Properties"].get("Environment", {}).get("Variables", {})
        if env.get("POWERTOOLS_SERVICE_NAME") == service:
            return env
    raise AssertionError(service)


@pytest.fixture(scope="module")
def security_synth(tmp_path_factory: pytest.TempPathFactory, health_check_script: Path) -> Synth:
    return synthesize(SECURITY_CONTEXT, tmp_path_factory.mktemp("cdk-security"))


def test_no_scan_batch_write_or_delete_where_unused(default_synth: Synth) -> None:
    """Scan / BatchWriteItem / DeleteItem were granted to 6 roles; no code uses them
    (DeleteItem only on the idempotency table: Powertools deletes a failed record)."""
    idempotency = next(iter(k for k, v in default_synth.resources("AWS::DynamoDB::Table").items()
                            if "Idempotency" in k and v["Properties"].get("TimeToLiveSpecification")))
    for role, statements in _statements_by_role(default_synth).items():
        for statement in statements:
            actions = statement_actions(statement)
            assert not {"dynamodb:Scan", "dynamodb:BatchWriteItem", "dynamodb:*"} & actions, role
            if "dynamodb:DeleteItem" in actions:
                assert statement_resources(statement) == [{"Fn::GetAtt": [idempotency, "Arn"]}], role


def test_pass_role_only_for_the_task_role_prefix(default_synth: Synth, security_synth: Synth) -> None:
    """iam:PassRole on role/* was held by 6 roles; now role/<prefix>* and the stack's own
    health-check roles (by ARN), only to ecs-tasks."""
    for synth, prefix in ((default_synth, "gpu-training-"), (security_synth, "ml-jobs-")):
        passes = [s for ss in _statements_by_role(synth).values() for s in ss
                  if "iam:PassRole" in statement_actions(s)]
        assert passes
        for statement in passes:
            resources = statement_resources(statement)
            assert f"arn:aws:iam::111122223333:role/{prefix}*" in resources
            others = [r for r in resources if isinstance(r, str) and r.endswith("*")]
            assert others == [f"arn:aws:iam::111122223333:role/{prefix}*"]
            assert all(isinstance(r, str) or "Fn::GetAtt" in r for r in resources)
            assert statement["Condition"] == {
                "StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}


def test_node_authorizer_reads_one_table_only(default_synth: Synth) -> None:
    role = _function_role(default_synth, "node-authorizer")
    actions = set().union(*(statement_actions(s) for s in _statements_by_role(default_synth)[role]))
    assert actions <= {"dynamodb:GetItem", "logs:CreateLogStream", "logs:PutLogEvents",
                       "xray:PutTraceSegments", "xray:PutTelemetryRecords"}, actions


def test_reboot_only_ssm_document(default_synth: Synth) -> None:
    (document,) = default_synth.resources("AWS::SSM::Document").values()
    props = document["Properties"]
    assert props["DocumentType"] == "Command"
    content = props["Content"]
    assert "parameters" not in content
    (step,) = content["mainSteps"]
    assert step["inputs"]["runCommand"] == [REBOOT_COMMAND]
    doc_id = next(iter(default_synth.resources("AWS::SSM::Document")))
    for service in ("dcgm-task-monitor", "recovery-sweep", "ecs-task-handler"):
        assert _environment(default_synth, service)[ENV_REBOOT_DOCUMENT] == {"Ref": doc_id}


def test_jobs_api_gets_the_authorization_settings(security_synth: Synth) -> None:
    env = _environment(security_synth, "jobs-api")
    assert json.loads(env[ENV_JOBS_ADMIN_ROLES]) == ["gpu-ops"]
    assert json.loads(env[ENV_JOBS_ALLOWED_FAMILIES]) == ["llama-*", "bert-train"]
    assert json.loads(env[ENV_JOBS_TASK_ROLE_PREFIXES]) == ["ml-jobs-"]
    assert _environment(security_synth, "node-api")["HW_SIGNAL_NOTIFY_SECONDS"] == "600"
    assert security_synth.error is None, security_synth.error


def test_gateway_errors_use_the_error_shape(default_synth: Synth) -> None:
    responses = {r["Properties"]["ResponseType"]: r["Properties"]
                 for r in default_synth.resources("AWS::ApiGateway::GatewayResponse").values()}
    for name in [*GATEWAY_ERRORS, "DEFAULT_4XX", "DEFAULT_5XX", "BAD_REQUEST_BODY"]:
        template = responses[name]["ResponseTemplates"]["application/json"]
        assert template.startswith('{"error": "$context.error.responseType", "message": '), name


# the same code path in both partitions: GovCloud in the slow tier only (tests/conftest.py)
@pytest.mark.parametrize(("region", "partition"), [("cn-north-1", "aws-cn"),
                                                   pytest.param("us-gov-west-1", "aws-us-gov",
                                                                marks=pytest.mark.slow)])
def test_synthesis_in_other_partitions(region: str, partition: str, health_check_script: Path,
                                       tmp_path: Path) -> None:
    """ARNs are built from the stack's partition: no hard-coded arn:aws: in the template,
    and every IAM resource resolves into the region's partition; cdk-nag stays clean."""
    synth = synthesize(DEFAULT_CONTEXT, tmp_path, region=region)
    assert synth.error is None, synth.error
    template = synth.outdir / "GpuTrainingRecovery.template.json"
    raw = template.read_text()
    assert '"arn:aws:' not in raw
    lint = subprocess.run([str(Path(sys.executable).parent / "cfn-lint"), "--format", "parseable",
                           "--regions", region, "--", str(template)],
                          capture_output=True, text=True, check=False, timeout=180)
    assert not [line for line in lint.stdout.splitlines() if ":E" in line], lint.stdout
    for statements in _statements_by_role(synth).values():
        for statement in statements:
            for resource in statement_resources(statement):
                if isinstance(resource, str) and resource != "*":
                    assert resource.startswith(f"arn:{partition}:"), resource


# ------------------------------------------------------------------- time sharing (issue 10)
# Who may start tasks (and pass roles to them): the recovery loop's restarts and health
# checks, the node API / heartbeat sweep handing jobs to it, the scheduler's launches.
# Suspending starts nothing: the job-control API is not in this list.
STARTERS = {"ecs-task-handler", "dcgm-task-monitor", "ecs-instance-monitor", "recovery-sweep", "node-api",
            "heartbeat-sweep", "queue-scheduler", "gang-worker", "tag-lookup-worker"}


def _services_by_role(synth: Synth) -> dict[str, str]:
    return {fn["Properties"]["Role"]["Fn::GetAtt"][0]: fn["Properties"]["Environment"]["Variables"][
        "POWERTOOLS_SERVICE_NAME"] for fn in synth.resources("AWS::Lambda::Function").values()}


def _table_id(synth: Synth, prefix: str) -> str:
    (table,) = [k for k in synth.resources("AWS::DynamoDB::Table") if k.startswith(prefix)]
    return table


def _arn_tables(resource: Any) -> set[str]:
    """The tables (logical ids) an IAM resource names, whole or by index."""
    return {ref for ref in re.findall(r'"Fn::GetAtt": \["([A-Za-z0-9]+)", "Arn"\]', json.dumps(resource))}


def test_exactly_these_functions_may_start_tasks_and_pass_roles(default_synth: Synth) -> None:
    """Pinned: ecs:StartTask and iam:PassRole belong to exactly the functions that start tasks
    (a new holder must be a decision, not a side effect); the job-control API, which only
    stops the tasks of a suspended job, holds neither."""
    services = _services_by_role(default_synth)
    for action in ("ecs:StartTask", "iam:PassRole"):
        holders = {services[role] for role, statements in _statements_by_role(default_synth).items()
                   if role in services and any(action in statement_actions(s) for s in statements)}
        assert holders == STARTERS, action


def test_job_control_authorizer_reads_the_job_table_only(default_synth: Synth) -> None:
    """The control authorizer checks a token against the job's secret: one GetItem on the job
    table (no index, no other table, nothing else beyond its logs and X-Ray)."""
    role = _function_role(default_synth, "job-control-authorizer")
    statements = [s for s in _statements_by_role(default_synth)[role]
                  if not statement_actions(s) <= {"logs:CreateLogStream", "logs:PutLogEvents",
                                         "xray:PutTraceSegments", "xray:PutTelemetryRecords"}]
    job_table = _table_id(default_synth, "TablesJobTable")
    assert [(statement_actions(s), s["Resource"]) for s in statements] == [
        ({"dynamodb:GetItem"}, {"Fn::GetAtt": [job_table, "Arn"]})]


def test_job_control_api_stops_tasks_and_holds_nodes_of_the_cluster_only(
    default_synth: Synth,
) -> None:
    """go_suspend() stops the job's ranks: StopTask on the cluster's tasks (ArnEquals
    ecs:cluster); the preflight's handover fences the pinned nodes and reserves the job's
    nodes (issue 49): the instance table's data and the placement attribute on the cluster's
    container instances (with a spare pool, their listing). The job and instance tables' data
    actions (no Scan, BatchWrite or Delete); no StartTask, no PassRole, no SNS, no quota table."""
    role = _function_role(default_synth, "job-control-api")
    statements = _statements_by_role(default_synth)[role]
    actions = set().union(*(statement_actions(s) for s in statements))
    assert {a for a in actions if a.startswith("ecs:")} == {
        "ecs:StopTask", "ecs:PutAttributes", "ecs:DeleteAttributes", "ecs:ListContainerInstances",
        "ecs:DescribeContainerInstances"}
    assert not {a for a in actions if a.startswith(("iam:", "sns:", "ec2:", "ssm:", "lambda:"))}
    (stop,) = [s for s in statements if "ecs:StopTask" in statement_actions(s)]
    assert stop["Condition"] == {"ArnEquals": {"ecs:cluster": "arn:aws:ecs:us-east-1:111122223333:cluster/"
                                                               "gpu-cluster"}}
    assert stop["Resource"] == "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/*"
    dynamo = [s for s in statements if any(a.startswith("dynamodb:") for a in statement_actions(s))
              and s.get("Sid") not in ("EcsCallBudgetItem", "PreflightBaselineItems")]
    assert set().union(*(_arn_tables(s["Resource"]) for s in dynamo)) == {
        _table_id(default_synth, "TablesJobTable"), _table_id(default_synth, "TablesInstanceTable")}
    assert set().union(*(statement_actions(s) for s in dynamo)) == {
        "dynamodb:BatchGetItem", "dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:Query",
        "dynamodb:PutItem", "dynamodb:UpdateItem"}


def test_only_the_scheduler_and_the_jobs_api_reach_the_quota_table(default_synth: Synth) -> None:
    """The quota table (limits and charges) is read and written by the scheduler (charges,
    releases) and the jobs API (quota routes, submit check) only, with the same data actions
    as the other tables; the recovery loop never touches it."""
    quota = _table_id(default_synth, "TablesQuotaTable")
    services = _services_by_role(default_synth)
    holders: dict[str, set[str]] = {}
    for role, statements in _statements_by_role(default_synth).items():
        for statement in statements:
            if quota in _arn_tables(statement["Resource"]):
                holders.setdefault(services.get(role, role), set()).update(statement_actions(statement))
    assert set(holders) == {"queue-scheduler", "jobs-api"}
    for actions in holders.values():
        assert actions == {"dynamodb:BatchGetItem", "dynamodb:ConditionCheckItem", "dynamodb:GetItem",
                           "dynamodb:Query", "dynamodb:PutItem", "dynamodb:UpdateItem"}
