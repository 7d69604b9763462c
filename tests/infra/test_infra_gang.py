"""Large jobs (issue 18): the gang fan-out queue and its worker, who may send to it, the
ECS control-plane budget's item, and the settings every function gets."""

from __future__ import annotations

import json
from typing import Any

from infra_synth import CLUSTER_ARN, Synth, statement_actions, statement_resources

from gpu_recovery import constants as c
from gpu_recovery.settings import JobsApiSettings, Settings
from infra.config import RecoveryConfig
from infra.stack import large_jobs_environment
from local_mode.sim import deployment

WORKER = "gang-worker"
# Every function that may stop or start a gang: the recovery loop, the node API and the
# heartbeat sweep (lost nodes), go_suspend, the scheduler's preemption, a large job's cancel,
# and the worker's own continuations.
SENDERS = {"ecs-task-handler", "dcgm-task-monitor", "ecs-instance-monitor", "recovery-sweep", "node-api",
           "heartbeat-sweep", "job-control-api", "queue-scheduler", "jobs-api", WORKER,
           "tag-lookup-worker"}  # handles STOPPED events of tag-registered ranks
# Functions that call StartTask / StopTask read no other instance item than the budget's.
# The job-control API is not among them since issue 49: the preflight handover fences the pinned
# nodes and reserves the job's nodes (instance-table items) in its own invocation.
BUDGET_ONLY = {"jobs-api"}
LARGE_JOB_ENV = (c.ENV_GANG_QUEUE_URL, c.ENV_ECS_API_RATE, c.ENV_ECS_API_BURST, c.ENV_BATCH_IDENTICAL_STARTS,
                 c.ENV_MAX_HEALTH_CHECKS_PER_JOB, c.ENV_MAX_HEALTH_CHECKS_IN_FLIGHT,
                 c.ENV_GANG_INLINE_MAX_RANKS)


def _one(synth: Synth, type_name: str, prefix: str) -> tuple[str, dict[str, Any]]:
    (found,) = [(k, v) for k, v in synth.resources(type_name).items() if k.startswith(prefix)]
    return found


def _functions_by_service(synth: Synth) -> dict[str, dict[str, Any]]:
    return {fn["Properties"]["Environment"]["Variables"][c.ENV_POWERTOOLS_SERVICE_NAME]: fn
            for fn in synth.resources("AWS::Lambda::Function").values()}


def _statements_by_service(synth: Synth) -> dict[str, list[dict[str, Any]]]:
    services = {fn["Properties"]["Role"]["Fn::GetAtt"][0]: name
                for name, fn in _functions_by_service(synth).items()}
    found: dict[str, list[dict[str, Any]]] = {}
    for policy in synth.resources("AWS::IAM::Policy").values():
        for role in policy["Properties"]["Roles"]:
            if role["Ref"] in services:
                found.setdefault(services[role["Ref"]], []).extend(
                    policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def test_the_gang_queue_and_its_dead_letter_queue(default_synth: Synth) -> None:
    """Given the gang queue, Then it is SSE and TLS-only, its visibility timeout is 6x the
    worker's timeout (AWS's advice for Lambda event sources) as local mode assumes, and a
    batch received 5 times goes to a 14-day DLQ."""
    queue_id, queue = _one(default_synth, "AWS::SQS::Queue", "GangFanoutQueue")
    dlq_id, dlq = _one(default_synth, "AWS::SQS::Queue", "GangFanoutDlq")
    _, worker = _one(default_synth, "AWS::Lambda::Function", "GangFanoutWorkerFunction")
    props = queue["Properties"]
    assert props["SqsManagedSseEnabled"] is True
    assert props["VisibilityTimeout"] == 6 * worker["Properties"]["Timeout"]
    assert props["VisibilityTimeout"] == c.GANG_QUEUE_VISIBILITY_TIMEOUT_SECONDS
    assert props["VisibilityTimeout"] == deployment.GANG_QUEUE.visibility_timeout_seconds
    assert props["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]},
                                      "maxReceiveCount": c.GANG_QUEUE_MAX_RECEIVES}
    assert c.GANG_QUEUE_MAX_RECEIVES == deployment.GANG_QUEUE.max_receives == 5
    assert dlq["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert dlq["Properties"]["SqsManagedSseEnabled"] is True
    policies = default_synth.resources("AWS::SQS::QueuePolicy").values()
    tls_only = {p["Properties"]["Queues"][0]["Ref"] for p in policies
                if any(s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
                       and s["Effect"] == "Deny" for s in p["Properties"]["PolicyDocument"]["Statement"])}
    assert {queue_id, dlq_id} <= tls_only


def test_the_worker_and_its_event_source(default_synth: Synth, custom_synth: Synth) -> None:
    """Given the worker, Then it runs the gang_worker handler within a claim's lease (a start
    batch claims rank launches for CLAIM_LEASE_SECONDS), one batch per invocation, with
    partial batch responses, at most gang_worker_concurrency at once; the mapping is created
    after the role's policy (Lambda checks the permissions on the queue then)."""
    for synth, concurrency in ((default_synth, 8), (custom_synth, 6)):
        worker_id, worker = _one(synth, "AWS::Lambda::Function", "GangFanoutWorkerFunction")
        assert worker["Properties"]["Handler"] == "handlers.gang_worker.lambda_handler"
        assert worker["Properties"]["Timeout"] == c.GANG_WORKER_TIMEOUT_SECONDS < c.CLAIM_LEASE_SECONDS
        (mapping,) = [m for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
                      if m["Properties"]["FunctionName"] == {"Ref": worker_id}]
        queue_id, _ = _one(synth, "AWS::SQS::Queue", "GangFanoutQueue")
        props = mapping["Properties"]
        assert props["FunctionName"] == {"Ref": worker_id}
        assert props["EventSourceArn"] == {"Fn::GetAtt": [queue_id, "Arn"]}
        assert props["BatchSize"] == 1
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert props["ScalingConfig"] == {"MaximumConcurrency": concurrency}
        policy_id, _ = _one(synth, "AWS::IAM::Policy", "GangFanoutWorkerRoleDefaultPolicy")
        assert policy_id in mapping["DependsOn"]


def test_the_worker_gets_only_what_a_batch_needs(default_synth: Synth) -> None:
    """Given the worker's role, Then ECS start / stop / describe / list tasks and describe /
    list container instances in the cluster, PassRole to ECS tasks only, the job and instance
    tables (every index by name), the alert topic, and on its own queue only: receive /
    delete / attributes (the event source) and send (the rest of a batch, sent back); the
    placement attribute on the cluster's container instances (a restart it places releases
    the job's reserved nodes, issue 41). Nothing that touches a node (reboot, SSM, drain,
    Auto Scaling), no other queue."""
    statements = _statements_by_service(default_synth)[WORKER]
    actions = set().union(*(statement_actions(s) for s in statements))
    assert {a for a in actions if a.startswith("ecs:")} == {
        "ecs:StartTask", "ecs:TagResource", "ecs:StopTask", "ecs:DescribeTasks", "ecs:ListTasks",
        "ecs:DescribeContainerInstances", "ecs:ListContainerInstances", "ecs:PutAttributes",
        "ecs:DeleteAttributes"}
    assert not {a for a in actions if a.startswith(("ec2:", "ssm:", "autoscaling:", "lambda:", "logs:Get"))}
    assert "ecs:UpdateContainerInstancesState" not in actions
    for s in statements:
        if statement_actions(s) & {"ecs:StartTask", "ecs:StopTask", "ecs:DescribeTasks", "ecs:ListTasks",
                          "ecs:DescribeContainerInstances"}:
            assert s["Condition"] == {"ArnEquals": {"ecs:cluster": CLUSTER_ARN}}
        if "ecs:ListContainerInstances" in statement_actions(s):
            assert s["Resource"] == CLUSTER_ARN
        if "iam:PassRole" in statement_actions(s):
            assert s["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}
    queue_id, _ = _one(default_synth, "AWS::SQS::Queue", "GangFanoutQueue")
    sqs = [s for s in statements if any(a.startswith("sqs:") for a in statement_actions(s))]
    assert {frozenset(statement_actions(s)) for s in sqs} == {
        frozenset({"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes",
                   "sqs:ChangeMessageVisibility"}),
        frozenset({"sqs:SendMessage"})}
    assert all(s["Resource"] == {"Fn::GetAtt": [queue_id, "Arn"]} for s in sqs)
    tables = json.dumps([s["Resource"] for s in statements if "dynamodb:PutItem" in statement_actions(s)])
    for index in [g["IndexName"] for name in ("job", "instance")
                  for g in c.table_definitions()[name]["GlobalSecondaryIndexes"]]:
        assert f"/index/{index}" in tables, index
    assert "TablesQuotaTable" not in tables
    assert "sns:Publish" in actions


def test_exactly_the_gang_stoppers_may_send_to_the_gang_queue_and_nowhere_else(default_synth: Synth) -> None:
    """Pinned: sqs:SendMessage on the gang queue belongs to exactly the functions that may stop
    or start a gang, each with the queue's ARN as its one resource; no statement of the stack
    grants an SQS action on a wildcard."""
    queue_id, _ = _one(default_synth, "AWS::SQS::Queue", "GangFanoutQueue")
    queue_arn = {"Fn::GetAtt": [queue_id, "Arn"]}
    senders = set()
    for service, statements in _statements_by_service(default_synth).items():
        for s in statements:
            sqs_actions = {a for a in statement_actions(s) if a.startswith("sqs:")}
            assert not any(a.endswith("*") for a in sqs_actions)
            if not sqs_actions:
                continue
            assert all(r != "*" and "*" not in json.dumps(r) for r in statement_resources(s)), (service, s)
            if queue_arn in statement_resources(s) and "sqs:SendMessage" in sqs_actions:
                assert statement_resources(s) == [queue_arn] and sqs_actions == {"sqs:SendMessage"}, service
                senders.add(service)
    assert senders == SENDERS


def test_every_function_gets_the_large_job_settings(default_synth: Synth, custom_synth: Synth) -> None:
    """Given every function, Then the gang queue's URL, the ECS budget, grouped starts and the
    health-check limits are in its environment, as the config says."""
    queue_id, _ = _one(default_synth, "AWS::SQS::Queue", "GangFanoutQueue")
    expected = [
        (default_synth, ("36", "90", "true", "2048", "2048")),
        (custom_synth, ("18.5", "40", "false", "16", "64")),
    ]
    for synth, (rate, burst, grouped, per_job, in_flight) in expected:
        for service, fn in _functions_by_service(synth).items():
            env = fn["Properties"]["Environment"]["Variables"]
            assert env[c.ENV_GANG_QUEUE_URL] == {"Ref": queue_id}, service
            assert (env[c.ENV_ECS_API_RATE], env[c.ENV_ECS_API_BURST], env[c.ENV_BATCH_IDENTICAL_STARTS],
                    env[c.ENV_MAX_HEALTH_CHECKS_PER_JOB], env[c.ENV_MAX_HEALTH_CHECKS_IN_FLIGHT]) == (
                rate, burst, grouped, per_job, in_flight), service
            assert env[c.ENV_INSTANCE_TABLE]["Ref"].startswith("TablesInstanceTable"), service
            assert env[c.ENV_GANG_INLINE_MAX_RANKS] == "16", service


def test_the_environment_the_stack_writes_is_what_the_functions_read() -> None:
    """Given a config, When its large-job environment is read by the functions' own settings
    parsers, Then every value arrives as configured (nothing lost in the text)."""
    config = RecoveryConfig.from_context({
        "cluster_name": "c", "ecs_api_rate_per_second": "0.5", "ecs_api_burst": "7",
        "max_health_checks_per_job": "3", "max_health_checks_in_flight": "9", "batch_identical_starts": "no",
        "gang_inline_max_ranks": "0"})
    env = {c.ENV_JOB_TABLE: "jobs", c.ENV_INSTANCE_TABLE: "instances", c.ENV_CLUSTER_NAME: "c",
           **large_jobs_environment(config, "https://sqs.us-east-1.amazonaws.com/1/gang")}
    assert set(LARGE_JOB_ENV) <= set(env)
    settings = Settings.from_env(env)
    assert settings.gang_queue_url == "https://sqs.us-east-1.amazonaws.com/1/gang"
    assert (settings.ecs_api.rate, settings.ecs_api.burst) == (0.5, 7)
    assert settings.batch_identical_starts is False
    assert (settings.max_health_checks_per_job, settings.max_health_checks_in_flight) == (3, 9)
    assert JobsApiSettings.from_env(env).gang_queue_url == settings.gang_queue_url
    # 0: every gang through the queue, a cancel's stops too
    assert settings.gang_inline_max_ranks == JobsApiSettings.from_env(env).gang_inline_max_ranks == 0


def test_every_ecs_caller_can_reach_the_budget_item_and_no_more_than_it_needs(default_synth: Synth) -> None:
    """Given every function that calls StartTask or StopTask, Then it may GetItem and UpdateItem
    the instance table (the budget's item); the jobs and job-control APIs, which read no other
    instance item, exactly that one key (dynamodb:LeadingKeys), on the table only."""
    instance_id, _ = _one(default_synth, "AWS::DynamoDB::Table", "TablesInstanceTable")
    instance_arn = {"Fn::GetAtt": [instance_id, "Arn"]}
    callers = set()
    for service, statements in _statements_by_service(default_synth).items():
        actions = set().union(*(statement_actions(s) for s in statements))
        if not actions & {"ecs:StartTask", "ecs:StopTask"}:
            continue
        callers.add(service)
        on_instance = [s for s in statements if instance_arn in statement_resources(s)]
        reachable = set().union(*(statement_actions(s) for s in on_instance)) if on_instance else set()
        assert {"dynamodb:GetItem", "dynamodb:UpdateItem"} <= reachable, service
        if service in BUDGET_ONLY:
            # The job-control API also judges the gang preflight: its baselines' items, and no other.
            baselines = [s for s in on_instance if s.get("Sid") == "PreflightBaselineItems"]
            if baselines:
                assert service == "job-control-api"
                assert baselines[0]["Condition"] == {"ForAllValues:StringLike": {
                    "dynamodb:LeadingKeys": [f"{c.PREFLIGHT_BASELINE_PREFIX}*"]}}
                assert statement_resources(baselines[0]) == [instance_arn]
            (budget,) = [s for s in on_instance if s not in baselines]
            assert budget["Sid"] == "EcsCallBudgetItem"
            assert statement_actions(budget) == {"dynamodb:GetItem", "dynamodb:UpdateItem"}
            assert statement_resources(budget) == [instance_arn]  # the table, no index
            assert budget["Condition"] == {
                "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [c.ECS_RATE_ITEM_KEY,
                                                                       c.ECS_DESCRIBE_RATE_ITEM_KEY]}}
            assert instance_id not in json.dumps([s["Resource"] for s in statements
                                                  if s is not budget and s not in baselines])
    assert callers == SENDERS  # whoever calls ECS may also stop a gang, and the other way round


def test_the_gang_outputs_name_the_queue_its_dlq_and_its_worker(default_synth: Synth) -> None:
    outputs = default_synth.template["Outputs"]
    queue_id, _ = _one(default_synth, "AWS::SQS::Queue", "GangFanoutQueue")
    dlq_id, _ = _one(default_synth, "AWS::SQS::Queue", "GangFanoutDlq")
    worker_id, _ = _one(default_synth, "AWS::Lambda::Function", "GangFanoutWorkerFunction")
    assert outputs["GangQueueUrl"]["Value"] == {"Ref": queue_id}
    assert outputs["GangWorkerDeadLetterQueueUrl"]["Value"] == {"Ref": dlq_id}
    assert outputs["GangWorkerFunctionName"]["Value"] == {"Ref": worker_id}
