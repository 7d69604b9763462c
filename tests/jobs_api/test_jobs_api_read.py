"""GET /v1/jobs/{id}, GET /v1/jobs (pagination, filters, no Scan), GET .../events."""

from __future__ import annotations

import base64
import json
from decimal import Decimal

import pytest

from tests.jobs_api.api_harness import ALICE, BOB, OPS, Api, set_state, start_job, valid_spec


def _submit_many(api: Api, count: int, user: str = ALICE, name: str = "job") -> list[str]:
    ids = []
    for i in range(count):
        api.tick(1)
        status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(name=f"{name}{i}"), user_arn=user)
        assert status == 201
        ids.append(body["job_id"])
    return ids


def _all_pages(api: Api, query: dict[str, str], user: str = OPS) -> tuple[list[str], int]:
    ids, pages, token = [], 0, None
    while True:
        q = dict(query, **({"next_token": token} if token else {}))
        status, body, _ = api.call("GET", "/v1/jobs", query=q, user_arn=user)
        assert status == 200, body
        pages += 1
        ids.extend(j["job_id"] for j in body["jobs"])
        token = body["next_token"]
        if not token:
            return ids, pages


def test_get_unknown_job_is_404(api: Api) -> None:
    """Given no such job
    When it is read (and its events, cancel, logs)
    Then 404 with a message."""
    for method, suffix in (("GET", ""), ("GET", "/events"), ("POST", "/cancel"), ("GET", "/logs")):
        status, body, _ = api.call(method, f"/v1/jobs/nope-20261120-000000-abcd{suffix}")
        assert status == 404, (suffix, body)
        assert body["error"] == "not_found" and "nope" in body["message"]


def test_bad_job_id_is_400(api: Api) -> None:
    """Given a path id that cannot be a job id
    When it is read
    Then 400 naming job_id."""
    status, body, _ = api.call("GET", "/v1/jobs/UPPER_case")
    assert status == 400 and body["field"] == "job_id"


def test_unknown_route_is_404(api: Api) -> None:
    """Given a path the API does not serve
    When called
    Then 404 in the error shape."""
    status, body, _ = api.call("GET", "/v1/nothing")
    assert status == 404 and body["error"] == "not_found"


def test_get_shows_ranks_attempts_and_last_error(api: Api) -> None:
    """Given a running job with two ranks, one recorded attempt and an error
    When it is read
    Then ranks carry task ARN, instance, state, heartbeat; attempts and last_error are shown."""
    _, job = api.submit()
    arns = start_job(api, job["job_id"])
    api.job_table.update_item(
        Key={"job_id_rank": f"{job['job_id']}#JOB"},
        UpdateExpression="SET attempts = :a, last_error = :e",
        ExpressionAttributeValues={
            ":a": [{"attempt": 1, "started_at": Decimal("1795185200.5"), "ended_at": None,
                    "outcome": "", "failure_kind": "", "reason": ""}],
            ":e": "rank 1 failed: exit 1",
        },
    )
    status, body, _ = api.call("GET", f"/v1/jobs/{job['job_id']}")
    assert status == 200
    assert body["state"] == "RUNNING" and body["attempt"] == 1
    assert [r["task_arn"] for r in body["ranks"]] == arns
    assert [r["state"] for r in body["ranks"]] == ["RUNNING", "RUNNING"]
    assert body["ranks"][0]["container_instance_id"] and body["ranks"][0]["ec2_instance_id"]
    assert body["ranks"][0]["last_heartbeat_at"] == api.now[0]
    assert body["attempts"] == [{"attempt": 1, "started_at": 1795185200.5, "ended_at": None,
                                 "outcome": "", "failure_kind": "", "reason": ""}]
    assert body["last_error"] == "rank 1 failed: exit 1"
    assert body["spec"]["name"] == "llama-ft" and body["source"] == "queue"


def test_a_jobs_ranks_come_a_page_at_a_time_with_a_count_of_the_live_ones(api: Api) -> None:
    """Given a running 2-rank job whose rank 1 has ended (its attempt's latch: 2 registered, 1
    ended), When it is read a rank at a time, Then each page holds its rank, ranks_next says where
    the next starts (null after the last) and ranks_live counts 1, read from the latch shard, never
    the rank items of the other page; read whole, no count; a page out of bounds is a 400 that
    names the parameter."""
    from gpu_recovery import constants as C
    from gpu_recovery.domain.latch import Latch

    _, job = api.submit()
    job_id = job["job_id"]
    start_job(api, job_id)
    api.job_table.update_item(
        Key={"job_id_rank": C.latch_shard_key(job_id, 1, 0)},
        UpdateExpression="SET item_type = :t ADD #r :r, #e :e",
        ExpressionAttributeNames={"#r": Latch.REGISTERED.value, "#e": Latch.ENDED.value},
        ExpressionAttributeValues={":t": "LATCH", ":r": {0, 1}, ":e": {1}})
    pages = []
    for first in (0, 1):
        api.ddb_ops.clear()
        status, body, _ = api.call("GET", f"/v1/jobs/{job_id}",
                                   query={"ranks_from": str(first), "ranks_limit": "1"})
        assert status == 200, body
        pages.append(([r["rank"] for r in body["ranks"]], body["ranks_next"], body["ranks_live"]))
        assert api.ddb_ops.count("BatchGetItem") == 2  # the page's rank, the latch shard
    assert pages == [([0], 1, 1), ([1], None, 1)]
    status, body, _ = api.call("GET", f"/v1/jobs/{job_id}")
    assert [r["rank"] for r in body["ranks"]] == [0, 1]
    assert body["ranks_next"] is None and body["ranks_live"] is None
    for query, name in (({"ranks_limit": "0"}, "ranks_limit"), ({"ranks_limit": "1001"}, "ranks_limit"),
                        ({"ranks_from": "-1"}, "ranks_from")):
        status, body, _ = api.call("GET", f"/v1/jobs/{job_id}", query=query)
        assert status == 400 and name in json.dumps(body), (query, body)


def test_list_is_newest_first_and_paginated_without_scan(api: Api) -> None:
    """Given 7 jobs submitted one second apart
    When listed 3 per page
    Then pages are newest first, cover every job once, and no Scan is ever issued."""
    ids = _submit_many(api, 7)
    api.ddb_ops.clear()
    seen, pages = _all_pages(api, {"limit": "3"})
    assert seen == list(reversed(ids))
    assert pages == 3
    assert "Scan" not in api.ddb_ops and "Query" in api.ddb_ops


def test_list_default_limit_is_20(api: Api) -> None:
    """Given 21 jobs
    When listed without a limit
    Then 20 come back with a next_token."""
    _submit_many(api, 21)
    status, body, _ = api.call("GET", "/v1/jobs")
    assert status == 200 and len(body["jobs"]) == 20 and body["next_token"]


def test_list_filters_by_user_and_state(api: Api) -> None:
    """Given jobs of alice and bob in several states
    When filtered by user, by state, and by both (paged by 1)
    Then only the matching jobs come back, newest first, without a Scan."""
    alice = _submit_many(api, 3, ALICE, "a")
    bob = _submit_many(api, 2, BOB, "b")
    set_state(api, alice[0], "PENDING_RESOURCES")
    set_state(api, bob[1], "PENDING_RESOURCES")
    api.ddb_ops.clear()
    assert _all_pages(api, {"user": BOB, "limit": "1"})[0] == list(reversed(bob))
    assert _all_pages(api, {"state": "PENDING_RESOURCES"})[0] == [bob[1], alice[0]]
    assert _all_pages(api, {"state": "QUEUED", "user": ALICE, "limit": "1"})[0] == [alice[2], alice[1]]
    assert _all_pages(api, {"state": "RUNNING"})[0] == []
    assert "Scan" not in api.ddb_ops


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"state": "SLEEPING"}, "state"),
        ({"next_token": "%%%not-base64"}, "next_token"),
        ({"next_token": base64.urlsafe_b64encode(b'{"q":"other","k":{}}').decode()}, "next_token"),
    ],
)
def test_list_bad_query_is_400(api: Api, query: dict[str, str], field: str) -> None:
    """Given a bad query parameter
    When listing
    Then 400 naming it."""
    status, body, _ = api.call("GET", "/v1/jobs", query=query)
    assert status == 400, body
    assert body["field"] == field


def test_token_of_another_filter_is_refused(api: Api) -> None:
    """Given a next_token from the unfiltered listing
    When it is used with a user filter
    Then 400 naming next_token (tokens are bound to their query)."""
    _submit_many(api, 3)
    token = api.call("GET", "/v1/jobs", query={"limit": "1"}, user_arn=OPS)[1]["next_token"]
    json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))  # opaque but decodable
    status, body, _ = api.call("GET", "/v1/jobs", query={"limit": "1", "user": ALICE, "next_token": token},
                               user_arn=OPS)
    assert status == 400 and body["field"] == "next_token"


@pytest.mark.parametrize("tamper", [
    {"submitted_at": float("nan")}, {"submitted_at": 1e200}, {"submitted_at": 10**200},
    {"submitted_at": "soon"}, {"submitted_at": True}, {"job_id_rank": ["x"]}, {"extra": 1},
])
def test_a_tampered_token_is_400_not_an_error(api: Api, tamper: dict[str, object]) -> None:
    """Given a next_token this API returned, its key edited (a NaN, a number DynamoDB cannot
    hold, a list, a key of another index)
    When it is used
    Then 400 naming next_token (the DynamoDB serializer's TypeError was a 500)."""
    _submit_many(api, 3)
    token = api.call("GET", "/v1/jobs", query={"limit": "1"}, user_arn=OPS)[1]["next_token"]
    payload = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    payload["k"].update(tamper)
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
    status, body, _ = api.call("GET", "/v1/jobs", query={"limit": "1", "next_token": forged}, user_arn=OPS)
    assert status == 400, body
    assert body["field"] == "next_token"


def test_events_are_the_history(api: Api) -> None:
    """Given a job submitted then canceled
    When its events are read
    Then they list QUEUED (submitted, by alice) then CANCELED (by an admin), oldest first."""
    _, job = api.submit()
    api.tick(3)
    api.call("POST", f"/v1/jobs/{job['job_id']}/cancel", user_arn=OPS)
    status, body, _ = api.call("GET", f"/v1/jobs/{job['job_id']}/events")
    assert status == 200 and body["state"] == "CANCELED"
    assert [(e["to"], e["actor"]) for e in body["events"]] == [("QUEUED", ALICE), ("CANCELED", OPS)]
    assert body["events"][0]["reason"] == "submitted"
    assert body["events"][1]["from"] == "QUEUED" and body["events"][1]["reason"] == f"canceled by {OPS}"
    assert body["events"][1]["at"] == body["events"][0]["at"] + 3


def test_events_name_the_state_each_transition_really_left(api: Api) -> None:
    """Given a job moved by the recovery loop's conditional transitions (each allowed from
    several states: stored as "STARTING|HUNG" and so on), When its events are
    read, Then FROM is the state it really left (the entry before's TO), not the allowed set."""
    import boto3

    from gpu_recovery.constants import JobState
    from gpu_recovery.queue.jobs_api.reads import previous_states
    from gpu_recovery.repository import Repository
    from tests.jobs_api.api_harness import INSTANCE_TABLE, JOB_TABLE, REGION

    _, job = api.submit()
    repo = Repository(boto3.resource("dynamodb", region_name=REGION), JOB_TABLE, INSTANCE_TABLE)
    for to, sources in ((JobState.STARTING, [JobState.QUEUED]),
                        (JobState.RUNNING, [JobState.STARTING, JobState.HUNG]),
                        (JobState.NODE_LOST, [JobState.STARTING, JobState.RUNNING])):
        api.tick(1)
        assert repo.tables.db.apply(repo.jobs.job_transition(job["job_id"], to, from_states=sources,
                                                             attempt=None, reason="test", actor="recovery"))
    events = api.call("GET", f"/v1/jobs/{job['job_id']}/events")[1]["events"]
    assert [(e["from"], e["to"]) for e in events] == [
        ("", "QUEUED"), ("QUEUED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", "NODE_LOST")]
    # With no entry before (a trimmed history) the allowed states are all that is known.
    assert previous_states([{"from": "RUNNING|NODE_LOST", "to": "HUNG"}]) == ["RUNNING|NODE_LOST"]
