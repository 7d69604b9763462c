"""POST /v1/jobs makes one job per request, however its tries end: a retry after the first
try wrote the job and died (its Powertools record expired), a write DynamoDB carried out
whose answer botocore lost and sent again."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from gpu_recovery.adapters import aws
from gpu_recovery.queue.jobs_api.triggers import CallbackSchedulerTrigger
from handlers import jobs_api
from tests.jobs_api.api_harness import IDEMPOTENCY_TABLE, JOB_TABLE, REGION, Api, valid_spec


class InvocationKilled(BaseException):
    """Lambda ends the invocation (its timeout): nothing in the function catches it."""


class _DiesAfterTheWrite:
    """The scheduler's wake-up, the first thing after the job is written: the invocation dies."""

    def trigger(self, reason: str, job_id: str) -> None:
        raise InvocationKilled(job_id)


def _first_try_dies_after_writing_the_job(api: Api, key: str) -> str:
    """The first try writes the job and dies; its Powertools record is left INPROGRESS until
    the invocation's deadline, which then passes. Returns the job it wrote."""
    jobs_api.set_scheduler_trigger(_DiesAfterTheWrite())
    with pytest.raises(InvocationKilled):
        api.call("POST", "/v1/jobs", body=valid_spec(), headers={"Idempotency-Key": key})
    jobs_api.set_scheduler_trigger(CallbackSchedulerTrigger(api.triggers.append))
    records = boto3.resource("dynamodb", region_name=REGION).Table(IDEMPOTENCY_TABLE)
    [record] = records.scan()["Items"]
    assert record["status"] == "INPROGRESS"
    records.update_item(Key={"id": record["id"]}, UpdateExpression="SET in_progress_expiration = :gone",
                        ExpressionAttributeValues={":gone": 1})
    [job] = api.call("GET", "/v1/jobs")[1]["jobs"]
    return str(job["job_id"])


def test_a_retry_after_the_first_try_died_returns_the_job_it_wrote(api: Api) -> None:
    """Given a keyed submission whose invocation died right after writing the job (Lambda's
    timeout: the client never heard back) and whose Powertools record then expired
    When the client retries with the same key and body
    Then 201 names the job the first try wrote (Idempotent-Replayed), no second job exists,
    and the scheduler is woken for it (the first try died before it could)."""
    written = _first_try_dies_after_writing_the_job(api, "req-died")
    api.tick(60)
    status, body, headers = api.call("POST", "/v1/jobs", body=valid_spec(),
                                     headers={"Idempotency-Key": "req-died"})
    assert [j["job_id"] for j in api.call("GET", "/v1/jobs")[1]["jobs"]] == [written]
    assert status == 201 and body["job_id"] == written and body["state"] == "QUEUED"
    assert headers["Location"] == f"/v1/jobs/{written}" and headers["Idempotent-Replayed"] == "true"
    assert [t["job_id"] for t in api.triggers] == [written]
    # Powertools now holds the answer: the next retry is its replay, the same body.
    again = api.call("POST", "/v1/jobs", body=valid_spec(), headers={"Idempotency-Key": "req-died"})
    assert (again[0], again[1]) == (201, body)


def test_the_key_of_a_died_try_with_another_body_is_409(api: Api) -> None:
    """Given the same died first try, its record expired
    When the key comes again with a different body
    Then 409 idempotency_key_reused, as Powertools answers it, and still one job."""
    written = _first_try_dies_after_writing_the_job(api, "req-other")
    status, body, _ = api.call("POST", "/v1/jobs", body=valid_spec(nnodes=1),
                               headers={"Idempotency-Key": "req-other"})
    assert (status, body.get("error")) == (409, "idempotency_key_reused"), body
    assert body["message"] == "Idempotency-Key was already used with a different request body"
    assert [j["job_id"] for j in api.call("GET", "/v1/jobs")[1]["jobs"]] == [written]


def _lose_the_answer_of_the_job_write() -> list[str]:
    """botocore sends the write that creates a job item again once DynamoDB carried it out,
    as when its answer is lost (a read timeout, a connection reset): the resend meets the
    write's own condition. Returns the operations resent."""
    resent: list[str] = []

    def send_again(response: Any = None, operation: Any = None, request_dict: Any = None,
                   **_: Any) -> int | None:
        body = (request_dict or {}).get("body") or b""
        body = body.encode() if isinstance(body, str) else body
        if resent or response is None or response[0].status_code != 200:
            return None
        if f'"{JOB_TABLE}"'.encode() not in body or b'#JOB"' not in body:
            return None
        resent.append(operation.name)
        return 0  # botocore sleeps this long, then sends the same request again

    aws.session().events.register("needs-retry.dynamodb", send_again)
    return resent


@pytest.mark.parametrize("headers", [{}, {"Idempotency-Key": "req-lost"}], ids=["no-key", "key"])
def test_a_job_write_whose_answer_was_lost_makes_one_job(api: Api, headers: dict[str, str]) -> None:
    """Given DynamoDB carried out the write of the new job but its answer was lost, so that
    botocore sent it again and that try was refused by the write's own condition
    When the job is submitted (with and without an Idempotency-Key)
    Then 201 names the one job written: no second job under a new id."""
    resent = _lose_the_answer_of_the_job_write()
    status, body, answer = api.call("POST", "/v1/jobs", body=valid_spec(), headers=headers)
    assert resent, "the job's write was sent again"
    assert [j["job_id"] for j in api.call("GET", "/v1/jobs")[1]["jobs"]] == [body.get("job_id")]
    assert status == 201 and "Idempotent-Replayed" not in answer
    assert [t["job_id"] for t in api.triggers] == [body["job_id"]]
