"""Fixtures of the jobs API tests: moto with the tables, a GPU cluster and a task definition,
the handler behind tests/jobs_api/api_harness.py's ``Api``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpu_recovery import clock
from gpu_recovery.adapters import aws
from gpu_recovery.constants import (
    ENV_CLUSTER_NAME,
    ENV_IDEMPOTENCY_TABLE,
    ENV_INSTANCE_TABLE,
    ENV_JOB_TABLE,
    ENV_JOBS_ADMIN_ROLES,
    ENV_QUOTA_TABLE,
    ENV_SCHEDULER_FUNCTION,
    table_definitions,
)
from local_mode.sim.contract.requests import RequestGuard
from local_mode.sim.contract.state import MotoState, key_schemas
from local_mode.sim.contract.worlds import moto_guard
from tests.jobs_api.api_harness import (
    ACCOUNT,
    ADMIN_ROLE,
    CLUSTER,
    IDEMPOTENCY_TABLE,
    INSTANCE_TABLE,
    JOB_TABLE,
    LOG_GROUP,
    QUOTA_TABLE,
    REGION,
    Api,
    add_gpu_instances,
    create_tables,
    register_task_definition,
)


def guard_requests(session: Any) -> RequestGuard:
    """The request guard on the handlers' session (a violation fails the test:
    tests/conftest.py)."""
    definitions = table_definitions()
    tables = {JOB_TABLE: definitions["job"], INSTANCE_TABLE: definitions["instance"],
              QUOTA_TABLE: definitions["quota"],
              IDEMPOTENCY_TABLE: {"KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}]}}
    guard = RequestGuard(MotoState(ACCOUNT, REGION, key_schemas(tables)))
    guard.install(session)
    return guard


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv(ENV_JOB_TABLE, JOB_TABLE)
    monkeypatch.setenv(ENV_INSTANCE_TABLE, INSTANCE_TABLE)
    monkeypatch.setenv(ENV_IDEMPOTENCY_TABLE, IDEMPOTENCY_TABLE)
    monkeypatch.setenv(ENV_QUOTA_TABLE, QUOTA_TABLE)
    monkeypatch.setenv(ENV_CLUSTER_NAME, CLUSTER)
    monkeypatch.setenv(ENV_JOBS_ADMIN_ROLES, json.dumps([ADMIN_ROLE]))
    monkeypatch.delenv(ENV_SCHEDULER_FUNCTION, raising=False)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "test")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "jobs-api")
    monkeypatch.delenv("POWERTOOLS_IDEMPOTENCY_DISABLED", raising=False)
    os.environ.pop("AWS_PROFILE", None)
    yield


@pytest.fixture
def api(aws_env: None) -> Iterator[Api]:
    """Given moto with the tables, a GPU cluster (8-GPU nodes) and a task definition."""
    from gpu_recovery.queue.jobs_api.triggers import CallbackSchedulerTrigger
    from handlers import jobs_api

    recorder = Api()
    with mock_aws():
        jobs_api.reset()
        clock.set_clock(lambda: recorder.now[0])
        # The jobs API's requests held to what AWS accepts, as in every LocalAws run (issue 40).
        guard_requests(aws.session())
        aws.session().events.register(
            "before-call.dynamodb.*",
            lambda model, **_: recorder.ddb_ops.append(model.name),
        )
        create_tables()
        boto3.client("ecs", region_name=REGION).create_cluster(clusterName=CLUSTER)
        boto3.client("logs", region_name=REGION).create_log_group(logGroupName=LOG_GROUP)
        register_task_definition()
        add_gpu_instances([8, 8])
        jobs_api.set_scheduler_trigger(CallbackSchedulerTrigger(recorder.triggers.append))
        # The jobs API's calls held to its role's grants, as in every emulated world.
        guard = moto_guard(SimpleNamespace(
            region=REGION, account_id=ACCOUNT, cluster_name=CLUSTER, job_table=JOB_TABLE,
            instance_table=INSTANCE_TABLE, node_token_table="unused-node-tokens", quota_table=QUOTA_TABLE,
            idempotency_table=IDEMPOTENCY_TABLE, topic_arn=f"arn:aws:sns:{REGION}:{ACCOUNT}:unused",
            gang_queue_url=f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/unused-gang",
            tag_lookup_queue_url=f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/unused-lookups", env={},
            client=lambda service: boto3.client(service, region_name=REGION)))
        guard.install(aws.session())
        try:
            yield recorder
        finally:
            guard.uninstall(aws.session())
            clock.reset_clock()
            jobs_api.reset()


