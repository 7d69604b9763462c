"""The QueueScheduler construct synthesizes cleanly under cdk-nag, least privilege."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

ACCOUNT, REGION, CLUSTER = "111122223333", "us-east-1", "gpu-cluster"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from infra.config import RecoveryConfig
    from infra.lambda_common import LambdaDefaults
    from infra.nag import add_nag_checks, read_findings
    from infra.notifications import Notifications
    from infra.recovery import ClusterAccess
    from infra.scheduler import QueueScheduler
    from infra.tables import RecoveryTables

    outdir: Path = tmp_path_factory.mktemp("cdk-scheduler")
    app = cdk.App(outdir=str(outdir))
    add_nag_checks(app)
    stack = cdk.Stack(app, "SchedulerOnly", env=cdk.Environment(account=ACCOUNT, region=REGION))
    config = RecoveryConfig(cluster_name=CLUSTER, instance_tag_value=CLUSTER)
    tables = RecoveryTables(stack, "Tables", removal_policy="destroy")
    notifications = Notifications(stack, "Notifications", alert_email=None)
    defaults = LambdaDefaults(config=config, environment={"ECS_CLUSTER_NAME": CLUSTER})
    scheduler = QueueScheduler(
        stack, "QueueScheduler", job_table=tables.job_table, instance_table=tables.instance_table,
        cluster_name=CLUSTER, defaults=defaults, access=ClusterAccess(stack, config),
        topic=notifications.topic, quota_table=tables.quota_table,
        extra_environment={"QUOTA_TABLE_NAME": tables.quota_table.table_name,
                           "JOB_CONTROL_API_URL": "https://api.example/prod/"},
    )
    assert scheduler.function is not None
    app.synth()  # raises on any unacknowledged cdk-nag finding
    assert read_findings(outdir) == []
    return json.loads((outdir / "SchedulerOnly.template.json").read_text())


def resources(template: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in template["Resources"].values() if r["Type"] == kind]


def test_function_has_reserved_concurrency_one_and_a_timeout_below_the_lease(template):
    """Given the synthesized construct
    When the scheduler function is inspected
    Then it runs one tick at a time, with a timeout shorter than the 120 s lease, and a tick's
    time budget the function's settings accept (at least admission's and an entry's margins)."""
    from gpu_recovery.settings import SchedulerConfig

    [fn] = [f for f in resources(template, "AWS::Lambda::Function")
            if f["Properties"]["Handler"] == "handlers.queue_scheduler.lambda_handler"]
    assert fn["Properties"]["ReservedConcurrentExecutions"] == 1
    assert fn["Properties"]["Timeout"] < 120
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["SCHEDULER_LEASE_SECONDS"] == "120"
    budget = {"SCHEDULER_TIME_BUDGET_SECONDS": env["SCHEDULER_TIME_BUDGET_SECONDS"]}
    assert SchedulerConfig.from_env(budget).time_budget_seconds == 60.0


def test_ticks_every_minute_with_a_dead_letter_queue(template):
    """Given the synthesized construct
    When its EventBridge rule is inspected
    Then it fires rate(1 minute) into the function with a DLQ and bounded retries."""
    [rule] = resources(template, "AWS::Events::Rule")
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    [target] = rule["Properties"]["Targets"]
    assert "DeadLetterConfig" in target and target["RetryPolicy"]["MaximumEventAgeInSeconds"] == 300


def test_least_privilege_policy(template):
    """Given the synthesized construct
    When the scheduler role's policy is inspected
    Then ECS actions are conditioned on the cluster, PassRole only to ecs-tasks, no Scan."""
    statements = [s for p in resources(template, "AWS::IAM::Policy")
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    by_sid = {s.get("Sid"): s for s in statements if s.get("Sid")}
    for sid in ("StartTaskInCluster", "StopTaskInCluster", "ListTasksInCluster",
                "DescribeContainerInstancesInCluster"):
        assert "ecs:cluster" in json.dumps(by_sid[sid]["Condition"])
    assert by_sid["PassTaskRolesToEcs"]["Condition"]["StringEquals"]["iam:PassedToService"] == \
        "ecs-tasks.amazonaws.com"
    assert by_sid["TagTasksOnStart"]["Condition"]["StringEquals"]["ecs:CreateAction"] == "StartTask"
    actions = json.dumps([s["Action"] for s in statements])
    assert "dynamodb:Scan" not in actions and "dynamodb:DeleteItem" not in actions
    assert "ecs:ListContainerInstances" in actions and "ecs:DescribeTaskDefinition" in actions


def test_time_sharing_environment_and_quota_table_access(template):
    """Given a quota table and the time-sharing environment
    When the scheduler is synthesized
    Then it carries that environment and has the data actions (no Scan, BatchWrite or Delete)
    on the quota table, and on every index of the job table, the sparse by-holding one
    included (quota releases, demotion, preemption victims)."""
    [fn] = [f for f in resources(template, "AWS::Lambda::Function")
            if f["Properties"]["Handler"] == "handlers.queue_scheduler.lambda_handler"]
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["JOB_CONTROL_API_URL"] == "https://api.example/prod/"
    [quota_id] = [k for k, r in template["Resources"].items()
                  if r["Type"] == "AWS::DynamoDB::Table" and k.startswith("TablesQuotaTable")]
    assert env["QUOTA_TABLE_NAME"] == {"Ref": quota_id}
    statements = [s for p in resources(template, "AWS::IAM::Policy")
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    by_sid = {s.get("Sid"): s for s in statements if s.get("Sid")}
    quota = by_sid["QuotaTableData"]
    assert quota["Resource"] == {"Fn::GetAtt": [quota_id, "Arn"]}
    assert {"dynamodb:UpdateItem", "dynamodb:ConditionCheckItem", "dynamodb:GetItem",
            "dynamodb:Query"} <= set(quota["Action"])
    assert not {"dynamodb:Scan", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"} & set(quota["Action"])
    assert "/index/by-holding" in json.dumps(by_sid["JobTableData"]["Resource"])
