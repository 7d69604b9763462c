"""GET /v1/jobs/{id}/logs: the rank's awslogs stream, paged with next_token (moto logs)."""

from __future__ import annotations

import boto3

from tests.jobs_api.api_harness import (
    CONTAINER,
    INSTANCE_TABLE,
    JOB_TABLE,
    LOG_GROUP,
    LOG_PREFIX,
    REGION,
    Api,
    register_task_definition,
    start_job,
    valid_spec,
)


def _write_log(task_arn: str, lines: list[str], start_ms: int = 1_795_185_200_000) -> str:
    logs = boto3.client("logs", region_name=REGION)
    stream = f"{LOG_PREFIX}/{CONTAINER}/{task_arn.rsplit('/', 1)[-1]}"
    logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=[
        {"timestamp": start_ms + i, "message": line} for i, line in enumerate(lines)])
    return stream


def test_logs_of_a_rank_are_paged(api: Api) -> None:
    """Given rank 1 of a running job wrote 5 lines to its awslogs stream
    When its logs are read 2 at a time with next_token
    Then the lines come back in order from <prefix>/<container>/<task-id>, then end_of_stream."""
    _, job = api.submit()
    arns = start_job(api, job["job_id"])
    stream = _write_log(arns[1], [f"line {i}" for i in range(5)])
    seen, token = [], None
    for _ in range(5):
        query = {"rank": "1", "limit": "2", **({"next_token": token} if token else {})}
        status, body, _ = api.call("GET", f"/v1/jobs/{job['job_id']}/logs", query=query)
        assert status == 200, body
        assert body["log_group"] == LOG_GROUP and body["log_stream"] == stream
        assert body["task_arn"] == arns[1] and body["attempt"] == 1 and body["rank"] == 1
        seen.extend(e["message"] for e in body["events"])
        token = body["next_token"]
        if body["end_of_stream"]:
            break
    assert seen == [f"line {i}" for i in range(5)]


def test_logs_read_past_empty_pages_and_end_only_when_the_token_comes_back(api: Api) -> None:
    """Given rank 1 wrote 5 lines and CloudWatch Logs answers 2 events a page with an empty
    page every second call (``local_mode.sim.log_pages``; moto answers whole streams)
    When its logs are read page by page with next_token
    Then no page is empty while lines remain (the API follows an empty page's token), every
    line comes back in order, and end_of_stream comes only with the unchanged token."""
    from gpu_recovery.adapters import aws
    from local_mode.sim.answers import DocumentedAnswers
    from local_mode.sim.log_pages import LogPaging

    DocumentedAnswers(paging=LogPaging(page_events=2, empty_every=2, visible_after=0)).install(
        aws.session().events)
    _, job = api.submit()
    arns = start_job(api, job["job_id"])
    _write_log(arns[1], [f"line {i}" for i in range(5)])
    seen, token, pages = [], None, []
    for _ in range(10):
        query = {"rank": "1", **({"next_token": token} if token else {})}
        status, body, _ = api.call("GET", f"/v1/jobs/{job['job_id']}/logs", query=query)
        assert status == 200, body
        pages.append((len(body["events"]), body["end_of_stream"]))
        seen.extend(e["message"] for e in body["events"])
        token = body["next_token"]
        if body["end_of_stream"]:
            break
    assert seen == [f"line {i}" for i in range(5)]
    assert pages[-1] == (0, True) and all(count for count, _ in pages[:-1])


def test_logs_default_to_rank_0_of_the_current_attempt(api: Api) -> None:
    """Given rank 0 logged one line
    When logs are read without parameters
    Then rank 0's line is returned."""
    _, job = api.submit()
    arns = start_job(api, job["job_id"])
    _write_log(arns[0], ["hello from rank 0"])
    status, body, _ = api.call("GET", f"/v1/jobs/{job['job_id']}/logs")
    assert status == 200 and [e["message"] for e in body["events"]] == ["hello from rank 0"]


def test_logs_of_an_earlier_attempt_read_the_task_the_rank_item_keeps(api: Api) -> None:
    """Given attempt 1 of a 2-rank job logged, then its ranks restarted as attempt 2 (each
    rank item written as the restart writes it: attempt 2's task, attempt 1's kept)
    When attempt 1's logs are read, with and without a rank, and attempt 2's
    Then each reads its own task's stream (one GetItem of the rank item: no attempt record
    holds a job's task ARNs, which would grow with its ranks)."""
    from dataclasses import replace

    from gpu_recovery.repository import Repository, records

    _, job = api.submit()
    job_id = job["job_id"]
    old = start_job(api, job_id, attempt=1)
    for rank, arn in enumerate(old):
        _write_log(arn, [f"attempt one, rank {rank}"])
    repo = Repository(boto3.resource("dynamodb", region_name=REGION), JOB_TABLE, INSTANCE_TABLE)
    first = [repo.jobs.get_rank(job_id, r) for r in range(2)]
    new = start_job(api, job_id, attempt=2)
    for rank, before in enumerate(first):
        assert before is not None
        restarted = replace(before, attempt=2, task_arn=new[rank], earlier_tasks=before.tasks_before(2))
        api.job_table.put_item(Item=records.rank_to_item(restarted))
        _write_log(new[rank], [f"attempt two, rank {rank}"])
    path = f"/v1/jobs/{job_id}/logs"
    for query, line in (({"attempt": "1"}, "attempt one, rank 0"),
                        ({"attempt": "1", "rank": "1"}, "attempt one, rank 1"),
                        ({}, "attempt two, rank 0"), ({"attempt": "2", "rank": "1"}, "attempt two, rank 1")):
        status, body, _ = api.call("GET", path, query=query)
        assert status == 200, (query, body)
        assert [e["message"] for e in body["events"]] == [line], query


def test_an_attempt_whose_task_is_not_kept_is_a_404_saying_why(api: Api) -> None:
    _, job = api.submit()
    start_job(api, job["job_id"], attempt=1)
    start_job(api, job["job_id"], attempt=2)  # rank items written afresh: attempt 1 not kept
    status, body, _ = api.call("GET", f"/v1/jobs/{job['job_id']}/logs", query={"attempt": "1"})
    assert status == 404
    assert body["message"] == ("no task recorded for rank 0 of attempt 1 (it never started, or it is "
                               "more than 8 attempts old)")


def test_logs_errors(api: Api) -> None:
    """Given a queued job, a running one without a stream yet, and bad parameters
    When logs are read
    Then 404 (not started / stream not found) and 400 naming rank / attempt."""
    _, queued = api.submit()
    status, body, _ = api.call("GET", f"/v1/jobs/{queued['job_id']}/logs")
    assert status == 404 and "not started" in body["message"]
    _, job = api.submit()
    start_job(api, job["job_id"])
    path = f"/v1/jobs/{job['job_id']}/logs"
    assert api.call("GET", path)[0] == 404
    status, body, _ = api.call("GET", path, query={"rank": "2"})
    assert status == 400 and body["field"] == "rank"
    status, body, _ = api.call("GET", path, query={"attempt": "3"})
    assert status == 400 and body["field"] == "attempt"
    status, body, _ = api.call("GET", path, query={"rank": "-1"})
    assert status == 400 and body["field"] == "rank"
    # Past the job's ranks: the job's bound, not a fixed one (255 refused the ranks of larger jobs).
    status, body, _ = api.call("GET", path, query={"rank": "300"})
    assert status == 400 and body["field"] == "rank" and "between 0 and 1" in body["message"], body


def test_logs_without_awslogs_is_404(api: Api) -> None:
    """Given a task definition without the awslogs driver
    When a job's logs are read
    Then 404 explaining the container does not log to CloudWatch Logs."""
    register_task_definition(family="quiet-train", log=False)
    _, job = api.submit(valid_spec(task_definition="quiet-train:1"))
    start_job(api, job["job_id"])
    status, body, _ = api.call("GET", f"/v1/jobs/{job['job_id']}/logs")
    assert status == 404 and "awslogs" in body["message"]
