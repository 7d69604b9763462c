"""The whole product in one stack: REST API (node, jobs, quota and job-control routes),
scheduler, node agent."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from infra_synth import CLUSTER, Synth

from gpu_recovery import api_routes
from gpu_recovery import constants as c
from infra.control_api import CONTROL_API_HANDLER, CONTROL_AUTHORIZER_HANDLER, JobControlApi
from infra.jobs_api import ROUTES, SWAGGER_ROUTE, JobsApi
from infra.node_agent import NodeAgentDaemon
from infra.node_api import NODE_ROUTES, NodeApi
from infra.scheduler import QueueScheduler

SWEEP_HANDLER = "handlers.heartbeat_sweep.lambda_handler"
SCHEDULER_HANDLER = "handlers.queue_scheduler.lambda_handler"
JOBS_HANDLER = "handlers.jobs_api.lambda_handler"
AUTHORIZER_HANDLER = "handlers.node_authorizer.lambda_handler"
NODE_API_HANDLER = "handlers.node_api.lambda_handler"
IAM_ROUTES = {f"{m} /{path}" for m, path in (*ROUTES, SWAGGER_ROUTE)}
NODE_ROUTE_KEYS = {f"POST /v1/{route}" for route in NODE_ROUTES}
CONTROL_ROUTE_KEYS = {f"{m} /{path}" for m, path in api_routes.CONTROL_API_ROUTES}
# Time sharing's routes on the jobs API (IAM): a user's suspend / resume, the quotas.
TIME_SHARING_IAM_ROUTES = {"POST /v1/jobs/{job_id}/suspend", "POST /v1/jobs/{job_id}/resume",
                           "GET /v1/quotas", "PUT /v1/quotas", "DELETE /v1/quotas"}


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
    assert set(methods) == IAM_ROUTES | NODE_ROUTE_KEYS | CONTROL_ROUTE_KEYS
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
    auth_id, authorizer = _authorizer_of(default_synth, AUTHORIZER_HANDLER)
    assert authorizer["Type"] == "TOKEN"
    assert authorizer["IdentitySource"] == "method.request.header.Authorization"
    node_fn, _ = _function(default_synth, NODE_API_HANDLER)
    methods = _methods(default_synth)
    for key in NODE_ROUTE_KEYS:
        props = methods[key]
        assert props["AuthorizationType"] == "CUSTOM"
        assert props["AuthorizerId"] == {"Ref": auth_id}
        assert "RequestValidatorId" in props
        assert node_fn in json.dumps(props["Integration"]["Uri"])


def _authorizer_of(synth: Synth, handler: str) -> tuple[str, dict[str, Any]]:
    """The API Gateway authorizer whose function runs ``handler``: (logical id, properties)."""
    function_id, _ = _function(synth, handler)
    (found,) = [(k, v["Properties"]) for k, v in synth.resources("AWS::ApiGateway::Authorizer").items()
                if function_id in json.dumps(v["Properties"]["AuthorizerUri"])]
    return found


def test_two_token_authorizers_validate_the_header_and_cache_alike(default_synth: Synth) -> None:
    """Given the node and job-control authorizers, Then both are TOKEN authorizers on the
    Authorization header whose identity validation expression is exactly the runtime's
    NODE_TOKEN_HEADER_PATTERN (a malformed header gets 401 without invoking them; local
    mode checks the same pattern), with the same 300 s result cache."""
    assert len(default_synth.resources("AWS::ApiGateway::Authorizer")) == 2
    for handler in (AUTHORIZER_HANDLER, CONTROL_AUTHORIZER_HANDLER):
        _, authorizer = _authorizer_of(default_synth, handler)
        assert authorizer["Type"] == "TOKEN"
        assert authorizer["IdentitySource"] == "method.request.header.Authorization"
        assert authorizer["IdentityValidationExpression"] == api_routes.NODE_TOKEN_HEADER_PATTERN
        assert authorizer["AuthorizerResultTtlInSeconds"] == 300


def test_control_routes_use_the_control_authorizer(default_synth: Synth) -> None:
    """Given GET /v1/control and POST /v1/control/suspend (training code's suspend channel),
    GET and POST /v1/control/preflight (its gang preflight), Then each is CUSTOM with the
    job-control TOKEN authorizer and a Lambda proxy to the job-control function; the node
    authorizer guards none of them."""
    control_auth, _ = _authorizer_of(default_synth, CONTROL_AUTHORIZER_HANDLER)
    control_fn, _ = _function(default_synth, CONTROL_API_HANDLER)
    methods = _methods(default_synth)
    assert {"GET /v1/control", "POST /v1/control/suspend", "POST /v1/control/checkpoint",
            "GET /v1/control/preflight",
            "POST /v1/control/preflight"} == CONTROL_ROUTE_KEYS
    for key in CONTROL_ROUTE_KEYS:
        props = methods[key]
        assert props["AuthorizationType"] == "CUSTOM"
        assert props["AuthorizerId"] == {"Ref": control_auth}
        assert props["Integration"]["Type"] == "AWS_PROXY"
        assert control_fn in json.dumps(props["Integration"]["Uri"])
    for key, props in methods.items():
        if key not in CONTROL_ROUTE_KEYS:
            assert props.get("AuthorizerId") != {"Ref": control_auth}, key


def test_jobs_routes_use_iam(default_synth: Synth) -> None:
    """Given the /v1/jobs routes (and /swagger), Then each is AWS_IAM without an authorizer
    and integrates the jobs API function."""
    jobs_fn, _ = _function(default_synth, JOBS_HANDLER)
    methods = _methods(default_synth)
    assert TIME_SHARING_IAM_ROUTES <= IAM_ROUTES  # one method per route, no {proxy+}
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
    assert outputs["QuotaTableName"]["Value"]["Ref"].startswith("TablesQuotaTable")
    scheduler_id, _ = _function(default_synth, SCHEDULER_HANDLER)
    assert outputs["SchedulerFunctionName"]["Value"] == {"Ref": scheduler_id}
    queues = default_synth.resources("AWS::SQS::Queue")
    for name in ("HeartbeatSweep", "QueueScheduler"):
        assert outputs[f"{name}DeadLetterQueueUrl"]["Value"]["Ref"] in queues


def test_stack_exposes_the_constructs(default_synth: Synth) -> None:
    """Given the stack object, Then node_api / jobs_api / scheduler are its attributes and the
    jobs routes live on the node API's RestApi."""
    stack = default_synth.stack
    assert isinstance(stack.node_api, NodeApi)
    assert isinstance(stack.jobs_api, JobsApi)
    assert isinstance(stack.scheduler, QueueScheduler)
    assert isinstance(stack.control_api, JobControlApi)
    assert set(stack.jobs_api.methods) == IAM_ROUTES
    assert set(stack.control_api.methods) == CONTROL_ROUTE_KEYS
    for method in stack.control_api.methods.values():
        assert method.api.rest_api_id == stack.node_api.rest_api.rest_api_id
    for method in stack.jobs_api.methods.values():
        assert method.api.rest_api_id == stack.node_api.rest_api.rest_api_id
    assert set(stack.functions) >= {"NodeAuthorizer", "NodeApi", "HeartbeatSweep", "JobsApi",
                                    "QueueScheduler", "JobControlAuthorizer", "JobControlApi"}
    assert set(stack.monitoring.error_alarms) == set(stack.functions)
    assert set(stack.dead_letter_queues) >= {"HeartbeatSweep", "QueueScheduler"}


def test_node_token_and_idempotency_tables_follow_removal_policy(
    default_synth: Synth, custom_synth: Synth
) -> None:
    """Given table_removal_policy retain (default) / destroy, Then the node-token and
    idempotency tables are retained / deleted like the recovery tables."""
    for synth, policy in ((default_synth, "Retain"), (custom_synth, "Delete")):
        tables = synth.resources("AWS::DynamoDB::Table")
        assert len(tables) == 5  # job, instance, quota, node token, idempotency
        for prefix in ("NodeApiNodeTokenTable", "JobQueueApiIdempotencyTable"):
            (table,) = [t for k, t in tables.items() if k.startswith(prefix)]
            assert table["DeletionPolicy"] == policy


def _quota_table(synth: Synth) -> str:
    (table,) = [k for k in synth.resources("AWS::DynamoDB::Table") if k.startswith("TablesQuotaTable")]
    return table


def test_scheduler_gets_the_control_url_and_time_sharing_settings(default_synth: Synth) -> None:
    """Given the defaults, Then the scheduler's environment has the quota table, no default
    quota ({}), preemption on, a 60 s grace, demotion after 30 min (in seconds) and the
    control API URL (the prod stage's, which the launcher gives every rank), built from the
    RestApi id: it references the RestApi only, never the stage or the deployment."""
    env = _function(default_synth, SCHEDULER_HANDLER)[1]["Environment"]["Variables"]
    (api_id,) = default_synth.resources("AWS::ApiGateway::RestApi")
    assert env[c.ENV_QUOTA_TABLE] == {"Ref": _quota_table(default_synth)}
    assert env[c.ENV_DEFAULT_NODE_QUOTAS] == "{}"
    assert env[c.ENV_PREEMPTION] == "true"
    assert env[c.ENV_SUSPEND_GRACE_SECONDS] == "60"
    assert env[c.ENV_DEMOTE_AFTER_SECONDS] == "1800"
    assert env[c.ENV_CONTROL_API_URL] == {"Fn::Join": ["", [
        "https://", {"Ref": api_id}, ".execute-api.", {"Ref": "AWS::Region"}, ".",
        {"Ref": "AWS::URLSuffix"}, "/prod/"]]}
    (stage_id,) = default_synth.resources("AWS::ApiGateway::Stage")
    (deployment_id,) = default_synth.resources("AWS::ApiGateway::Deployment")
    scheduler_id, props = _function(default_synth, SCHEDULER_HANDLER)
    text = json.dumps([props, default_synth.template["Resources"][scheduler_id].get("DependsOn", [])])
    assert stage_id not in text and deployment_id not in text


def test_jobs_api_gets_the_quota_table_and_settings(default_synth: Synth) -> None:
    """Given the jobs API function, Then it names the quota table, the default quotas and the
    default suspend grace (the submit-time quota check, a user's suspend, admin quotas)."""
    env = _function(default_synth, JOBS_HANDLER)[1]["Environment"]["Variables"]
    assert env[c.ENV_QUOTA_TABLE] == {"Ref": _quota_table(default_synth)}
    assert env[c.ENV_DEFAULT_NODE_QUOTAS] == "{}"
    assert env[c.ENV_SUSPEND_GRACE_SECONDS] == "60"
    control = _function(default_synth, CONTROL_API_HANDLER)[1]["Environment"]["Variables"]
    assert control[c.ENV_CONTROL_POLL_SECONDS] == "2"
    assert control[c.ENV_JOB_TABLE]["Ref"].startswith("TablesJobTable")


def _dependencies(node: Any) -> set[str]:
    """Logical ids referenced by Ref / Fn::GetAtt (and Fn::Sub ${...}) anywhere in ``node``."""
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= _dependencies(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                found.add(value)
            elif key == "Fn::GetAtt":
                found.add(value[0] if isinstance(value, list) else str(value).split(".")[0])
            elif key == "Fn::Sub":
                text = value[0] if isinstance(value, list) else value
                found |= {ref.split(".")[0] for ref in re.findall(r"\$\{([^}!]+)\}", text)}
                found |= _dependencies(value[1] if isinstance(value, list) else [])
            else:
                found |= _dependencies(value)
    return found


@pytest.mark.parametrize("which", ["default_synth", "custom_synth", "agent_synth"])
def test_the_template_has_no_dependency_cycle(which: str, request: pytest.FixtureRequest) -> None:
    """Given the template (the scheduler's control URL points at the RestApi whose methods
    integrate the jobs API, whose environment names the scheduler), Then the graph of
    Ref / GetAtt / Sub / DependsOn between resources has no cycle: CloudFormation would
    refuse the stack ("Circular dependency between resources") only at deploy time."""
    synth: Synth = request.getfixturevalue(which)
    resources = synth.template["Resources"]
    graph = {}
    for logical, resource in resources.items():
        depends = resource.get("DependsOn", [])
        edges = _dependencies({k: v for k, v in resource.items() if k != "DependsOn"})
        edges |= set([depends] if isinstance(depends, str) else depends)
        graph[logical] = {e for e in edges if e in resources and e != logical}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("cycle: " + " -> ".join([*path[path.index(nxt):], node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for logical in sorted(graph):
        if logical not in state:
            visit(logical, [])
    assert synth.error is None, synth.error


def test_node_agent_image_is_a_registry_option(
    agent_synth: Synth, tmp_path_factory: pytest.TempPathFactory, health_check_script: Any
) -> None:
    """Given node_agent_image unset / set, Then the daemon runs the default / that image
    (the key comes from the registry, not from a raw context read)."""
    from infra_synth import AGENT_CONTEXT, synthesize

    from infra.config import DEFAULT_NODE_AGENT_IMAGE

    def image(synth: Synth) -> str:
        (task,) = [t for t in synth.resources("AWS::ECS::TaskDefinition").values()
                   if t["Properties"].get("Family") == "gpu-node-agent"]
        (container,) = task["Properties"]["ContainerDefinitions"]
        return str(container["Image"])

    assert image(agent_synth) == DEFAULT_NODE_AGENT_IMAGE
    own = "123456789012.dkr.ecr.us-east-1.amazonaws.com/agent:1"
    custom = synthesize({**AGENT_CONTEXT, "node_agent_image": own},
                        tmp_path_factory.mktemp("cdk-agent-image"))
    assert custom.error is None, custom.error
    assert image(custom) == own
