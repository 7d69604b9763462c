"""The whole product in one stack: REST API (node + jobs routes), scheduler, node agent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from infra_synth import CLUSTER, Synth

from gpu_recovery import constants as c
from infra.api import NODE_ROUTES, NodeApi
from infra.node_agent import NodeAgentDaemon
from infra.queue_api import ROUTES, SWAGGER_ROUTE, JobQueueApi
from infra.scheduler import QueueScheduler

SWEEP_HANDLER = "handlers.heartbeat_sweep.lambda_handler"
SCHEDULER_HANDLER = "handlers.queue_scheduler.lambda_handler"
JOBS_HANDLER = "handlers.jobs_api.lambda_handler"
AUTHORIZER_HANDLER = "handlers.node_authorizer.lambda_handler"
NODE_API_HANDLER = "handlers.node_api.lambda_handler"
IAM_ROUTES = {f"{m} /{path}" for m, path in (*ROUTES, SWAGGER_ROUTE)}
NODE_ROUTE_KEYS = {f"POST /v1/{route}" for route in NODE_ROUTES}


def _path(synth: Synth, resource_id: Any) -> str:
    resources, parts, ref = synth.template["Resources"], [], resource_id
    while isinstance(ref, dict) and resources.get(ref.get("Ref"), {}).get("Type") == (
        "AWS::ApiGateway::Resource"
    ):
        props = resources[ref["Ref"]]["Properties"]
        parts.append(props["PathPart"])
        ref = props["ParentId"]
    return "/" + "/".join(reversed(parts))


def _methods(synth: Synth) -> dict[str, dict[str, Any]]:
    """``{"POST /v1/jobs": properties}`` of every API Gateway method."""
    out = {}
    for method in synth.resources("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        key = f"{props['HttpMethod']} {_path(synth, props['ResourceId'])}"
        assert key not in out
        out[key] = props
    return out


def _function(synth: Synth, handler: str) -> tuple[str, dict[str, Any]]:
    (found,) = [(k, v["Properties"]) for k, v in synth.resources("AWS::Lambda::Function").items()
                if v["Properties"]["Handler"] == handler]
    return found


def _role_statements(synth: Synth, handler: str) -> list[dict[str, Any]]:
    role = _function(synth, handler)[1]["Role"]["Fn::GetAtt"][0]
    return [s for p in synth.resources("AWS::IAM::Policy").values()
            if {"Ref": role} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def _stage(synth: Synth) -> dict[str, Any]:
    (stage,) = synth.resources("AWS::ApiGateway::Stage").values()
    return stage["Properties"]


@pytest.mark.parametrize("which", ["default_synth", "custom_synth", "agent_synth"])
def test_every_method_is_authorized(which: str, request: pytest.FixtureRequest) -> None:
    """Given any configuration, When the methods are listed, Then each has AuthorizationType
    AWS_IAM or CUSTOM (none NONE; there is no OPTIONS method, no CORS preflight)."""
    synth: Synth = request.getfixturevalue(which)
    methods = _methods(synth)
    assert set(methods) == IAM_ROUTES | NODE_ROUTE_KEYS
    for key, props in methods.items():
        assert not key.startswith("OPTIONS ")
        assert props["AuthorizationType"] in ("AWS_IAM", "CUSTOM"), key


def test_one_rest_api_carries_node_and_jobs_routes(default_synth: Synth) -> None:
    """Given the stack, Then there is one RestApi, one deployment and one stage (prod), and
    every method belongs to that RestApi."""
    (api_id,) = default_synth.resources("AWS::ApiGateway::RestApi")
    assert len(default_synth.resources("AWS::ApiGateway::Deployment")) == 1
    assert _stage(default_synth)["StageName"] == "prod"
    for props in _methods(default_synth).values():
        assert props["RestApiId"] == {"Ref": api_id}


def test_node_routes_use_the_token_authorizer(default_synth: Synth) -> None:
    """Given the node routes, Then each is CUSTOM with the TOKEN authorizer (node_authorizer
    handler, Authorization header), a body validator and a Lambda proxy to the node API."""
    (auth_id, authorizer) = next(iter(default_synth.resources("AWS::ApiGateway::Authorizer").items()))
    assert len(default_synth.resources("AWS::ApiGateway::Authorizer")) == 1
    assert authorizer["Properties"]["Type"] == "TOKEN"
    assert authorizer["Properties"]["IdentitySource"] == "method.request.header.Authorization"
    auth_fn, _ = _function(default_synth, AUTHORIZER_HANDLER)
    assert auth_fn in json.dumps(authorizer["Properties"]["AuthorizerUri"])
    node_fn, _ = _function(default_synth, NODE_API_HANDLER)
    methods = _methods(default_synth)
    for key in NODE_ROUTE_KEYS:
        props = methods[key]
        assert props["AuthorizationType"] == "CUSTOM"
        assert props["AuthorizerId"] == {"Ref": auth_id}
        assert "RequestValidatorId" in props
        assert node_fn in json.dumps(props["Integration"]["Uri"])


def test_jobs_routes_use_iam(default_synth: Synth) -> None:
    """Given the /v1/jobs routes (and /swagger), Then each is AWS_IAM without an authorizer
    and integrates the jobs API function."""
    jobs_fn, _ = _function(default_synth, JOBS_HANDLER)
    methods = _methods(default_synth)
    for key in IAM_ROUTES:
        props = methods[key]
        assert props["AuthorizationType"] == "AWS_IAM"
        assert "AuthorizerId" not in props
        assert jobs_fn in json.dumps(props["Integration"]["Uri"])


def test_stage_has_throttling_access_logs_and_execution_logs(
    default_synth: Synth, agent_synth: Synth
) -> None:
    """Given the defaults / custom api_throttle_*, Then the stage throttles at 1000/2000 /
    250.5/500, writes JSON access logs to its log group, execution logs (ERROR, no data
    trace), metrics and X-Ray."""
    for synth, rate, burst in ((default_synth, 1000, 2000), (agent_synth, 250.5, 500)):
        stage = _stage(synth)
        (setting,) = stage["MethodSettings"]
        assert setting["ThrottlingRateLimit"] == rate
        assert setting["ThrottlingBurstLimit"] == burst
        assert setting["LoggingLevel"] == "ERROR"
        assert setting["DataTraceEnabled"] is False
        assert setting["MetricsEnabled"] is True
        assert stage["TracingEnabled"] is True
        destination = stage["AccessLogSetting"]["DestinationArn"]["Fn::GetAtt"][0]
        assert synth.template["Resources"][destination]["Type"] == "AWS::Logs::LogGroup"
        assert "$context.requestId" in stage["AccessLogSetting"]["Format"]
    # Execution logging needs the account's API Gateway CloudWatch role.
    assert len(default_synth.resources("AWS::ApiGateway::Account")) == 1


def test_heartbeat_sweep_and_scheduler_tick_every_minute(default_synth: Synth) -> None:
    """Given the two schedules, Then the heartbeat sweep and the queue scheduler each have a
    rate(1 minute) rule targeting them, with a dead-letter queue."""
    by_handler = {}
    functions = default_synth.resources("AWS::Lambda::Function")
    for rule in default_synth.resources("AWS::Events::Rule").values():
        if "ScheduleExpression" not in rule["Properties"]:
            continue
        (target,) = rule["Properties"]["Targets"]
        handler = functions[target["Arn"]["Fn::GetAtt"][0]]["Properties"]["Handler"]
        by_handler[handler] = (rule["Properties"], target)
    for handler in (SWEEP_HANDLER, SCHEDULER_HANDLER):
        props, target = by_handler[handler]
        assert props["ScheduleExpression"] == "rate(1 minute)"
        assert props.get("State", "ENABLED") == "ENABLED"
        dlq = target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]
        assert default_synth.template["Resources"][dlq]["Type"] == "AWS::SQS::Queue"


def test_scheduler_runs_one_tick_at_a_time(default_synth: Synth) -> None:
    """Given the functions, Then only the scheduler reserves concurrency, exactly 1."""
    reserved = {props["Handler"]: props["ReservedConcurrentExecutions"]
                for props in (f["Properties"] for f in
                              default_synth.resources("AWS::Lambda::Function").values())
                if "ReservedConcurrentExecutions" in props}
    assert reserved == {SCHEDULER_HANDLER: 1}


def test_jobs_api_may_invoke_the_scheduler_and_only_it(default_synth: Synth) -> None:
    """Given the jobs API function, Then SCHEDULER_FUNCTION_NAME names the scheduler and its
    role may lambda:InvokeFunction exactly that function; no other role may invoke any."""
    scheduler_id, _ = _function(default_synth, SCHEDULER_HANDLER)
    _, jobs = _function(default_synth, JOBS_HANDLER)
    env = jobs["Environment"]["Variables"]
    assert env[c.ENV_SCHEDULER_FUNCTION] == {"Ref": scheduler_id}
    assert env[c.ENV_IDEMPOTENCY_TABLE]["Ref"].startswith("JobQueueApiIdempotencyTable")
    invoke = [s for s in _role_statements(default_synth, JOBS_HANDLER)
              if s["Action"] == "lambda:InvokeFunction"]
    assert [s["Resource"] for s in invoke] == [{"Fn::GetAtt": [scheduler_id, "Arn"]}]
    everyone = [s for p in default_synth.resources("AWS::IAM::Policy").values()
                for s in p["Properties"]["PolicyDocument"]["Statement"]
                if "lambda:InvokeFunction" in json.dumps(s["Action"])]
    assert everyone == invoke


def test_heartbeat_settings_come_from_the_context(
    default_synth: Synth, agent_synth: Synth
) -> None:
    """Given the default / changed heartbeat options, Then the node API and sweep functions
    get them as environment variables."""
    expected = [
        (default_synth, {c.ENV_HEARTBEAT_STALE_SECONDS: "180", c.ENV_NODE_LOST_FAIL_SECONDS: "1800",
                         c.ENV_HANG_SECONDS: "0", c.ENV_HANG_ACTION: "notify"}),
        (agent_synth, {c.ENV_HEARTBEAT_STALE_SECONDS: "240", c.ENV_NODE_LOST_FAIL_SECONDS: "0",
                       c.ENV_HANG_SECONDS: "900", c.ENV_HANG_ACTION: "recover"}),
    ]
    for synth, values in expected:
        for handler in (NODE_API_HANDLER, SWEEP_HANDLER):
            env = _function(synth, handler)[1]["Environment"]["Variables"]
            assert {k: env[k] for k in values} == values
            assert env[c.ENV_NODE_TOKEN_TABLE]["Ref"].startswith("NodeApiNodeTokenTable")


def test_training_log_groups_come_from_the_context(
    default_synth: Synth, agent_synth: Synth
) -> None:
    """Given training_log_groups default / two groups, Then the jobs API reads exactly those."""
    for synth, groups in ((default_synth, ["/ecs/*"]), (agent_synth, ["/ecs/*", "/aws/batch/job"])):
        (logs,) = [s for s in _role_statements(synth, JOBS_HANDLER)
                   if s["Action"] == "logs:GetLogEvents"]
        resources = logs["Resource"] if isinstance(logs["Resource"], list) else [logs["Resource"]]
        assert resources == [
            f"arn:aws:logs:us-east-1:111122223333:log-group:{g}:*" for g in groups
        ]


def test_node_agent_daemon_only_when_enabled(default_synth: Synth, agent_synth: Synth) -> None:
    """Given node_agent_daemon unset / true, Then no / one DAEMON service on the cluster whose
    agent reports to this stack's API URL."""
    assert default_synth.stack.node_agent is None
    assert default_synth.resources("AWS::ECS::Service") == {}
    assert "NodeAgentServiceName" not in default_synth.template["Outputs"]
    assert isinstance(agent_synth.stack.node_agent, NodeAgentDaemon)
    (service,) = agent_synth.resources("AWS::ECS::Service").values()
    assert service["Properties"]["SchedulingStrategy"] == "DAEMON"
    assert service["Properties"]["Cluster"] == CLUSTER
    (task,) = [t for t in agent_synth.resources("AWS::ECS::TaskDefinition").values()
               if t["Properties"].get("Family") == "gpu-node-agent"]
    (container,) = task["Properties"]["ContainerDefinitions"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    (api_id,) = agent_synth.resources("AWS::ApiGateway::RestApi")
    assert api_id in json.dumps(env["GPU_AGENT_API_URL"])
    assert "NodeAgentServiceName" in agent_synth.template["Outputs"]


def test_product_outputs(default_synth: Synth) -> None:
    """Given the stack, Then the API URL, node-token table, idempotency table and scheduler
    function name are outputs referring to those resources."""
    outputs = default_synth.template["Outputs"]
    (api_id,) = default_synth.resources("AWS::ApiGateway::RestApi")
    (stage_id,) = default_synth.resources("AWS::ApiGateway::Stage")
    assert outputs["ApiUrl"]["Value"] == {"Fn::Join": ["", [
        "https://", {"Ref": api_id}, ".execute-api.us-east-1.", {"Ref": "AWS::URLSuffix"}, "/",
        {"Ref": stage_id}, "/"]]}
    assert _stage(default_synth)["StageName"] == "prod"
    assert outputs["NodeTokenTableName"]["Value"]["Ref"].startswith("NodeApiNodeTokenTable")
    assert outputs["IdempotencyTableName"]["Value"]["Ref"].startswith(
        "JobQueueApiIdempotencyTable")
    scheduler_id, _ = _function(default_synth, SCHEDULER_HANDLER)
    assert outputs["SchedulerFunctionName"]["Value"] == {"Ref": scheduler_id}
    queues = default_synth.resources("AWS::SQS::Queue")
    for name in ("HeartbeatSweep", "QueueScheduler"):
        assert outputs[f"{name}DeadLetterQueueUrl"]["Value"]["Ref"] in queues


def test_stack_exposes_the_constructs(default_synth: Synth) -> None:
    """Given the stack object, Then api / queue_api / scheduler are its attributes and the
    jobs routes live on the node API's RestApi."""
    stack = default_synth.stack
    assert isinstance(stack.api, NodeApi)
    assert isinstance(stack.queue_api, JobQueueApi)
    assert isinstance(stack.scheduler, QueueScheduler)
    assert set(stack.queue_api.methods) == IAM_ROUTES
    for method in stack.queue_api.methods.values():
        assert method.api.rest_api_id == stack.api.rest_api.rest_api_id
    assert set(stack.functions) >= {"NodeAuthorizer", "NodeApi", "HeartbeatSweep", "JobsApi",
                                    "QueueScheduler"}
    assert set(stack.monitoring.error_alarms) == set(stack.functions)
    assert set(stack.dead_letter_queues) >= {"HeartbeatSweep", "QueueScheduler"}


def test_node_token_and_idempotency_tables_follow_removal_policy(
    default_synth: Synth, custom_synth: Synth
) -> None:
    """Given table_removal_policy retain (default) / destroy, Then the node-token and
    idempotency tables are retained / deleted like the recovery tables."""
    for synth, policy in ((default_synth, "Retain"), (custom_synth, "Delete")):
        tables = synth.resources("AWS::DynamoDB::Table")
        assert len(tables) == 4
        for prefix in ("NodeApiNodeTokenTable", "JobQueueApiIdempotencyTable"):
            (table,) = [t for k, t in tables.items() if k.startswith(prefix)]
            assert table["DeletionPolicy"] == policy
