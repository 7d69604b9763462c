"""Schemathesis against the local API (real handlers, authorizers and router over HTTP on
127.0.0.1, moto behind them): the jobs routes from the committed ``docs/openapi.json``,
the node routes from ``docs/node-api.openapi.json``, the job-control routes (what the
training client calls) from ``docs/control-api.openapi.json``.

Generated requests (valid and invalid) must never get a 5xx, and every answer must be a
documented status code with a body matching the documented schema and content type.

Bounded (``FUZZ_EXAMPLES`` per operation: 10 in ``make test``'s quick tier, 25 in the
slow tier's runs, about 400 requests); ``make fuzz`` and ``make test-all`` run longer
(``FUZZ_EXAMPLES=400``).
"""

from __future__ import annotations

import json
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

from gpu_recovery import clock, runtime
from gpu_recovery import constants as C
from gpu_recovery.domain.control_token import make_token, new_secret
from gpu_recovery.heartbeat.tokens import TokenStore
from gpu_recovery.repository import to_ddb
from local_mode.emulator import LocalAws
from local_mode.server import LocalApiServer, create_node_token_table

REPO = Path(__file__).resolve().parents[2]
# make test's quick tier: 10 per operation (tests/conftest.py), 25 otherwise
QUICK = os.environ.get("GPU_RECOVERY_TEST_TIER") == "quick"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10" if QUICK else "25"))
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
control_schema = _schema("control-api.openapi.json")
RUNNING_JOB = "fuzz-running-20261120-000000-a1b2"
ENDED_JOB = "fuzz-ended-20261120-000000-c3d4"


class Target:
    def __init__(self, url: str, token: str, control_tokens: list[str]) -> None:
        self.url = url
        self.token = token
        self.control_tokens = control_tokens


def _control_job(job_id: str, state: str, secret: str) -> dict[str, Any]:
    """A queue job item as the launcher leaves it (attempt 1, with its control secret); no
    rank items (no cluster here): a go_suspend() finds no live rank to stop."""
    now = time.time()
    spec = {"name": job_id, "task_definition": f"{FAMILY}:1", "nnodes": 2, "gpus_per_node": 8,
            "priority": 0, "overrides": {}, "max_recovery_attempts": 1, "labels": {}}
    return to_ddb({
        C.JOB_PK: C.job_item_key(job_id), "item_type": "JOB", "job_id": job_id, "job_state": state,
        "source": "queue", "name": job_id, "user": "fuzz", "priority": 0, "submitted_at": now,
        "spec_json": json.dumps(spec), "world_size": 2, "gpus_per_node": 8, "attempt": 1,
        "recoveries_used": 0, "max_recovery_attempts": 1, C.LIST_PK: C.LIST_BUCKET, "attempts": [],
        "last_error": "", "history": [], "created_at": now, "updated_at": now,
        "control_secret": secret, "suspend_grace_seconds": 60, "quota_subject": "fuzz"})


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    """The local API in front of moto: tables, a cluster, one task definition, a node token."""
    from gpu_recovery.queue.jobs_api.triggers import NoSchedulerTrigger
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
        jobs_api.reset()
        jobs_api.set_scheduler_trigger(NoSchedulerTrigger())
        token = TokenStore(boto3.resource("dynamodb").Table(table)).issue(NODE, issued_by="fuzz")
        # Two queue jobs for the control routes: one RUNNING (its first go_suspend() makes it
        # SUSPENDING), one ended (go_suspend() is a 409); tokens of ranks 0 and 1.
        jobs = boto3.resource("dynamodb").Table(local.job_table)
        control_tokens = []
        for job_id, state in ((RUNNING_JOB, "RUNNING"), (ENDED_JOB, "COMPLETE")):
            secret = new_secret()
            jobs.put_item(Item=_control_job(job_id, state, secret))
            control_tokens += [make_token(job_id, 0, secret), make_token(job_id, 1, secret)]
        with LocalApiServer() as server:
            yield Target(server.url, token, control_tokens)
        jobs_api.reset()


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


def _control_token(case: Any, target: Target) -> str:
    """One of the four ranks' tokens; half of the cases are steered to the jobs' current
    attempt (the others keep what was generated: stale, out of range, not a number)."""
    seed = zlib.crc32(repr((case.method, sorted((case.query or {}).items(), key=str))).encode())
    if seed % 2:
        case.query = {**(case.query or {}), "attempt": 1}
    return target.control_tokens[(seed >> 1) % len(target.control_tokens)]


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


@control_schema.parametrize()
@FUZZ_SETTINGS
def test_control_api_never_5xx_and_conforms(case: Any, target: Target) -> None:
    token = _control_token(case, target)
    case.call_and_validate(base_url=target.url, checks=CHECKS, headers={"Authorization": f"Bearer {token}"})
