"""The jobs API's settings (validated once, naming the variable) and the queue's AWS
adapters: the errors the service shows the caller (400/404) are mapped in the adapter,
everything else propagates; the scheduler's task-definition cache; the node reads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from gpu_recovery import constants as c
from gpu_recovery.adapters.ecs import EcsAdapter
from gpu_recovery.adapters.logs import InvalidLogToken, LogStreamNotFound, TrainingLogReader
from gpu_recovery.adapters.task_definitions import TaskDefinitionNotFound, TaskDefinitions
from gpu_recovery.settings import JobControlSettings, JobsApiSettings, SettingsError
from tests.jobs_api.api_harness import (
    CLUSTER,
    LOG_GROUP,
    REGION,
    add_gpu_instances,
    register_task_definition,
)

BASE_ENV = {c.ENV_JOB_TABLE: "jobs", c.ENV_CLUSTER_NAME: "gpu"}


# ------------------------------------------------------------------------- settings
@pytest.mark.parametrize("missing", [c.ENV_JOB_TABLE, c.ENV_CLUSTER_NAME])
def test_jobs_api_settings_name_a_missing_variable(missing: str) -> None:
    """Given the jobs API's environment without the job table or the cluster
    When its settings are read (cold start)
    Then SettingsError names the variable (no silent default table or cluster)."""
    env = {k: v for k, v in BASE_ENV.items() if k != missing}
    with pytest.raises(SettingsError, match=missing):
        JobsApiSettings.from_env(env)
    with pytest.raises(SettingsError, match=missing):
        JobsApiSettings.from_env({**env, missing: "  "})


def test_jobs_api_settings_defaults_and_values() -> None:
    """Given only the required variables, then every optional one
    When the settings are read
    Then the optional ones default to the stack's names (no "unused" table) and are taken
    as given otherwise."""
    settings = JobsApiSettings.from_env(BASE_ENV)
    assert (settings.job_table, settings.cluster) == ("jobs", "gpu")
    assert settings.instance_table == c.DEFAULT_INSTANCE_TABLE_NAME
    assert settings.idempotency_table == c.DEFAULT_IDEMPOTENCY_TABLE_NAME
    assert settings.scheduler_function == "" and settings.sharing.quota_table == c.DEFAULT_QUOTA_TABLE_NAME
    assert settings.default_budgets == (3, 0)
    full = JobsApiSettings.from_env({
        **BASE_ENV, c.ENV_INSTANCE_TABLE: "nodes", c.ENV_IDEMPOTENCY_TABLE: "idem",
        c.ENV_SCHEDULER_FUNCTION: "tick", c.ENV_MAX_RECOVERY_ATTEMPTS: "5", c.ENV_MAX_APP_RESTARTS: "2",
        c.ENV_QUOTA_TABLE: "quotas", c.ENV_JOBS_ADMIN_ROLES: '["ops"]'})
    assert (full.instance_table, full.idempotency_table, full.scheduler_function) == ("nodes", "idem", "tick")
    assert full.default_budgets == (5, 2) and full.sharing.quota_table == "quotas"
    assert full.access.admin_roles == ("ops",)


@pytest.mark.parametrize(("name", "raw"), [(c.ENV_DEFAULT_NODE_QUOTAS, "[1]"),
                                           (c.ENV_JOBS_ADMIN_ROLES, "[1]"),
                                           (c.ENV_SUSPEND_GRACE_SECONDS, "soon")])
def test_jobs_api_settings_refuse_a_malformed_value_naming_it(name: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=name):
        JobsApiSettings.from_env({**BASE_ENV, name: raw})


def test_job_control_settings_need_the_job_table() -> None:
    with pytest.raises(SettingsError, match=c.ENV_JOB_TABLE):
        JobControlSettings.from_env({})
    settings = JobControlSettings.from_env({c.ENV_JOB_TABLE: "jobs", c.ENV_CONTROL_POLL_SECONDS: "5"})
    assert (settings.job_table, settings.instance_table, settings.control_poll_seconds) == (
        "jobs", c.DEFAULT_INSTANCE_TABLE_NAME, 5)


# ------------------------------------------------------------------------- adapters
@pytest.fixture
def moto_ecs(aws_env: None) -> Iterator[Any]:
    with mock_aws():
        ecs = boto3.client("ecs", region_name=REGION)
        ecs.create_cluster(clusterName=CLUSTER)
        boto3.client("logs", region_name=REGION).create_log_group(logGroupName=LOG_GROUP)
        yield ecs


def _count_calls(client: Any, operation: str) -> list[str]:
    seen: list[str] = []
    client.meta.events.register(f"before-call.*.{operation}", lambda model, **_: seen.append(model.name))
    return seen


def test_task_definitions_map_unknown_and_cache_per_ttl(moto_ecs: Any) -> None:
    """Given a registered task definition and an unknown one
    When they are described through the cached adapter and the uncached one
    Then an unknown one is TaskDefinitionNotFound (ECS's code kept), the cached adapter asks
    ECS once, the uncached one every time."""
    arn = register_task_definition()
    calls = _count_calls(moto_ecs, "DescribeTaskDefinition")
    cached, fresh = TaskDefinitions(moto_ecs), TaskDefinitions(moto_ecs, ttl_seconds=0)
    assert cached.describe("llama-train:1")["taskDefinitionArn"] == arn
    assert cached.describe("llama-train:1")["taskDefinitionArn"] == arn
    assert len(calls) == 1
    fresh.describe("llama-train:1")
    fresh.describe("llama-train:1")
    assert len(calls) == 3
    with pytest.raises(TaskDefinitionNotFound) as found:
        fresh.describe("nope:9")
    assert found.value.code in ("ClientException", "InvalidParameterException")


def test_training_log_reader_maps_a_missing_stream(moto_ecs: Any) -> None:
    """Given a log group without the stream
    When the stream is read, then written and read
    Then LogStreamNotFound first, then the events oldest first with the forward token."""
    reader = TrainingLogReader(boto3.client("logs", region_name=REGION))
    with pytest.raises(LogStreamNotFound):
        reader.read_stream(LOG_GROUP, "train/trainer/abc", limit=10)
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName="train/trainer/abc")
    logs.put_log_events(logGroupName=LOG_GROUP, logStreamName="train/trainer/abc",
                        logEvents=[{"timestamp": int(time.time() * 1000) + i, "message": f"l{i}"}
                                   for i in range(3)])
    page = reader.read_stream(LOG_GROUP, "train/trainer/abc", limit=10)
    assert [e["message"] for e in page["events"]] == ["l0", "l1", "l2"] and page["next_token"]


def _error(code: str, message: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}, operation)


class _RefusingLogs:
    """A logs client answering GetLogEvents with the error CloudWatch Logs gives for a
    token of another stream (moto accepts any token)."""

    def get_log_events(self, **params: Any) -> dict[str, Any]:
        raise _error("InvalidParameterException", "The specified nextToken is invalid.", "GetLogEvents")


class _RefusingEcs:
    """An ECS client answering StopTask with ``error`` (moto raises a bare 500 for an
    unknown task, not ECS's InvalidParameterException)."""

    def __init__(self, error: ClientError) -> None:
        self.error = error

    def stop_task(self, **params: Any) -> dict[str, Any]:
        raise self.error


def test_training_log_reader_maps_a_refused_token_only_when_one_was_given() -> None:
    reader = TrainingLogReader(_RefusingLogs())
    with pytest.raises(InvalidLogToken):
        reader.read_stream("g", "s", limit=1, next_token="f/123")
    with pytest.raises(ClientError):
        reader.read_stream("g", "s", limit=1)


def test_ecs_adapter_container_instances_by_status_and_unknown_stop(moto_ecs: Any) -> None:
    """Given two nodes, one of them DRAINING
    When the nodes are read as the scheduler (ACTIVE), the capacity check (no filter) and the
    breaker (ACTIVE + DRAINING) read them
    Then each sees its own set."""
    arns = add_gpu_instances([8, 8])
    moto_ecs.update_container_instances_state(cluster=CLUSTER, containerInstances=[arns[1]],
                                              status="DRAINING")
    ecs = EcsAdapter(moto_ecs, CLUSTER)

    def seen(statuses: Any) -> list[str]:
        return sorted(i["containerInstanceArn"] for i in ecs.container_instances(statuses))

    assert seen(("ACTIVE",)) == [arns[0]]
    assert seen((None,)) == sorted(arns)
    assert seen(("ACTIVE", "DRAINING")) == sorted(arns)


@pytest.mark.parametrize("code", ["InvalidParameterException", "ClientException"])
def test_stop_task_if_known_is_false_for_a_task_ecs_no_longer_knows(code: str) -> None:
    """Given ECS refuses a StopTask as an unknown task (InvalidParameterException or
    ClientException), then throttles one
    When the jobs API's cancel stops it
    Then the first is False (nothing left to stop), the throttle is raised."""
    ecs = EcsAdapter(_RefusingEcs(_error(code, "The referenced task was not found.", "StopTask")), CLUSTER)
    assert ecs.stop_task_if_known("arn:aws:ecs:us-east-1:1:task/c/abc", "canceled") is False
    throttled = EcsAdapter(_RefusingEcs(_error("ThrottlingException", "Rate exceeded", "StopTask")), CLUSTER)
    with pytest.raises(ClientError):
        throttled.stop_task_if_known("arn:aws:ecs:us-east-1:1:task/c/abc", "canceled")
