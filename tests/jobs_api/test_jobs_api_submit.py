"""POST /v1/jobs: validation (400 naming the field), 413, AWS checks, item contract, idempotency."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest

from gpu_recovery.adapters.scheduler_trigger import LambdaInvoker
from gpu_recovery.constants import queue_order
from gpu_recovery.queue.jobs_api.triggers import LambdaSchedulerTrigger, scheduler_payload
from handlers import jobs_api
from tests.jobs_api.api_harness import (
    ALICE,
    BOB,
    CLUSTER,
    OPS,
    START,
    Api,
    add_gpu_instances,
    register_task_definition,
    valid_spec,
)

JOB_ID_RE = re.compile(r"^llama-ft-20261120-143201-[0-9a-f]{4}$")


def test_submit_creates_the_queue_job_item(api: Api) -> None:
    """Given a valid spec from alice
    When it is submitted
    Then 201 with a readable job id, and the job item follows the queue contract."""
    status, body, headers = api.call("POST", "/v1/jobs", body=valid_spec())
    assert status == 201
    assert JOB_ID_RE.match(body["job_id"]), body["job_id"]
    assert body["state"] == "QUEUED"
    assert body["priority"] == 30 and body["priority_name"] == "HIGH"
    assert headers["Location"] == f"/v1/jobs/{body['job_id']}"
    item = api.job_table.get_item(Key={"job_id_rank": f"{body['job_id']}#JOB"})["Item"]
    assert item["item_type"] == "JOB" and item["source"] == "queue"
    assert item["user"] == ALICE and item["name"] == "llama-ft"
    assert item["priority"] == 30 and item["submitted_at"] == Decimal(repr(START))
    assert item["world_size"] == 2 and item["gpus_per_node"] == 8
    assert item["attempt"] == 0 and item["recoveries_used"] == 0
    # The two budgets: infrastructure recoveries 3 and application-error restarts 0 by default.
    assert item["max_recovery_attempts"] == 3 and item["max_app_restarts"] == 0
    assert item["queue_bucket"] == "QUEUE"
    assert item["queue_order"] == queue_order(30, START, body["job_id"])
    assert item["list_bucket"] == "JOB" and item["not_before"] == 0
    assert item["attempts"] == [] and item["last_error"] == ""
    assert item["history"] == [{"at": Decimal(repr(START)), "from": "", "to": "QUEUED",
                                "reason": "submitted", "actor": ALICE}]
    spec = json.loads(item["spec_json"])
    assert spec["task_definition"].endswith(":task-definition/llama-train:1"), "pinned to the ARN"
    assert spec["container_name"] == "trainer"
    assert spec["overrides"]["environment"] == [{"name": "EPOCHS", "value": "3"}]
    assert api.triggers == [scheduler_payload("submitted", body["job_id"])]


def test_job_id_slug_is_bounded(api: Api) -> None:
    """Given a long mixed-case name with dots
    When submitted
    Then the id's slug is lowercase [a-z0-9-], at most 40 characters."""
    status, body = api.submit(valid_spec(name="My.Very_Long" + "X" * 50))
    assert status == 201
    slug = body["job_id"].rsplit("-", 3)[0]
    assert re.fullmatch(r"[a-z0-9-]{1,40}", slug) and slug.startswith("my-very-long")


def test_caller_falls_back_to_local_user_header(api: Api) -> None:
    """Given a request without an IAM identity (local mode)
    When submitted with X-Local-User, and without it
    Then the header names the user, else the local default."""
    _, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(), user_arn=None,
                          headers={"X-Local-User": "carol"})
    assert body["user"] == "carol"
    _, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(), user_arn=None)
    assert body["user"] == jobs_api.DEFAULT_LOCAL_USER


def test_iam_identity_wins_over_local_header(api: Api) -> None:
    """Given a signed request that also sends X-Local-User
    When submitted
    Then the IAM user ARN is the owner (the header cannot impersonate)."""
    _, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(), headers={"X-Local-User": "mallory"})
    assert body["user"] == ALICE


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"nnodes": 0}, "nnodes", "nnodes: must be >= 1"),
        ({"nnodes": 1025}, "nnodes", "nnodes: must be <= 1024"),
        ({"gpus_per_node": 0}, "gpus_per_node", "gpus_per_node: must be >= 1"),
        ({"gpus_per_node": 17}, "gpus_per_node", "gpus_per_node: must be <= 16"),
        ({"nnodes": "two"}, "nnodes", "nnodes: must be an integer"),
        ({"name": ""}, "name", None),
        ({"name": "a b"}, "name", "name: has an invalid format"),
        ({"name": "x" * 65}, "name", None),
        ({"task_definition": "not a task def!"}, "task_definition", None),
        ({"priority": 7}, "priority", None),
        ({"priority": "URGENT"}, "priority", None),
        ({"priority": True}, "priority", None),
        ({"max_recovery_attempts": 21}, "max_recovery_attempts", "max_recovery_attempts: must be <= 20"),
        ({"max_app_restarts": 21}, "max_app_restarts", "max_app_restarts: must be <= 20"),
        ({"max_recovery_attempts": -1}, "max_recovery_attempts", "max_recovery_attempts: must be >= 0"),
        ({"labels": {f"k{i}": "v" for i in range(21)}}, "labels", None),
        ({"labels": {"k": "v" * 257}}, "labels", None),
        ({"overrides": {"command": "torchrun"}}, "overrides.command", None),
        ({"overrides": {"environment": {"1BAD": "x"}}}, "overrides.environment.0.name", None),
        ({"overrides": {"cmd": ["x"]}}, "overrides.cmd",
         "overrides.cmd: is not a known field (did you mean command?)"),
        ({"unknown": 1}, "unknown", "unknown: is not a known field (known: name, task_definition, "
                                    "container_name, overrides, nnodes, gpus_per_node, priority, "
                                    "suspend_grace_seconds, max_infra_recoveries, max_app_restarts, "
                                    "max_recovery_attempts, labels, network, preflight)"),
        ({"nnodes": None}, "nnodes", "nnodes: is required"),
        ({"preflight": "sometimes"}, "preflight", None),
    ],
)
def test_invalid_spec_is_400_naming_the_field(api: Api, changes: dict[str, Any], field: str,
                                              message: str | None) -> None:
    """Given a spec with one bad field
    When submitted
    Then 400 with {"message": "<field>: ...", "field": "<field>"} and nothing is stored."""
    spec = valid_spec(**changes)
    if changes.get("nnodes", 1) is None:
        spec.pop("nnodes", None)
    status, body = api.submit(spec)
    assert status == 400, body
    assert body["field"] == field
    assert body["message"].startswith(f"{field}: ")
    assert body["error"] == "validation_error"
    if message:
        assert body["message"] == message
    assert api.triggers == []


def test_a_misspelt_required_key_is_named_as_unknown_not_the_field_as_missing(api: Api) -> None:
    """Given a spec with `nnode: 2` (nnodes misspelt: the real key is then missing too)
    When submitted
    Then 400 naming the key that is wrong and the one meant, not only "nnodes: is required"."""
    spec = valid_spec()
    spec["nnode"] = spec.pop("nnodes")
    status, body = api.submit(spec)
    assert status == 400
    assert (body["field"], body["message"]) == ("nnode", "nnode: is not a known field (did you mean nnodes?)")


@pytest.mark.parametrize("raw", ["{not json", "[]", '"text"', ""])
def test_malformed_body_is_400(api: Api, raw: str) -> None:
    """Given a body that is not a JSON object
    When submitted
    Then 400 naming the body."""
    status, body, _ = api.call("POST", "/v1/jobs", raw_body=raw)
    assert status == 400, body
    assert body["field"] == "body" or body["message"]


def test_priority_names_and_values(api: Api) -> None:
    """Given priorities as names (any case) and values
    When submitted
    Then they are stored as the numeric level; no priority means NORMAL (10)."""
    for given, stored in (("extreme_high", 50), (5, 5), ("LOW", 0), (None, 10)):
        spec = valid_spec(priority=given)
        status, body = api.submit(spec, user_arn=OPS)  # the highest levels are reserved
        assert status == 201, body
        assert body["priority"] == stored


def test_body_too_large_is_413(api: Api) -> None:
    """Given a body over the limit
    When submitted
    Then 413 before any parsing."""
    spec = valid_spec(labels={"pad": "x" * (jobs_api.MAX_BODY_BYTES + 1)})
    status, body = api.submit(spec)
    assert status == 413
    assert body["error"] == "payload_too_large"


def test_unknown_task_definition_is_400(api: Api) -> None:
    """Given a task definition ECS does not know
    When submitted
    Then 400 naming task_definition."""
    status, body = api.submit(valid_spec(task_definition="nope-train:9"))
    assert status == 400
    assert body["field"] == "task_definition"
    assert "does not exist" in body["message"]


def test_unknown_container_is_400(api: Api) -> None:
    """Given a container name not in the task definition
    When submitted
    Then 400 naming container_name."""
    status, body = api.submit(valid_spec(container_name="sidecar"))
    assert status == 400 and body["field"] == "container_name"


def test_more_gpus_per_node_than_any_node_is_400(api: Api) -> None:
    """Given a cluster whose largest node has 8 GPUs and a task definition reserving 16
    When a job asks for 16 GPUs per node
    Then 400 'could never run' naming gpus_per_node."""
    register_task_definition(family="big-train", gpus=16)
    status, body = api.submit(valid_spec(task_definition="big-train:1", gpus_per_node=16, nnodes=1))
    assert status == 400
    assert body["field"] == "gpus_per_node"
    assert "could never run" in body["message"] and "has 8" in body["message"]


def test_capacity_is_cached_briefly(api: Api) -> None:
    """Given the capacity was read once
    When a bigger node joins right after
    Then the cached maximum is used until it expires."""
    register_task_definition(family="big-train", gpus=16)
    assert api.submit(valid_spec(task_definition="big-train:1", gpus_per_node=16, nnodes=1))[0] == 400
    add_gpu_instances([16])
    assert api.submit(valid_spec(task_definition="big-train:1", gpus_per_node=16, nnodes=1))[0] == 400
    jobs_api.service().capacity.ttl = 0  # the cache expired
    assert api.submit(valid_spec(task_definition="big-train:1", gpus_per_node=16, nnodes=1))[0] == 201


def test_idempotent_submit_returns_the_same_job(api: Api) -> None:
    """Given a submission with an Idempotency-Key
    When it is retried with the same key and body
    Then the same job id is returned (201, Idempotent-Replayed) and only one job exists."""
    headers = {"Idempotency-Key": "req-1"}
    s1, b1, h1 = api.call("POST", "/v1/jobs", body=valid_spec(), headers=headers)
    api.tick(5)
    s2, b2, h2 = api.call("POST", "/v1/jobs", body=valid_spec(), headers=headers)
    assert (s1, s2) == (201, 201)
    assert b1["job_id"] == b2["job_id"]
    assert "Idempotent-Replayed" not in h1 and h2["Idempotent-Replayed"] == "true"
    _, listing, _ = api.call("GET", "/v1/jobs")
    assert [j["job_id"] for j in listing["jobs"]] == [b1["job_id"]]
    assert len(api.triggers) == 1


def test_same_key_different_body_is_409(api: Api) -> None:
    """Given a key already used
    When it is reused with a different body
    Then 409 (Powertools payload validation) and no second job."""
    headers = {"idempotency-key": "req-2"}
    assert api.call("POST", "/v1/jobs", body=valid_spec(), headers=headers)[0] == 201
    status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(nnodes=1), headers=headers)
    assert status == 409 and body["error"] == "idempotency_key_reused"
    assert len(api.call("GET", "/v1/jobs")[1]["jobs"]) == 1


def test_idempotency_key_is_scoped_to_the_caller(api: Api) -> None:
    """Given alice used a key
    When bob uses the same key
    Then bob gets his own job."""
    headers = {"Idempotency-Key": "shared"}
    _, a, _ = api.call("POST", "/v1/jobs", body=valid_spec(), headers=headers)
    _, b, _ = api.call("POST", "/v1/jobs", body=valid_spec(), headers=headers, user_arn=BOB)
    assert a["job_id"] != b["job_id"] and b["user"] == BOB


def test_failed_submission_is_not_remembered(api: Api) -> None:
    """Given a keyed submission refused with 400 (unknown task definition)
    When the task definition is registered and the same request retried
    Then it succeeds (Powertools drops the record of a failed call)."""
    headers = {"Idempotency-Key": "req-3"}
    spec = valid_spec(task_definition="later-train:1")
    assert api.call("POST", "/v1/jobs", body=spec, headers=headers)[0] == 400
    register_task_definition(family="later-train")
    assert api.call("POST", "/v1/jobs", body=spec, headers=headers)[0] == 201


class _FakeLambda:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {"StatusCode": 202}


def test_lambda_trigger_invokes_the_scheduler_asynchronously(api: Api) -> None:
    """Given the scheduler function is configured
    When a job is submitted
    Then the scheduler is invoked with InvocationType Event and the job id."""
    fake = _FakeLambda()
    jobs_api.set_scheduler_trigger(LambdaSchedulerTrigger(LambdaInvoker(fake, "gpu-scheduler")))
    _, body = api.submit()
    assert len(fake.calls) == 1
    call = fake.calls[0]
    assert call["FunctionName"] == "gpu-scheduler" and call["InvocationType"] == "Event"
    payload = json.loads(call["Payload"])
    assert payload["reason"] == "submitted" and payload["job_id"] == body["job_id"]


def test_trigger_failure_does_not_fail_the_submission(api: Api) -> None:
    """Given the scheduler cannot be invoked
    When a job is submitted
    Then it is still accepted (the scheduler's schedule catches up)."""

    class Broken:
        def trigger(self, reason: str, job_id: str) -> None:
            raise RuntimeError("throttled")

    jobs_api.set_scheduler_trigger(Broken())
    assert api.submit()[0] == 201


def test_environment_selects_the_lambda_trigger(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given SCHEDULER_FUNCTION_NAME is set and no in-process trigger installed
    When the service is built
    Then it triggers the scheduler through Lambda Invoke."""
    jobs_api.reset()
    monkeypatch.setenv("SCHEDULER_FUNCTION_NAME", "gpu-scheduler")
    service = jobs_api.service()
    assert isinstance(service.scheduler, LambdaSchedulerTrigger)
    assert service.scheduler.function_name == "gpu-scheduler"
    assert service.cluster == CLUSTER


def test_the_job_spec_sets_both_budgets(api) -> None:  # type: ignore[no-untyped-def]
    """Given a spec with its own budgets, Then the job item carries them (the infrastructure
    one under its older name too); two different values for it are refused."""
    status, body, _ = api.call("POST", "/v1/jobs", body={**valid_spec(), "max_infra_recoveries": 5,
                                                          "max_app_restarts": 2})
    assert status == 201
    item = api.job_table.get_item(Key={"job_id_rank": f"{body['job_id']}#JOB"})["Item"]
    assert (item["max_recovery_attempts"], item["max_app_restarts"]) == (5, 2)
    status, body, _ = api.call("POST", "/v1/jobs", body={**valid_spec(), "max_infra_recoveries": 5,
                                                          "max_recovery_attempts": 2})
    assert status == 400 and "max_infra_recoveries" in json.dumps(body)
