"""Regression tests of issue 8 for the jobs API: every malformed request is a 4xx in the
documented shape (they were 502s or silently accepted), and job ownership and the
task-definition / role / priority rules (any caller could act on any job)."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import boto3
import pytest

from gpu_recovery.constants import DEFAULT_HEALTH_CHECK_FAMILY
from handlers import jobs_api
from tests.jobs_api.api_harness import (
    ALICE,
    BOB,
    OPS,
    REGION,
    Api,
    api_event,
    register_task_definition,
    start_job,
    valid_spec,
)

TEAM = "ml-team"
TEAM_A = f"arn:aws:sts::111122223333:assumed-role/{TEAM}/carol"
TEAM_B = f"arn:aws:sts::111122223333:assumed-role/{TEAM}/dave"


def call_raw(event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    from tests.jobs_api.api_harness import FakeContext

    response = jobs_api.lambda_handler(event, FakeContext())
    return response["statusCode"], json.loads(response["body"])


def submit_event(raw_body: str, content_type: str = "application/json", b64: bool = False) -> dict:
    event = api_event("POST", "/v1/jobs", raw_body=raw_body, headers={"Content-Type": content_type})
    event["isBase64Encoded"] = b64
    return event


def access(**changes: Any) -> None:
    service = jobs_api.service()
    assert service.access is not None
    service.access = dataclasses.replace(service.access, **changes)


def assert_error(status: int, body: dict[str, Any], expected: int, field: str | None = None) -> None:
    assert status == expected, body
    assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str), body
    if field is not None:
        assert body.get("field") == field, body


def job_count(api: Api) -> int:
    return sum(1 for i in api.job_table.scan()["Items"] if i.get("item_type") == "JOB")


# --------------------------------------------------------------------- no 5xx
@pytest.mark.parametrize(
    ("event", "status", "field"),
    [
        (submit_event(base64.b64encode(b'{"name": "\xff\xfe"}').decode(), b64=True), 400, "body"),
        (submit_event("--x\r\n", "multipart/form-data"), 415, "Content-Type"),
        (submit_event("name=x", "application/x-www-form-urlencoded"), 415, "Content-Type"),
        (submit_event("{}", "text/plain"), 415, "Content-Type"),
        (submit_event("[" * 60_000 + "]" * 60_000), 400, "body"),
        (submit_event(json.dumps(valid_spec(labels={"x": "\ud800"}))), 400, "body"),
        (submit_event("{" + '"a":' * 3 + "1" * 5000 + "}" * 3), 400, "body"),
        (submit_event("not json"), 400, "body"),
    ],
)
def test_malformed_bodies_are_4xx_in_the_error_shape(api: Api, event, status, field) -> None:
    """Non-UTF-8 body, multipart without boundary, a form, JSON 60,000 deep, a lone
    surrogate, a 5,000-digit number, not JSON: 4xx naming the field (were 502s), no job."""
    got, body = call_raw(event)
    assert_error(got, body, status, field)
    assert job_count(api) == 0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"gpus_per_node": True}, "gpus_per_node"),
        ({"nnodes": True}, "nnodes"),
        ({"nnodes": "2"}, "nnodes"),
        ({"max_recovery_attempts": False}, "max_recovery_attempts"),
        ({"nnodes": 256}, "nnodes"),
        ({"overrides": {"command": ["x" * 8000, "y" * 8000]}}, "overrides"),
        ({"overrides": {"command": ["python"], "environment": {f"V{i}": "v" * 100 for i in range(80)}}},
         "overrides"),
    ],
)
def test_specs_that_could_never_run_are_400(api: Api, changes: dict[str, Any], field: str) -> None:
    """gpus_per_node: true (was accepted as 1), nnodes 256 on a 2-node cluster (stayed
    QUEUED forever), overrides over ECS's 8 KiB (a 120 KB command was accepted)."""
    status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(**changes))
    assert_error(status, body, 400, field)
    assert job_count(api) == 0


def test_body_too_large_is_413_in_the_error_shape(api: Api) -> None:
    status, body = call_raw(submit_event("x" * (jobs_api.MAX_BODY_BYTES + 1)))
    assert_error(status, body, 413, "body")


# ------------------------------------------------------------------ ownership
def test_owner_is_the_callers_principal_and_others_get_403(api: Api) -> None:
    """Given alice's job, Then bob gets 403 reading, listing as alice, reading events and
    logs, and canceling it (the rule is named); alice and an admin role may."""
    status, job = api.submit()
    assert status == 201 and job["user"] == ALICE
    job_id = job["job_id"]
    for method, suffix in (("GET", ""), ("GET", "/events"), ("GET", "/logs"), ("POST", "/cancel")):
        status, body, _ = api.call(method, f"/v1/jobs/{job_id}{suffix}", user_arn=BOB)
        assert_error(status, body, 403)
        assert body["error"] == "forbidden:ownership" and "ownership" in body["message"], body
    status, body, _ = api.call("GET", "/v1/jobs", query={"user": ALICE}, user_arn=BOB)
    assert_error(status, body, 403, "user")
    assert api.call("GET", "/v1/jobs", user_arn=BOB)[1]["jobs"] == []
    assert api.call("GET", f"/v1/jobs/{job_id}", user_arn=ALICE)[0] == 200
    assert api.call("GET", f"/v1/jobs/{job_id}", user_arn=OPS)[0] == 200
    assert [j["job_id"] for j in api.call("GET", "/v1/jobs", user_arn=OPS)[1]["jobs"]] == [job_id]
    status, body, _ = api.call("POST", f"/v1/jobs/{job_id}/cancel", user_arn=ALICE)
    assert status == 200 and body["state"] == "CANCELED"


def test_team_role_sessions_share_jobs(api: Api) -> None:
    access(team_roles=(TEAM,))
    status, job = api.submit(user_arn=TEAM_A)
    assert status == 201
    item = api.job_table.get_item(Key={"job_id_rank": f"{job['job_id']}#JOB"})["Item"]
    assert item["user"] == TEAM_A and item["owner_role"] == TEAM
    assert api.call("GET", f"/v1/jobs/{job['job_id']}", user_arn=TEAM_B)[0] == 200
    assert api.call("GET", "/v1/jobs", query={"user": TEAM_A}, user_arn=TEAM_B)[0] == 200
    assert api.call("GET", f"/v1/jobs/{job['job_id']}", user_arn=BOB)[0] == 403
    assert api.call("POST", f"/v1/jobs/{job['job_id']}/cancel", user_arn=TEAM_B)[0] == 200


def test_tag_registered_jobs_are_for_admins_only(api: Api) -> None:
    """A job registered from ECS task tags (not submitted through the queue) is read and
    canceled here only by an admin role."""
    _, job = api.submit()
    start_job(api, job["job_id"])
    api.job_table.update_item(Key={"job_id_rank": f"{job['job_id']}#JOB"},
                              UpdateExpression="SET #s = :s REMOVE #u",
                              ExpressionAttributeNames={"#s": "source", "#u": "user"},
                              ExpressionAttributeValues={":s": "ecs-tags"})
    status, body, _ = api.call("POST", f"/v1/jobs/{job['job_id']}/cancel", user_arn=ALICE)
    assert_error(status, body, 403)
    assert body["error"] == "forbidden:tag_registered" and "admin role" in body["message"]
    assert api.call("GET", f"/v1/jobs/{job['job_id']}", user_arn=ALICE)[0] == 403
    status, body, _ = api.call("POST", f"/v1/jobs/{job['job_id']}/cancel", user_arn=OPS)
    assert status == 200 and body["state"] in ("CANCELING", "CANCELED"), body


# --------------------------------------------------------------- submit policy
def test_health_check_family_is_never_accepted(api: Api) -> None:
    """Even for an admin and with every family allowed: 403 naming the rule."""
    register_task_definition(family=DEFAULT_HEALTH_CHECK_FAMILY)
    for who in (ALICE, OPS):
        status, body, _ = api.call("POST", "/v1/jobs", user_arn=who, body=valid_spec(
            task_definition=f"{DEFAULT_HEALTH_CHECK_FAMILY}:1"))
        assert_error(status, body, 403, "task_definition")
        assert body["error"] == "forbidden:task_definition_family"
    assert job_count(api) == 0


def test_configured_health_check_task_is_never_accepted(api: Api, monkeypatch) -> None:
    from gpu_recovery.constants import ENV_HEALTH_CHECK_TASK

    monkeypatch.setenv(ENV_HEALTH_CHECK_TASK, "arn:aws:ecs:us-east-1:123456789012:task-definition/my-dcgm:3")
    from gpu_recovery.settings import access_policy

    jobs_api.service().access = access_policy()
    register_task_definition(family="my-dcgm")
    status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(task_definition="my-dcgm:1"))
    assert_error(status, body, 403, "task_definition")


def test_family_allow_list(api: Api) -> None:
    access(allowed_families=("llama-*",))
    register_task_definition(family="other-train")
    status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(task_definition="other-train:1"))
    assert_error(status, body, 403, "task_definition")
    assert "allowed families" in body["message"] and "llama-*" in body["message"]
    assert api.submit()[0] == 201


def test_task_roles_outside_the_prefix_are_refused(api: Api) -> None:
    access(task_role_prefixes=("gpu-training-",))
    ecs = boto3.client("ecs", region_name=REGION)
    for family, role in (("evil-train", "admin-role"), ("ok-train", "gpu-training-llama")):
        ecs.register_task_definition(
            family=family, taskRoleArn=f"arn:aws:iam::123456789012:role/{role}",
            containerDefinitions=[{"name": "trainer", "image": "x", "memory": 512}])
    status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(task_definition="evil-train:1"))
    assert_error(status, body, 403, "task_definition")
    assert body["error"] == "forbidden:task_role" and "admin-role" in body["message"]
    assert api.submit(valid_spec(task_definition="ok-train:1"))[0] == 201


def test_highest_priorities_are_reserved(api: Api) -> None:
    for level in ("VERY_HIGH", "EXTREME_HIGH", 50):
        status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(priority=level))
        assert_error(status, body, 403, "priority")
        assert body["error"] == "forbidden:reserved_priority"
    access(reserved_priority_roles=(TEAM,))
    assert api.submit(valid_spec(priority="EXTREME_HIGH"), user_arn=TEAM_A)[0] == 201
    assert api.submit(valid_spec(priority="HIGH"))[0] == 201


def test_a_job_item_without_a_source_is_not_anyones_queue_job() -> None:
    """An item that says nothing of its origin (written before ``source`` existed, or by
    another tool) is treated as tag-registered: only admins read or cancel it."""
    from gpu_recovery.queue.access import AccessPolicy, Denied, Principal

    policy = AccessPolicy(admin_roles=("gpu-ops",))
    job = {"job_id": "legacy-1", "user": "arn:aws:iam::111122223333:user/alice"}
    with pytest.raises(Denied) as denied:
        policy.check_read(Principal.parse("arn:aws:iam::111122223333:user/alice"), job)
    assert denied.value.rule == "tag_registered"
    policy.check_read(Principal.parse("arn:aws:sts::111122223333:assumed-role/gpu-ops/oncall"), job)
