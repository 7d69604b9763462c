"""Schemathesis against the local API (real handlers, authorizer and router over HTTP on
127.0.0.1, moto behind them): the jobs routes from the committed ``docs/openapi.json``,
the node routes from ``docs/node-api.openapi.json``.

Generated requests (valid and invalid) must never get a 5xx, and every answer must be a
documented status code with a body matching the documented schema and content type.

Bounded for ``make test`` (``FUZZ_EXAMPLES`` per operation, default 25, about 400
requests); ``make fuzz`` runs longer (``FUZZ_EXAMPLES=400``).
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpu_recovery import clock, heartbeat, runtime
from gpu_recovery.tokens import TokenStore
from local_mode.emulator import LocalAws
from local_mode.server import LocalApiServer, create_node_token_table

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
NODE = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
FAMILY = "llama-train"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(HealthCheck))


def _schema(name: str) -> Any:
    schema = schemathesis.openapi.from_path(str(REPO / "docs" / name))
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                    max_examples=EXAMPLES)
    return schema


jobs_schema = _schema("openapi.json")
node_schema = _schema("node-api.openapi.json")


class Target:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    """The local API in front of moto: tables, a cluster, one task definition, a node token."""
    from gpu_recovery.queue.service import NoSchedulerTrigger
    from handlers import jobs_api

    clock.reset_clock()
    with LocalAws(metrics_disabled=True) as local:
        table = create_node_token_table(local)
        ecs = local.client("ecs")
        ecs.register_task_definition(family=FAMILY, containerDefinitions=[{
            "name": "trainer", "image": "train:latest", "memory": 1024,
            "logConfiguration": {"logDriver": "awslogs", "options": {
                "awslogs-group": "/ecs/llama", "awslogs-region": local.region,
                "awslogs-stream-prefix": "train"}}}])
        runtime.reset(clients=False)
        heartbeat.reset()
        jobs_api.reset()
        jobs_api.set_scheduler_trigger(NoSchedulerTrigger())
        token = TokenStore(boto3.resource("dynamodb").Table(table)).issue(NODE, issued_by="fuzz")
        with LocalApiServer() as server:
            yield Target(server.url, token)
        jobs_api.reset()
        heartbeat.reset()


def _steer(case: Any) -> None:
    """Half of the valid-looking bodies are steered into the deep paths (the token's own
    node and the current time; an existing task definition), so the fuzzing reaches the
    services and DynamoDB, not only validation."""
    body = case.body
    if not isinstance(body, dict) or zlib.crc32(repr(sorted(body, key=str)).encode()) % 2:
        return
    if case.path.startswith("/v1/report_"):
        body["node_id"] = NODE
        body["timestamp"] = time.time()
    elif case.path == "/v1/jobs" and case.method.upper() == "POST":
        body["task_definition"] = f"{FAMILY}:1"


@jobs_schema.parametrize()
@FUZZ_SETTINGS
def test_jobs_api_never_5xx_and_conforms(case: Any, target: Target) -> None:
    _steer(case)
    case.call_and_validate(base_url=target.url, checks=CHECKS,
                           headers={"X-Local-User": "arn:aws:iam::123456789012:user/fuzz"})


@node_schema.parametrize()
@FUZZ_SETTINGS
def test_node_api_never_5xx_and_conforms(case: Any, target: Target) -> None:
    _steer(case)
    case.call_and_validate(base_url=target.url, checks=CHECKS,
                           headers={"Authorization": f"Bearer {target.token}"})
