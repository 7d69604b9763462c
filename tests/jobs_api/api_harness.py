"""The jobs API offline: moto tables, ECS and logs, API Gateway (REST v1) events into the
real handler, jobs seeded in any state."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import boto3

from gpu_recovery.constants import table_definitions
from tests.fixtures.events import load_event

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
CLUSTER = "gpu-cluster"
JOB_TABLE = "jobs-test"
INSTANCE_TABLE = "instances-test"
IDEMPOTENCY_TABLE = "idempotency-test"
QUOTA_TABLE = "quotas-test"
LOG_GROUP = "/ecs/llama-train"
LOG_PREFIX = "train"
CONTAINER = "trainer"
ALICE = "arn:aws:iam::111122223333:user/alice"
BOB = "arn:aws:iam::111122223333:user/bob"


# A session of the admin role configured for these tests (JOBS_ADMIN_ROLES).
OPS = "arn:aws:sts::111122223333:assumed-role/gpu-ops/oncall"
ADMIN_ROLE = "gpu-ops"
START = 1_795_185_121.0  # 2026-11-20T14:32:01Z


def valid_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "llama-ft",
        "task_definition": "llama-train:1",
        "nnodes": 2,
        "gpus_per_node": 8,
        "priority": "HIGH",
        "overrides": {"command": ["torchrun", "train.py"], "environment": {"EPOCHS": "3"}},
        "labels": {"team": "nlp"},
    }
    spec.update(changes)
    return {k: v for k, v in spec.items() if v is not None}


def api_event(
    method: str,
    path: str,
    *,
    body: Any = None,
    query: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    user_arn: str | None = ALICE,
    raw_body: str | None = None,
) -> dict[str, Any]:
    """A REST API (v1) proxy event shaped like tests/events/apigw_jobs_submit.json."""
    event = copy.deepcopy(load_event("apigw_jobs_submit.json"))
    parts = path.strip("/").split("/")
    resource, params = path, None
    if len(parts) >= 3 and parts[:2] == ["v1", "jobs"]:
        params = {"job_id": parts[2]}
        resource = "/v1/jobs/{job_id}" + ("/" + "/".join(parts[3:]) if len(parts) > 3 else "")
    event["resource"] = resource
    event["path"] = path
    event["httpMethod"] = method
    event["pathParameters"] = params
    event["requestContext"].update({"httpMethod": method, "resourcePath": resource, "path": f"/prod{path}"})
    base_headers = {k: v for k, v in event["headers"].items() if k != "Idempotency-Key"}
    base_headers.update(headers or {})
    event["headers"] = base_headers
    event["multiValueHeaders"] = {k: [v] for k, v in base_headers.items()}
    event["queryStringParameters"] = dict(query) if query else None
    event["multiValueQueryStringParameters"] = {k: [v] for k, v in query.items()} if query else None
    if raw_body is not None:
        event["body"] = raw_body
    else:
        event["body"] = json.dumps(body) if body is not None else None
    identity = event["requestContext"]["identity"]
    identity["userArn"] = user_arn
    if user_arn is None:
        identity["caller"] = None
        identity["user"] = None
        identity["accessKey"] = None
    return event


@dataclass
class FakeContext:
    function_name: str = "jobs-api"
    function_version: str = "$LATEST"
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:jobs-api"
    memory_limit_in_mb: int = 512
    aws_request_id: str = "c6af9ac6-7b61-11e6-9a41-93e8deadbeef"
    log_group_name: str = "/aws/lambda/jobs-api"
    log_stream_name: str = "2026/11/20/[$LATEST]abc"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


@dataclass
class Api:
    """Calls the real Lambda handler in-process; records scheduler triggers and DynamoDB ops."""

    triggers: list[dict[str, Any]] = field(default_factory=list)
    ddb_ops: list[str] = field(default_factory=list)
    now: list[float] = field(default_factory=lambda: [START])

    def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        from handlers import jobs_api

        response = jobs_api.lambda_handler(api_event(method, path, **kwargs), FakeContext())
        body = json.loads(response["body"]) if response.get("body") else {}
        headers = {**(response.get("headers") or {})}
        for k, v in (response.get("multiValueHeaders") or {}).items():
            headers.setdefault(k, v[0] if isinstance(v, list) and v else v)
        return response["statusCode"], body, headers

    def submit(self, spec: dict[str, Any] | None = None, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        status, body, _ = self.call("POST", "/v1/jobs", body=spec or valid_spec(), **kwargs)
        return status, body

    def tick(self, seconds: float = 1.0) -> None:
        self.now[0] += seconds

    @property
    def job_table(self) -> Any:
        return boto3.resource("dynamodb", region_name=REGION).Table(JOB_TABLE)


def add_gpu_instances(gpus: list[int]) -> list[str]:
    """Register container instances and give each a GPU STRINGSET of the given size."""
    from moto.ecs.models import ecs_backends

    ec2 = boto3.client("ec2", region_name=REGION)
    ecs = boto3.client("ecs", region_name=REGION)
    arns = []
    for count in gpus:
        instance = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]
        document = json.dumps({"instanceId": instance["InstanceId"], "region": REGION})
        arn = ecs.register_container_instance(cluster=CLUSTER, instanceIdentityDocument=document)[
            "containerInstance"
        ]["containerInstanceArn"]
        backend = ecs_backends[ACCOUNT][REGION]
        moto_ci = backend.container_instances[CLUSTER][arn.split("/")[-1]]
        moto_ci.registered_resources.append(
            {"name": "GPU", "type": "STRINGSET", "doubleValue": 0.0, "integerValue": 0, "longValue": 0,
             "stringSetValue": [f"GPU-{i:04d}" for i in range(count)]}
        )
        arns.append(arn)
    return arns


def register_task_definition(family: str = "llama-train", gpus: int | None = 8,
                             log: bool = True) -> str:
    ecs = boto3.client("ecs", region_name=REGION)
    container: dict[str, Any] = {"name": CONTAINER, "image": "llm-train:latest", "memory": 1024}
    if gpus is not None:
        container["resourceRequirements"] = [{"type": "GPU", "value": str(gpus)}]
    if log:
        container["logConfiguration"] = {
            "logDriver": "awslogs",
            "options": {"awslogs-group": LOG_GROUP, "awslogs-region": REGION,
                        "awslogs-stream-prefix": LOG_PREFIX},
        }
    return ecs.register_task_definition(family=family, containerDefinitions=[container])[
        "taskDefinition"]["taskDefinitionArn"]


def create_tables() -> None:
    client = boto3.client("dynamodb", region_name=REGION)
    definitions = table_definitions()
    for name, logical in ((JOB_TABLE, "job"), (INSTANCE_TABLE, "instance"), (QUOTA_TABLE, "quota")):
        client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **definitions[logical])
    client.create_table(
        TableName=IDEMPOTENCY_TABLE,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
    )


def start_job(api: Api, job_id: str, *, state: str = "RUNNING",
              rank_states: list[str] | None = None, attempt: int = 1) -> list[str]:
    """Put a submitted job into ``state`` with real moto tasks behind its rank items."""
    from gpu_recovery.constants import JobState, RankState
    from gpu_recovery.domain.models import Rank
    from gpu_recovery.repository import records

    ecs = boto3.client("ecs", region_name=REGION)
    item = api.job_table.get_item(Key={"job_id_rank": f"{job_id}#JOB"})["Item"]
    spec = json.loads(item["spec_json"])
    instances = ecs.list_container_instances(cluster=CLUSTER)["containerInstanceArns"]
    states = rank_states or ["RUNNING"] * int(item["world_size"])
    arns = []
    for rank, rank_state in enumerate(states):
        task = ecs.start_task(cluster=CLUSTER, taskDefinition=spec["task_definition"],
                              containerInstances=[instances[rank % len(instances)]])["tasks"][0]
        arns.append(task["taskArn"])
        ci_arn = instances[rank % len(instances)]
        api.job_table.put_item(Item=records.rank_to_item(Rank(
            job_id=job_id, rank=rank, state=RankState(rank_state), attempt=attempt,
            task_arn=task["taskArn"], task_definition_arn=spec["task_definition"],
            container_inst_id=ci_arn.rsplit("/", 1)[-1], container_instance_arn=ci_arn,
            ec2_instance_id=f"i-{rank:017d}", last_heartbeat_at=api.now[0], registered_at=api.now[0],
        )))
    api.job_table.update_item(
        Key={"job_id_rank": f"{job_id}#JOB"},
        UpdateExpression="SET job_state = :s, attempt = :a REMOVE queue_bucket, queue_order",
        ExpressionAttributeValues={":s": JobState(state).value, ":a": attempt},
    )
    return arns


def set_state(api: Api, job_id: str, state: str) -> None:
    """Move the job item to ``state`` (queued states keep their queue attributes)."""
    api.job_table.update_item(
        Key={"job_id_rank": f"{job_id}#JOB"},
        UpdateExpression="SET job_state = :s",
        ExpressionAttributeValues={":s": state},
    )
