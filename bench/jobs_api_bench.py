"""In-process latency of each jobs API route against moto (no network, no AWS).

``python -m bench.jobs_api_bench`` prints the median (and p90) milliseconds per route;
``run()`` returns them as a dict. Moto dominates the absolute numbers: compare runs, not
against production.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

ROUNDS = 30
_ENV = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "TRAINING_JOB_TABLE_NAME": "bench-jobs",
    "CONTAINER_INSTANCE_TABLE_NAME": "bench-instances",
    "IDEMPOTENCY_TABLE_NAME": "bench-idempotency",
    "QUOTA_TABLE_NAME": "bench-quota",  # admission reads the submitter's quota
    "ECS_CLUSTER_NAME": "bench-cluster",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "bench",
    "POWERTOOLS_SERVICE_NAME": "jobs-api",
}


def _timed(fn: Callable[[], int], expected: int, rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        status = fn()
        samples.append((time.perf_counter() - start) * 1000)
        if status != expected:
            raise RuntimeError(f"unexpected status {status} (wanted {expected})")
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 3),
            "p90_ms": round(samples[int(0.9 * (len(samples) - 1))], 3)}


def run(print_report: bool = True, rounds: int = ROUNDS) -> dict[str, Any]:
    """Median/p90 ms per route (moto tables, ECS cluster with two 8-GPU nodes, logs)."""
    report = _measure(rounds)
    if print_report:
        _print(report)
    return report


def _measure(rounds: int) -> dict[str, Any]:
    from local_mode.harness import environ_restored

    with environ_restored(_ENV):
        os.environ.update(_ENV)
        os.environ.pop("SCHEDULER_FUNCTION_NAME", None)
        import boto3
        from moto import mock_aws

        with mock_aws():
            return _run(boto3, rounds)


def _run(boto3: Any, rounds: int) -> dict[str, Any]:
    from moto.ecs.models import ecs_backends

    from gpu_recovery.constants import table_definitions
    from gpu_recovery.queue.jobs_api.triggers import CallbackSchedulerTrigger
    from handlers import jobs_api
    from local_mode.server import API_TIMEOUT_SECONDS
    from local_mode.sim.lambda_context import LambdaContext

    region, cluster = _ENV["AWS_DEFAULT_REGION"], _ENV["ECS_CLUSTER_NAME"]
    jobs_api.reset()
    ddb = boto3.client("dynamodb", region_name=region)
    defs = table_definitions()
    ddb.create_table(TableName=_ENV["TRAINING_JOB_TABLE_NAME"], BillingMode="PAY_PER_REQUEST", **defs["job"])
    # the instance table holds the ECS call budget a cancel's StopTask takes a token from
    ddb.create_table(TableName=_ENV["CONTAINER_INSTANCE_TABLE_NAME"], BillingMode="PAY_PER_REQUEST",
                     **defs["instance"])
    ddb.create_table(TableName=_ENV["QUOTA_TABLE_NAME"], BillingMode="PAY_PER_REQUEST", **defs["quota"])
    ddb.create_table(TableName=_ENV["IDEMPOTENCY_TABLE_NAME"], BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
    ecs = boto3.client("ecs", region_name=region)
    ec2 = boto3.client("ec2", region_name=region)
    logs = boto3.client("logs", region_name=region)
    ecs.create_cluster(clusterName=cluster)
    logs.create_log_group(logGroupName="/ecs/bench")
    ecs.register_task_definition(family="bench-train", containerDefinitions=[{
        "name": "trainer", "image": "train:latest", "memory": 512,
        "logConfiguration": {"logDriver": "awslogs", "options": {
            "awslogs-group": "/ecs/bench", "awslogs-region": region, "awslogs-stream-prefix": "train"}}}])
    account = boto3.client("sts", region_name=region).get_caller_identity()["Account"]
    instances = []
    for _ in range(2):
        iid = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        arn = ecs.register_container_instance(
            cluster=cluster, instanceIdentityDocument=json.dumps({"instanceId": iid, "region": region})
        )["containerInstance"]["containerInstanceArn"]
        ecs_backends[account][region].container_instances[cluster][arn.rsplit("/", 1)[-1]] \
            .registered_resources.append({"name": "GPU", "type": "STRINGSET",
                                          "stringSetValue": [f"GPU-{i}" for i in range(8)]})
        instances.append(arn)
    jobs_api.set_scheduler_trigger(CallbackSchedulerTrigger(lambda payload: None))

    spec = {"name": "bench", "task_definition": "bench-train:1", "nnodes": 2, "gpus_per_node": 8}
    counter = iter(range(10**9))
    context = LambdaContext("jobs-api", memory_limit_in_mb=512, timeout_seconds=API_TIMEOUT_SECONDS,
                            aws_request_id="bench", log_stream_name="bench")

    def call(method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
             headers: dict[str, str] | None = None) -> int:
        event = {
            "resource": path, "path": path, "httpMethod": method,
            "headers": {"Content-Type": "application/json", **(headers or {})},
            "multiValueHeaders": {}, "queryStringParameters": query,
            "multiValueQueryStringParameters": {k: [v] for k, v in (query or {}).items()} or None,
            "pathParameters": None, "stageVariables": None, "isBase64Encoded": False,
            "body": json.dumps(body) if body is not None else None,
            "requestContext": {"requestId": "bench", "stage": "bench", "httpMethod": method,
                               "resourcePath": path, "path": path, "accountId": account,
                               "identity": {"userArn": f"arn:aws:iam::{account}:user/bench",
                                            "sourceIp": "127.0.0.1"}},
        }
        return int(jobs_api.lambda_handler(event, context)["statusCode"])

    results: dict[str, Any] = {}
    results["POST /v1/jobs"] = _timed(lambda: call("POST", "/v1/jobs", spec), 201, rounds)
    results["POST /v1/jobs (Idempotency-Key)"] = _timed(
        lambda: call("POST", "/v1/jobs", spec, headers={"Idempotency-Key": f"k{next(counter)}"}), 201, rounds)
    results["POST /v1/jobs (idempotent replay)"] = _timed(
        lambda: call("POST", "/v1/jobs", spec, headers={"Idempotency-Key": "k0"}), 201, rounds)
    job_id = json.loads(_body(call, spec))["job_id"]
    # Put the job on ECS with two running ranks so get/cancel/logs do real work.
    from gpu_recovery.constants import RankState
    from gpu_recovery.domain.models import Rank
    from gpu_recovery.repository import records

    table = boto3.resource("dynamodb", region_name=region).Table(_ENV["TRAINING_JOB_TABLE_NAME"])
    task_def = ecs.describe_task_definition(taskDefinition="bench-train:1")["taskDefinition"][
        "taskDefinitionArn"]
    for rank, ci in enumerate(instances):
        task = ecs.start_task(cluster=cluster, taskDefinition=task_def, containerInstances=[ci])["tasks"][0]
        table.put_item(Item=records.rank_to_item(Rank(
            job_id=job_id, rank=rank, state=RankState.RUNNING, attempt=1, task_arn=task["taskArn"],
            task_definition_arn=task_def, container_inst_id=ci.rsplit("/", 1)[-1])))
        if rank == 0:
            stream = f"train/trainer/{task['taskArn'].rsplit('/', 1)[-1]}"
            logs.create_log_stream(logGroupName="/ecs/bench", logStreamName=stream)
            logs.put_log_events(logGroupName="/ecs/bench", logStreamName=stream, logEvents=[
                {"timestamp": 1_700_000_000_000 + i, "message": f"step {i}"} for i in range(200)])
    table.update_item(Key={"job_id_rank": f"{job_id}#JOB"},
                      UpdateExpression="SET job_state = :s, attempt = :a REMOVE queue_bucket, queue_order",
                      ExpressionAttributeValues={":s": "RUNNING", ":a": 1})

    results["GET /v1/jobs/{job_id}"] = _timed(lambda: call("GET", f"/v1/jobs/{job_id}"), 200, rounds)
    results["GET /v1/jobs (limit 20)"] = _timed(lambda: call("GET", "/v1/jobs"), 200, rounds)
    results["GET /v1/jobs?state=QUEUED"] = _timed(
        lambda: call("GET", "/v1/jobs", query={"state": "QUEUED"}), 200, rounds)
    results["GET /v1/jobs/{job_id}/events"] = _timed(
        lambda: call("GET", f"/v1/jobs/{job_id}/events"), 200, rounds)
    results["GET /v1/jobs/{job_id}/logs"] = _timed(
        lambda: call("GET", f"/v1/jobs/{job_id}/logs", query={"limit": "100"}), 200, rounds)
    results["POST /v1/jobs/{job_id}/cancel (running)"] = _timed(
        lambda: call("POST", f"/v1/jobs/{job_id}/cancel"), 200, rounds)
    queued = [json.loads(_body(call, spec))["job_id"] for _ in range(rounds)]
    pending = iter(queued)
    results["POST /v1/jobs/{job_id}/cancel (queued)"] = _timed(
        lambda: call("POST", f"/v1/jobs/{next(pending)}/cancel"), 200, rounds)
    jobs_api.reset()
    return {"rounds": rounds, "routes": results}


def _body(call: Callable[..., int], spec: dict[str, Any]) -> str:
    from handlers import jobs_api

    captured: dict[str, str] = {}
    original = jobs_api.lambda_handler

    def capture(event: dict[str, Any], context: Any) -> dict[str, Any]:
        response = original(event, context)
        captured["body"] = response["body"]
        return response

    jobs_api.lambda_handler = capture  # type: ignore[assignment]
    try:
        call("POST", "/v1/jobs", spec)
    finally:
        jobs_api.lambda_handler = original  # type: ignore[assignment]
    return captured["body"]


def _print(report: dict[str, Any]) -> None:
    width = max(len(k) for k in report["routes"])
    print(f"jobs API, in-process against moto, {report['rounds']} rounds per route")
    for route, numbers in report["routes"].items():
        print(f"  {route:<{width}}  median {numbers['median_ms']:8.2f} ms   p90 {numbers['p90_ms']:8.2f} ms")


def main() -> None:
    import logging
    import warnings

    logging.disable(logging.INFO)
    warnings.simplefilter("ignore")
    run()


if __name__ == "__main__":
    main()
