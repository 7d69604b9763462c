"""Template assertions on the synthesized stack (default and customised configuration)."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Match
from infra_synth import CLUSTER, CLUSTER_ARN, CUSTOM_TASK_ARN, Synth

from gpu_recovery import constants as c
from gpu_recovery import event_patterns as patterns
from gpu_recovery.metric_names import METRICS_NAMESPACE
from infra import REPO_ROOT as REPO
from infra.health_check import read_health_check_script

RECOVERY_HANDLERS = {
    "handlers.ecs_task_handler.lambda_handler",
    "handlers.dcgm_task_monitor.lambda_handler",
    "handlers.ecs_instance_monitor.lambda_handler",
    "handlers.recovery_sweep.lambda_handler",
}
SWEEP_HANDLER = "handlers.heartbeat_sweep.lambda_handler"
SCHEDULER_HANDLER = "handlers.queue_scheduler.lambda_handler"
HEARTBEAT_SWEEP_HANDLER = "handlers.heartbeat_sweep.lambda_handler"
# The recovery loop (4), node API (authorizer, reports, heartbeat sweep), jobs API, scheduler,
# job-control API (authorizer, routes), the gang fan-out's worker.
FUNCTION_COUNT = 13
# One per recovery function, the heartbeat sweep's, the scheduler's and the gang queue's.
DLQ_COUNT = 8
# Every-minute functions: a failed run is retried twice within 5 minutes (a throttle passes).
SCHEDULED_HANDLERS = {"handlers.recovery_sweep.lambda_handler", SWEEP_HANDLER, SCHEDULER_HANDLER}


def _table_with_key(synth: Synth, pk: str) -> dict[str, Any]:
    for resource in synth.resources("AWS::DynamoDB::Table").values():
        if resource["Properties"]["KeySchema"][0] == {"AttributeName": pk, "KeyType": "HASH"}:
            return resource
    raise AssertionError(f"no table keyed on {pk}")


def _statements(synth: Synth) -> list[dict[str, Any]]:
    out = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        out.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return out


def _policy_of_function(synth: Synth, construct: str) -> list[dict[str, Any]]:
    for logical, policy in synth.resources("AWS::IAM::Policy").items():
        if logical.startswith(f"Recovery{construct}RoleDefaultPolicy"):
            return policy["Properties"]["PolicyDocument"]["Statement"]
    raise AssertionError(construct)


def _actions(statements: list[dict[str, Any]]) -> set[str]:
    actions: set[str] = set()
    for s in statements:
        a = s["Action"]
        actions.update([a] if isinstance(a, str) else a)
    return actions


def test_tables_follow_table_definitions(default_synth: Synth) -> None:
    """Given the constants' table definitions, When synthesized, Then the job, instance and
    quota tables match them (keys, attributes, indexes and their projections: the job
    table's sparse by-holding index INCLUDEs only what the scheduler reads), on demand,
    with point-in-time recovery and AWS-managed encryption."""
    for name, pk in (("job", c.JOB_PK), ("instance", c.INSTANCE_PK), ("quota", c.QUOTA_PK)):
        definition = c.table_definitions()[name]
        props = _table_with_key(default_synth, pk)["Properties"]
        assert props["KeySchema"] == definition["KeySchema"]
        assert "TableName" not in props  # CloudFormation names the tables
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert props["SSESpecification"] == {"SSEEnabled": True}
        assert sorted(props["AttributeDefinitions"], key=lambda a: a["AttributeName"]) == sorted(
            definition["AttributeDefinitions"], key=lambda a: a["AttributeName"]
        )
        expected_gsis = definition.get("GlobalSecondaryIndexes", [])
        gsis = {g["IndexName"]: g for g in props.get("GlobalSecondaryIndexes", [])}
        assert set(gsis) == {g["IndexName"] for g in expected_gsis}
        for expected in expected_gsis:
            assert gsis[expected["IndexName"]]["KeySchema"] == expected["KeySchema"]
            assert gsis[expected["IndexName"]]["Projection"] == expected["Projection"]
    holding = {g["IndexName"]: g for g in _table_with_key(default_synth, c.JOB_PK)["Properties"][
        "GlobalSecondaryIndexes"]}[c.JOB_BY_HOLDING_INDEX]
    assert holding["Projection"]["ProjectionType"] == "INCLUDE"
    assert set(holding["Projection"]["NonKeyAttributes"]) == set(c.HOLDING_PROJECTION)


def test_tables_retained_by_default_and_deleted_on_destroy(
    default_synth: Synth, custom_synth: Synth
) -> None:
    """Given table_removal_policy default / destroy, Then DeletionPolicy is Retain / Delete."""
    for table in default_synth.resources("AWS::DynamoDB::Table").values():
        assert table["DeletionPolicy"] == "Retain"
        assert table["UpdateReplacePolicy"] == "Retain"
    for table in custom_synth.resources("AWS::DynamoDB::Table").values():
        assert table["DeletionPolicy"] == "Delete"


def test_topic_is_kms_encrypted_with_rotating_key_and_ssl_enforced(default_synth: Synth) -> None:
    """Given the alert topic, Then it uses a rotating customer key and denies non-TLS."""
    t = default_synth.assertions
    t.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    t.has_resource_properties(
        "AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [Match.any_value(), "Arn"]}}
    )
    t.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            }
        },
    )


def test_email_subscription_only_when_configured(
    default_synth: Synth, custom_synth: Synth
) -> None:
    """Given alert_email unset / set, Then there is no / one e-mail subscription."""
    default_synth.assertions.resource_count_is("AWS::SNS::Subscription", 0)
    custom_synth.assertions.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "oncall@example.com"}
    )


def test_three_rules_deploy_exactly_the_shared_patterns(default_synth: Synth) -> None:
    """Given the cluster ARN, Then the rules' patterns equal gpu_recovery.event_patterns'."""
    deployed = [
        r["Properties"]["EventPattern"]
        for r in default_synth.resources("AWS::Events::Rule").values()
        if "EventPattern" in r["Properties"]
    ]
    expected = [
        patterns.training_task_pattern(CLUSTER_ARN),
        patterns.health_check_task_pattern(CLUSTER_ARN),
        patterns.container_instance_pattern(CLUSTER_ARN),
        patterns.ec2_notice_pattern(),
        patterns.health_notice_pattern(),
    ]
    def canonical(items: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(p, sort_keys=True) for p in items)

    assert canonical(deployed) == canonical(expected)


def test_rules_target_their_handlers_with_retry_and_dlq(default_synth: Synth) -> None:
    """Given each rule, Then its single Lambda target has a DLQ; the recovery event rules
    retry 8 times for 2 h; the three schedules (recovery sweep, heartbeat sweep, scheduler
    tick), whose stale events are worthless, keep a tick 5 minutes at most."""
    functions = default_synth.resources("AWS::Lambda::Function")
    handler_by_logical = {k: v["Properties"]["Handler"] for k, v in functions.items()}
    recovery, others = [], {}
    for rule in default_synth.resources("AWS::Events::Rule").values():
        (target,) = rule["Properties"]["Targets"]
        assert "Fn::GetAtt" in target["DeadLetterConfig"]["Arn"]
        handler = handler_by_logical[target["Arn"]["Fn::GetAtt"][0]]
        if handler in RECOVERY_HANDLERS:
            recovery.append(handler)
            assert target["RetryPolicy"] == {
                "MaximumEventAgeInSeconds": 300 if handler in SCHEDULED_HANDLERS else 7200,
                "MaximumRetryAttempts": 8}
            if "ScheduleExpression" in rule["Properties"]:
                assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
                assert handler == "handlers.recovery_sweep.lambda_handler"
        else:
            others[handler] = (rule, target)
    # The instance monitor also takes AWS's notices (two more rules: EC2's and AWS Health's).
    monitor = "handlers.ecs_instance_monitor.lambda_handler"
    assert sorted(recovery) == sorted([*RECOVERY_HANDLERS, monitor, monitor])
    assert set(others) == {SWEEP_HANDLER, SCHEDULER_HANDLER}
    for rule, target in others.values():
        assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
        assert "EventPattern" not in rule["Properties"]
        # The three schedules alike: a failed delivery is retried within the tick's 5 minutes.
        assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 300, "MaximumRetryAttempts": 8}


def test_dead_letter_queues_are_encrypted_tls_only_and_alarmed(default_synth: Synth) -> None:
    """Given the eight DLQs (and the gang and tag lookup queues), Then each is SSE, TLS-only, each DLQ keeps
    messages 14 days and is alarmed to the topic."""
    every_queue = default_synth.resources("AWS::SQS::Queue")
    work = ("GangFanoutQueue", "TagLookupsQueue")
    queues = {k: q for k, q in every_queue.items() if not k.startswith(work)}
    assert len(queues) == DLQ_COUNT and len(every_queue) == DLQ_COUNT + 2
    for q in every_queue.values():
        assert q["Properties"]["SqsManagedSseEnabled"] is True
    for q in queues.values():
        assert q["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600
    policies = default_synth.resources("AWS::SQS::QueuePolicy").values()
    assert len(policies) == DLQ_COUNT + 2
    for p in policies:
        assert any(
            s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
            for s in p["Properties"]["PolicyDocument"]["Statement"]
        )
    dlq_alarms = [
        a
        for a in default_synth.resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"
    ]
    assert len(dlq_alarms) == DLQ_COUNT
    alarmed = {a["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0] for a in dlq_alarms}
    assert alarmed == set(queues)  # one alarm per queue
    for a in dlq_alarms:
        assert a["Properties"]["Threshold"] == 0
        assert a["Properties"]["ComparisonOperator"] == "GreaterThanThreshold"
        (action,) = a["Properties"]["AlarmActions"]
        assert action["Ref"].startswith("NotificationsAlertTopic")


def test_lambda_async_failures_go_to_the_dlq(default_synth: Synth) -> None:
    """Given each recovery function, the scheduler and the heartbeat sweep, Then Lambda's own
    async config retries a failure twice and then sends it to an SQS queue (2 h for recovery
    events, 5 min for the three every-minute functions: a transient failure is retried, not
    dead-lettered and paged)."""
    functions = default_synth.resources("AWS::Lambda::Function")
    configs = default_synth.resources("AWS::Lambda::EventInvokeConfig").values()
    assert len(configs) == 6
    handlers = []
    for cfg in configs:
        handler = functions[cfg["Properties"]["FunctionName"]["Ref"]]["Properties"]["Handler"]
        handlers.append(handler)
        expected_age = 300 if handler in SCHEDULED_HANDLERS else 7200
        assert cfg["Properties"]["MaximumEventAgeInSeconds"] == expected_age
        assert cfg["Properties"]["MaximumRetryAttempts"] == 2
        dest = cfg["Properties"]["DestinationConfig"]["OnFailure"]["Destination"]
        assert dest["Fn::GetAtt"][1] == "Arn"
        assert default_synth.template["Resources"][dest["Fn::GetAtt"][0]]["Type"] == (
            "AWS::SQS::Queue")
    assert sorted(handlers) == sorted(RECOVERY_HANDLERS | {SCHEDULER_HANDLER, HEARTBEAT_SWEEP_HANDLER})


def test_health_check_task_definition(default_synth: Synth) -> None:
    """Given defaults, Then the DCGM task: EC2, 8 GPUs, DCGM image, awslogs, the script."""
    (task,) = [t for t in default_synth.resources("AWS::ECS::TaskDefinition").values()
               if t["Properties"]["Family"] == c.DEFAULT_HEALTH_CHECK_FAMILY]
    props = task["Properties"]
    assert props["RequiresCompatibilities"] == ["EC2"]
    (container,) = props["ContainerDefinitions"]
    assert container["ResourceRequirements"] == [{"Type": "GPU", "Value": "8"}]
    assert container["Image"].startswith("nvcr.io/nvidia/cloud-native/dcgm:4.")
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert container["Environment"] == [{"Name": "DCGM_LEVEL", "Value": "2"}]
    assert container["Command"] == ["sh", "-c", read_health_check_script()]
    assert container["LinuxParameters"]["Capabilities"] == {"Add": ["SYS_ADMIN"]}
    assert "Privileged" not in container
    # The DCGM monitor reads the verdict line from <prefix>/<container>/<task-id> of this group.
    assert container["Name"] == c.HEALTH_CHECK_CONTAINER_NAME
    options = container["LogConfiguration"]["Options"]
    assert options["awslogs-stream-prefix"] == c.HEALTH_CHECK_LOG_STREAM_PREFIX
    monitors = [fn for fn in default_synth.resources("AWS::Lambda::Function").values()
                if fn["Properties"]["Handler"] == "handlers.dcgm_task_monitor.lambda_handler"]
    (monitor,) = monitors
    assert monitor["Properties"]["Environment"]["Variables"][c.ENV_HEALTH_CHECK_LOG_GROUP] == (
        options["awslogs-group"])
    log_groups = default_synth.resources("AWS::Logs::LogGroup")
    assert all("RetentionInDays" in g["Properties"] for g in log_groups.values())


def test_gpu_reset_task_definition(default_synth: Synth) -> None:
    """The GPU reset task: EC2, every GPU of the node, privileged (nvidia-smi -r), the
    script, its own log group; the functions know its family."""
    (task,) = [t for t in default_synth.resources("AWS::ECS::TaskDefinition").values()
               if t["Properties"]["Family"] == c.DEFAULT_GPU_RESET_FAMILY]
    (container,) = task["Properties"]["ContainerDefinitions"]
    assert container["ResourceRequirements"] == [{"Type": "GPU", "Value": "8"}]
    assert container["Privileged"] is True and "Environment" not in container
    assert container["Command"] == ["sh", "-c", (REPO / "health_check" / "gpu_reset.sh").read_text()]
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    for fn in default_synth.resources("AWS::Lambda::Function").values():
        env = fn["Properties"]["Environment"]["Variables"]
        assert env[c.ENV_GPU_RESET_TASK] == c.DEFAULT_GPU_RESET_FAMILY


def test_no_task_definition_when_own_arn_given(custom_synth: Synth) -> None:
    """Given health_check_task_arn, Then no health-check task definition is created and the
    ARN is used (the GPU reset task is the stack's own)."""
    definitions = custom_synth.resources("AWS::ECS::TaskDefinition").values()
    families = [t["Properties"]["Family"] for t in definitions]
    assert families == [c.DEFAULT_GPU_RESET_FAMILY]
    for fn in custom_synth.resources("AWS::Lambda::Function").values():
        env = fn["Properties"]["Environment"]["Variables"]
        assert env[c.ENV_HEALTH_CHECK_TASK] == CUSTOM_TASK_ARN
        assert env[c.ENV_SUSPECT_EXIT_CODES] == "[1, 134]"
        assert env[c.ENV_HEALTH_CHECK_ALL_NODES] == "true"
    assert custom_synth.template["Outputs"]["HealthCheckTaskDefinitionArn"]["Value"] == (
        CUSTOM_TASK_ARN
    )


def test_lambda_runtime_layer_tracing_and_environment(default_synth: Synth) -> None:
    """Given every function, Then runtime, layer, tracing and env vars are the shared ones."""
    functions = default_synth.resources("AWS::Lambda::Function").values()
    assert len(functions) == FUNCTION_COUNT
    services = set()
    for fn in functions:
        props = fn["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["Architectures"] == ["x86_64"]
        (layer,) = props["Layers"]  # no catalog override: the Powertools layer only
        parameter = default_synth.template["Parameters"][layer["Ref"]]
        assert parameter["Type"] == "AWS::SSM::Parameter::Value<String>"
        assert parameter["Default"].startswith("/aws/service/powertools/python/x86_64/python3.12/")
        env = props["Environment"]["Variables"]
        assert env[c.ENV_CLUSTER_NAME] == CLUSTER
        assert env[c.ENV_HEALTH_CHECK_TASK] == c.DEFAULT_HEALTH_CHECK_FAMILY
        assert env[c.ENV_MAX_RECOVERY_ATTEMPTS] == "3"  # infrastructure recoveries
        assert env[c.ENV_MAX_APP_RESTARTS] == "0"
        assert json.loads(env[c.ENV_REMEDIATION_SETTINGS])["remediation_mode"] == "enforce"
        assert env[c.ENV_RELOCATE_INSTEAD_OF_WAIT] == "false" and env[c.ENV_RELOCATION_WAIT_SECONDS] == "1800"
        assert env[c.ENV_SPARE_NODES] == "0" and env[c.ENV_LEND_SPARES] == "false"
        assert c.ENV_FAULT_CATALOG_OVERRIDE not in env
        assert env[c.ENV_SUSPECT_EXIT_CODES] == "[1]"
        assert env[c.ENV_REBOOT_TIMEOUT_MINUTES] == "30"
        assert env[c.ENV_HEALTH_CHECK_TIMEOUT_MINUTES] == "30"
        assert env[c.ENV_DCGM_LEVEL] == "2"
        assert env[c.ENV_HEALTH_CHECK_GPUS] == "8"
        assert env[c.ENV_HEALTH_CHECK_ALL_NODES] == "false"  # only the nodes whose rank failed on its own
        assert env[c.ENV_POWERTOOLS_METRICS_NAMESPACE] == METRICS_NAMESPACE
        assert env["POWERTOOLS_LOG_LEVEL"] == "INFO"
        assert env[c.ENV_JOB_TABLE]["Ref"].startswith("TablesJobTable")
        assert env[c.ENV_INSTANCE_TABLE]["Ref"].startswith("TablesInstanceTable")
        assert env[c.ENV_SNS_TOPIC_ARN]["Ref"].startswith("NotificationsAlertTopic")
        services.add(env[c.ENV_POWERTOOLS_SERVICE_NAME])
        assert "LoggingConfig" in props  # own log group with retention
    assert len(services) == FUNCTION_COUNT


def test_one_role_per_function_and_no_managed_policies(default_synth: Synth) -> None:
    """Given the functions, Then each has its own role and none uses a managed policy."""
    roles = {fn["Properties"]["Role"]["Fn::GetAtt"][0] for fn in
             default_synth.resources("AWS::Lambda::Function").values()}
    assert len(roles) == FUNCTION_COUNT
    for logical in roles:
        assert "ManagedPolicyArns" not in default_synth.template["Resources"][logical]["Properties"]


# ECS actions that support no ecs:cluster condition, with the only resource allowed.
UNCONDITIONED_ECS = {
    # Task definitions are not cluster resources (resource-level permission unsupported).
    "ecs:DescribeTaskDefinition": "*",
    # The cluster itself is the resource: exactly this cluster.
    "ecs:ListContainerInstances": CLUSTER_ARN,
}


def test_ecs_actions_are_conditioned_on_the_cluster(default_synth: Synth) -> None:
    """Given every ECS statement (except TagResource), Then ArnEquals ecs:cluster = cluster;
    only the two actions without that condition key are exempt, each on its one resource."""
    ecs_statements = []
    for s in _statements(default_synth):
        ecs_actions = {a for a in _actions([s]) if a.startswith("ecs:")}
        if not ecs_actions or s["Action"] == "ecs:TagResource":
            continue
        if ecs_actions & UNCONDITIONED_ECS.keys():
            (action,) = ecs_actions  # never mixed with cluster-conditioned ECS actions
            assert s["Resource"] == UNCONDITIONED_ECS[action]
            assert "Condition" not in s
            continue
        ecs_statements.append(s)
    assert ecs_statements
    for s in ecs_statements:
        assert s["Condition"] == {"ArnEquals": {"ecs:cluster": CLUSTER_ARN}}
        for resource in [s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"]:
            if resource == "*":  # a ListTasks naming no container instance is authorized on * (issue 40)
                assert _actions([s]) == {"ecs:ListTasks"}
                continue
            assert f"/{CLUSTER}/" in resource or ":task-definition/" in resource
    tag = [s for s in _statements(default_synth) if s["Action"] == "ecs:TagResource"]
    assert tag and all(
        s["Condition"] == {"StringEquals": {"ecs:CreateAction": "StartTask"}} for s in tag
    )
    passrole = [s for s in _statements(default_synth) if s["Action"] == "iam:PassRole"]
    assert passrole and all(
        s["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}
        for s in passrole
    )


def test_reboot_and_ssm_are_limited_to_tagged_instances(
    default_synth: Synth, custom_synth: Synth
) -> None:
    """Given the DCGM monitor, Then reboot / SSM need the instance tag, and SendCommand is
    granted on the stack's reboot-only document, never on AWS-RunShellScript."""
    for synth, key, value in (
        (default_synth, "gpu-recovery:cluster", CLUSTER),
        (custom_synth, "team", "ml-platform"),
    ):
        statements = _policy_of_function(synth, "DcgmMonitor")
        (reboot,) = [s for s in statements if s["Action"] == "ec2:RebootInstances"]
        assert reboot["Condition"] == {"StringEquals": {f"aws:ResourceTag/{key}": value}}
        assert reboot["Resource"].endswith(":instance/*")
        ssm = [s for s in statements if s["Action"] == "ssm:SendCommand"]
        (document,) = [s for s in ssm if s["Sid"] == "SendRebootDocument"]
        (doc_id,) = synth.resources("AWS::SSM::Document")
        assert document["Resource"] == {"Fn::Join": ["", [
            "arn:aws:ssm:us-east-1:111122223333:document/", {"Ref": doc_id}]]}
        assert "Condition" not in document
        (managed,) = [s for s in ssm if s["Sid"] == "SendCommandToTaggedManagedInstances"]
        assert managed["Resource"].endswith(":managed-instance/*")
        assert managed["Condition"] == {"StringEquals": {f"aws:ResourceTag/{key}": value}}
        assert "AWS-RunShellScript" not in json.dumps(synth.template)
        assert not [s for s in statements if "ec2:DescribeInstances" in s["Action"]]  # no code path needs it


NODE_ACTIONS = {"ec2:RebootInstances", "ssm:SendCommand", "ecs:UpdateContainerInstancesState"}


def test_each_function_gets_only_what_it_needs(default_synth: Synth) -> None:
    """Given the four roles, Then node actions (reboot, SSM, drain) only for the stages that
    carry them out: the task handler (a definitive fault, without the diag), the DCGM
    monitor (verdicts) and the sweep (what a delivery left undone, the breaker's released
    backlog); never for the instance monitor (it stops a job's tasks only to move it off a
    node AWS announced it takes). The health-check log only for the monitor and
    the sweep (issue 49: a check whose STOPPED event was lost has its verdict line read).
    Auto Scaling only with replace_action terminate_in_asg."""
    task = _actions(_policy_of_function(default_synth, "TaskHandler"))
    monitor = _actions(_policy_of_function(default_synth, "DcgmMonitor"))
    instance = _actions(_policy_of_function(default_synth, "InstanceMonitor"))
    sweep = _actions(_policy_of_function(default_synth, "RecoverySweep"))
    assert {"ecs:StartTask", "ecs:StopTask", "ecs:DescribeTasks", "ecs:ListTasks"} <= task
    assert "logs:GetLogEvents" in monitor and "logs:GetLogEvents" in sweep
    for actions in (task, monitor, sweep):
        assert NODE_ACTIONS | {"ecs:ListContainerInstances"} <= actions
    # The instance monitor stops tasks only to move a job with no control channel off a node a
    # Spot warning names (two minutes: docs/aws-notices.md); it takes no node action.
    assert {"ecs:StartTask", "ecs:StopTask"} <= instance
    assert not (NODE_ACTIONS & instance)
    for actions in (task, instance):
        assert "logs:GetLogEvents" not in actions
    for actions in (task, monitor, instance, sweep):
        assert {"sns:Publish", "dynamodb:PutItem", "dynamodb:Query"} <= actions
        assert not any(a.endswith("*") for a in actions)
        assert not any(a.startswith("autoscaling:") for a in actions)


CORDON = {"ecs:PutAttributes", "ecs:DeleteAttributes"}


def _policies_starting(synth: Synth, prefix: str) -> list[dict[str, Any]]:
    found = [p["Properties"]["PolicyDocument"]["Statement"]
             for logical, p in synth.resources("AWS::IAM::Policy").items() if logical.startswith(prefix)]
    assert len(found) == 1, prefix
    return found[0]


def test_the_placement_attribute_is_granted_on_the_clusters_container_instances_only(
        default_synth: Synth) -> None:
    """Given the functions that find a node bad or healthy, or whose recovery steps reserve
    or release a job's nodes (every function running the recovery loop: a fault entering
    recovery reserves its job's nodes, a restart placed releases them; the job-control API,
    whose preflight handover reserves them too), Then they may put
    and delete the placement attribute (PutAttributes / DeleteAttributes), only on container
    instances of the cluster; nothing else gets them."""
    cluster = {"ArnEquals": {"ecs:cluster": CLUSTER_ARN}}
    both = {name: _policy_of_function(default_synth, name)
            for name in ("TaskHandler", "DcgmMonitor", "RecoverySweep", "InstanceMonitor")}
    both["HeartbeatSweep"] = _policies_starting(default_synth, "NodeApiHeartbeatSweepRoleDefaultPolicy")
    both["TagLookupWorker"] = _policies_starting(default_synth, "TagLookupsWorkerRoleDefaultPolicy")
    both["NodeApi"] = _policies_starting(default_synth, "NodeApiNodeApiFunctionRoleDefaultPolicy")
    both["GangWorker"] = _policies_starting(default_synth, "GangFanoutWorkerRoleDefaultPolicy")
    # The preflight's handover reserves the job's nodes as a fault does (issue 49).
    both["JobControlApi"] = _policies_starting(default_synth, "JobControlApiFunctionRoleDefaultPolicy")
    for name, statements in both.items():
        granted = [s for s in statements if _actions([s]) & CORDON]
        assert len(granted) == 1, name
        (statement,) = granted
        assert _actions([statement]) == CORDON, name
        assert statement["Condition"] == cluster, name
        assert ":container-instance/" in json.dumps(statement["Resource"]), name
    others = [logical for logical, p in default_synth.resources("AWS::IAM::Policy").items()
              if _actions(p["Properties"]["PolicyDocument"]["Statement"]) & CORDON]
    assert len(others) == len(both)


def test_terminate_in_asg_only_in_groups_tagged_with_the_cluster(custom_synth: Synth) -> None:
    """Given replace_action terminate_in_asg, Then the stages that replace nodes may
    TerminateInstanceInAutoScalingGroup, only in Auto Scaling groups carrying the cluster
    tag; DescribeAutoScalingInstances (no resource-level permission) on '*'."""
    for construct in ("TaskHandler", "DcgmMonitor", "RecoverySweep"):
        statements = _policy_of_function(custom_synth, construct)
        (terminate,) = [s for s in statements
                        if s["Action"] == "autoscaling:TerminateInstanceInAutoScalingGroup"]
        assert terminate["Condition"] == {"StringEquals": {"aws:ResourceTag/team": "ml-platform"}}
        assert ":autoScalingGroup:*:autoScalingGroupName/*" in json.dumps(terminate["Resource"])
        (describe,) = [s for s in statements if s["Action"] == "autoscaling:DescribeAutoScalingInstances"]
        assert describe["Resource"] == "*"
    assert not any(a.startswith("autoscaling:") for a in
                   _actions(_policy_of_function(custom_synth, "InstanceMonitor")))


def test_remediation_settings_and_the_catalog_override_reach_every_function(custom_synth: Synth) -> None:
    """Given a catalog override file (YAML) and remediation options, Then every function gets
    the validated override in a layer (and its path) and the settings in REMEDIATION_SETTINGS."""
    (layer,) = custom_synth.resources("AWS::Lambda::LayerVersion").values()
    assert "fault-catalog override" in layer["Properties"]["Description"]
    functions = custom_synth.resources("AWS::Lambda::Function").values()
    for fn in functions:
        props = fn["Properties"]
        assert len(props["Layers"]) == 2
        env = props["Environment"]["Variables"]
        assert env[c.ENV_FAULT_CATALOG_OVERRIDE] == "/opt/fault-catalog/override.json"
        settings = json.loads(env[c.ENV_REMEDIATION_SETTINGS])
        assert settings["replace_action"] == "terminate_in_asg"
        assert settings["remediation_mode"] == "enforce,reboot=observe"
        assert settings["breaker_max_nodes"] == "4"
        assert env[c.ENV_MAX_APP_RESTARTS] == "1" and env[c.ENV_RELOCATE_INSTEAD_OF_WAIT] == "true"


def _table_arns(resource: Any) -> list[tuple[str, str]]:
    """(table logical id, suffix) of each resource: ``""`` or ``"/index/<name>"``."""
    out = []
    for item in resource if isinstance(resource, list) else [resource]:
        if "Fn::GetAtt" in item:
            out.append((item["Fn::GetAtt"][0], ""))
        else:
            (att, suffix) = item["Fn::Join"][1]
            out.append((att["Fn::GetAtt"][0], suffix))
    return out


def test_dynamodb_access_is_tables_and_named_indexes_only(default_synth: Synth) -> None:
    """Given the DynamoDB write statements, Then resources are whole tables of the stack
    and, for each job / instance table granted, exactly all of its named indexes."""
    tables = default_synth.resources("AWS::DynamoDB::Table")
    gsis_by_pk = {
        c.table_definitions()[name]["KeySchema"][0]["AttributeName"]: {
            g["IndexName"] for g in c.table_definitions()[name].get("GlobalSecondaryIndexes", [])
        }
        for name in ("job", "instance", "quota")
    }
    writers = 0
    for s in _statements(default_synth):
        if "dynamodb:PutItem" not in _actions([s]):
            continue
        writers += 1
        assert "index/*" not in json.dumps(s["Resource"])
        granted: dict[str, set[str]] = {}
        for logical, suffix in _table_arns(s["Resource"]):
            assert logical in tables
            granted.setdefault(logical, set())
            if suffix:
                assert suffix.startswith("/index/")
                granted[logical].add(suffix.removeprefix("/index/"))
        for logical, indexes in granted.items():
            pk = tables[logical]["Properties"]["KeySchema"][0]["AttributeName"]
            assert indexes == gsis_by_pk.get(pk, set()), (logical, indexes)
    assert writers >= FUNCTION_COUNT - 2  # every function but the two authorizers writes


def test_outputs_and_dashboard(default_synth: Synth) -> None:
    """Given the stack, Then outputs and the dashboard with the business metrics exist."""
    outputs = default_synth.template["Outputs"]
    for key in ("JobTableName", "InstanceTableName", "AlertTopicArn",
                "HealthCheckTaskDefinitionArn", "TaskHandlerDeadLetterQueueUrl",
                "DcgmMonitorDeadLetterQueueUrl", "InstanceMonitorDeadLetterQueueUrl",
                "RecoverySweepDeadLetterQueueUrl", "HeartbeatSweepDeadLetterQueueUrl",
                "QueueSchedulerDeadLetterQueueUrl", "ApiUrl", "NodeTokenTableName",
                "IdempotencyTableName", "QuotaTableName", "SchedulerFunctionName", "ClusterName",
                "InstanceTagKey",
                "InstanceTagValue", "PowertoolsVersion", "PowertoolsLayerArn",
                "TaskHandlerRuleName", "DcgmMonitorRuleName", "InstanceMonitorRuleName",
                "RecoverySweepRuleName", "HeartbeatSweepRuleName", "QueueSchedulerRuleName",
                "GangQueueUrl", "GangWorkerDeadLetterQueueUrl", "GangWorkerFunctionName"):
        assert key in outputs
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in ("FaultsDetected", "HealthChecksStarted", "Reboots", "Recoveries",
                   "Failures", "TimeToRestartSeconds", "Quarantines", "BreakerOpen",
                   "BreakerTripped", "SuspendsRequested", "SuspendsForced", "JobsSuspended",
                   METRICS_NAMESPACE,
                   "ApproximateNumberOfMessagesVisible", "Errors", "Duration",
                   "AWS/ApiGateway", "5XXError", "4XXError", "Latency"):
        assert metric in body
    functions = default_synth.resources("AWS::Lambda::Function")
    error_alarms = [a for a in default_synth.resources("AWS::CloudWatch::Alarm").values()
                    if a["Properties"].get("MetricName") == "Errors"]
    assert len(error_alarms) == FUNCTION_COUNT
    alarmed = {a["Properties"]["Dimensions"][0]["Value"]["Ref"] for a in error_alarms}
    assert alarmed == set(functions)  # one error alarm per function
    for a in error_alarms:
        (action,) = a["Properties"]["AlarmActions"]
        assert action["Ref"].startswith("NotificationsAlertTopic")


def test_no_recovery_function_outlives_a_claim_lease(default_synth: Synth) -> None:
    """A claim (health-check start, reboot call, rank launch) older than its lease belongs to
    an invocation that died; that holds only if no recovery function runs longer."""
    from gpu_recovery.constants import CLAIM_LEASE_SECONDS, RECOVERY_FUNCTION_TIMEOUT_SECONDS

    prefixes = ("handlers.ecs_", "handlers.dcgm_", "handlers.recovery_sweep", "handlers.heartbeat_sweep",
                "handlers.gang_worker")  # the worker claims rank launches
    recovery = [r for r in default_synth.template["Resources"].values()
                if r["Type"] == "AWS::Lambda::Function"
                and str(r["Properties"].get("Handler", "")).startswith(prefixes)]
    assert len(recovery) >= 5
    for function in recovery:
        assert function["Properties"]["Timeout"] <= RECOVERY_FUNCTION_TIMEOUT_SECONDS < CLAIM_LEASE_SECONDS
