"""POST /v1/jobs/{id}/cancel in every state, and the recovery loop finishing CANCELING."""

from __future__ import annotations

import json

import boto3
import pytest

from gpu_recovery.constants import SYSTEM_STOP_REASON_PREFIX
from tests.jobs_api.api_harness import CLUSTER, OPS, REGION, Api, set_state, start_job


def _cancel(api: Api, job_id: str, user: str = OPS) -> tuple[int, dict]:
    status, body, _ = api.call("POST", f"/v1/jobs/{job_id}/cancel", user_arn=user)
    return status, body


def _job(api: Api, job_id: str) -> dict:
    return api.job_table.get_item(Key={"job_id_rank": f"{job_id}#JOB"})["Item"]


def _task(arn: str) -> dict:
    return boto3.client("ecs", region_name=REGION).describe_tasks(cluster=CLUSTER, tasks=[arn])["tasks"][0]


@pytest.mark.parametrize("state", ["QUEUED", "PENDING_RESOURCES"])
def test_cancel_queued_job_is_immediate(api: Api, state: str) -> None:
    """Given a job waiting in the queue
    When it is canceled
    Then it is CANCELED at once, leaves the queue index, and the scheduler is told."""
    _, job = api.submit()
    set_state(api, job["job_id"], state)
    api.triggers.clear()
    status, body = _cancel(api, job["job_id"])
    assert status == 200
    assert body == {"job_id": job["job_id"], "state": "CANCELED", "previous_state": state,
                    "changed": True, "stopping_ranks": []}
    item = _job(api, job["job_id"])
    assert item["job_state"] == "CANCELED"
    assert "queue_bucket" not in item and "queue_order" not in item
    assert item["history"][-1]["actor"] == OPS and item["history"][-1]["from"] == state
    assert [t["reason"] for t in api.triggers] == ["canceled"]


@pytest.mark.parametrize("state", ["RUNNING", "STARTING", "NODE_LOST", "HUNG"])
def test_cancel_running_job_stops_every_live_rank(api: Api, state: str) -> None:
    """Given a job whose two ranks run on ECS
    When it is canceled
    Then it is CANCELING, both ranks are STOP_REQUESTED and StopTask carries the system prefix."""
    _, job = api.submit()
    arns = start_job(api, job["job_id"], state=state)
    status, body = _cancel(api, job["job_id"])
    assert status == 200
    assert body["state"] == "CANCELING" and body["previous_state"] == state
    assert body["stopping_ranks"] == [0, 1]
    for rank, arn in enumerate(arns):
        task = _task(arn)
        assert task["desiredStatus"] == "STOPPED"
        assert task["stoppedReason"] == f"{SYSTEM_STOP_REASON_PREFIX} canceled by {OPS}"
        rank_item = api.job_table.get_item(Key={"job_id_rank": f"{job['job_id']}#{rank}"})["Item"]
        assert rank_item["rank_state"] == "STOP_REQUESTED"
    assert _job(api, job["job_id"])["job_state"] == "CANCELING"


def test_cancel_is_idempotent_while_canceling(api: Api) -> None:
    """Given a job already CANCELING
    When cancel is called again
    Then 200, unchanged, and StopTask is re-sent (a throttled stop converges)."""
    _, job = api.submit()
    start_job(api, job["job_id"])
    _cancel(api, job["job_id"])
    status, body = _cancel(api, job["job_id"])
    assert status == 200 and body["state"] == "CANCELING" and body["changed"] is False
    assert body["stopping_ranks"] == [0, 1]


def test_cancel_only_stops_live_ranks(api: Api) -> None:
    """Given a job with one rank still running and one already stopped
    When it is canceled
    Then only the live rank is stopped and the job waits in CANCELING."""
    _, job = api.submit()
    arns = start_job(api, job["job_id"], rank_states=["STOPPED", "RUNNING"])
    status, body = _cancel(api, job["job_id"])
    assert status == 200
    assert body["stopping_ranks"] == [1] and body["state"] == "CANCELING"
    assert _task(arns[0])["desiredStatus"] == "RUNNING"


def test_cancel_finishes_when_every_rank_already_stopped(api: Api) -> None:
    """Given a job waiting for a health check whose ranks all stopped
    When it is canceled
    Then it goes through CANCELING straight to CANCELED."""
    _, job = api.submit()
    start_job(api, job["job_id"], state="PENDING_HEALTHCHECK", rank_states=["FAILED", "STOPPED"])
    status, body = _cancel(api, job["job_id"])
    assert status == 200 and body["state"] == "CANCELED" and body["stopping_ranks"] == []
    assert [h["to"] for h in _job(api, job["job_id"])["history"]] == ["QUEUED", "CANCELING", "CANCELED"]


def test_cancel_pending_restart_is_immediate(api: Api) -> None:
    """Given a job waiting for its instance to reboot (no rank runs)
    When it is canceled
    Then it is CANCELED directly (PENDING_RESTART -> CANCELED is the legal move)."""
    _, job = api.submit()
    start_job(api, job["job_id"], state="PENDING_RESTART", rank_states=["STOPPED", "STOPPED"])
    status, body = _cancel(api, job["job_id"])
    assert status == 200 and body["state"] == "CANCELED" and body["changed"] is True


def test_cancel_starting_job_waits_for_unregistered_ranks(api: Api) -> None:
    """Given a STARTING job with only one of two ranks registered
    When it is canceled
    Then it stays CANCELING (the scheduler / task handler stop the rest)."""
    _, job = api.submit()
    start_job(api, job["job_id"], state="STARTING", rank_states=["STOPPED"])
    status, body = _cancel(api, job["job_id"])
    assert status == 200 and body["state"] == "CANCELING"


@pytest.mark.parametrize("state", ["COMPLETE", "FAILED", "USER_STOPPED", "CANCELED"])
def test_cancel_terminal_job_is_a_no_op(api: Api, state: str) -> None:
    """Given a job that already ended
    When it is canceled
    Then 200 with its current state, nothing changes."""
    _, job = api.submit()
    set_state(api, job["job_id"], state)
    before = _job(api, job["job_id"])
    status, body = _cancel(api, job["job_id"])
    assert status == 200
    assert body["state"] == state and body["changed"] is False
    assert _job(api, job["job_id"]) == before


def test_recovery_loop_finishes_canceling(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a canceled running job
    When ECS reports both ranks STOPPED with the system stop reason
    Then the recovery task handler moves the job CANCELING -> CANCELED."""
    from gpu_recovery import runtime
    from tests.jobs_api.api_harness import INSTANCE_TABLE

    monkeypatch.setenv("CONTAINER_INSTANCE_TABLE_NAME", INSTANCE_TABLE)
    _, job = api.submit()
    arns = start_job(api, job["job_id"])
    _cancel(api, job["job_id"])
    ecs = boto3.client("ecs", region_name=REGION)
    service = runtime.recovery_service()
    for arn in arns:
        task = ecs.describe_tasks(cluster=CLUSTER, tasks=[arn], include=["TAGS"])["tasks"][0]
        detail = _stopped_detail(task)
        service.on_task_state_change(detail)
    assert _job(api, job["job_id"])["job_state"] == "CANCELED"


def _stopped_detail(task: dict) -> object:
    from gpu_recovery.events.ecs import EcsTaskStateChangeEvent
    from tests.fixtures.events import load_event

    event = load_event("training_task_stopped_exit1.json")
    detail = event["detail"]
    detail.update(
        {
            "taskArn": task["taskArn"],
            "clusterArn": task["clusterArn"],
            "containerInstanceArn": task["containerInstanceArn"],
            "taskDefinitionArn": task["taskDefinitionArn"],
            "lastStatus": "STOPPED",
            "desiredStatus": "STOPPED",
            "stopCode": "UserInitiated",
            "stoppedReason": task.get("stoppedReason", ""),
            "version": 9,
        }
    )
    for container in detail["containers"]:
        container["taskArn"] = task["taskArn"]
        container["exitCode"] = 143
    return EcsTaskStateChangeEvent.model_validate(event).detail


def test_a_cancel_the_api_finishes_emits_the_jobs_goodput_once(api: Api,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Given a job that started, ran and has waited 100 s for a health check with every rank
    stopped, When it is canceled (the API's own write makes it CANCELED) and canceled again,
    Then the job's end emits GpuHoursLost by Cause (diagnosis, restart: no job or node in the
    dimensions) and JobEttr, once."""
    _, job = api.submit()
    start_job(api, job["job_id"], state="PENDING_HEALTHCHECK", rank_states=["FAILED", "STOPPED"])
    now = api.now[0]
    api.job_table.update_item(
        Key={"job_id_rank": f"{job['job_id']}#JOB"}, UpdateExpression="SET history = :h",
        ExpressionAttributeValues={":h": [
            {"at": int(now - 1000), "to": "QUEUED", "from": "", "reason": "", "actor": OPS},
            {"at": int(now - 900), "to": "STARTING", "from": "QUEUED", "reason": "", "actor": "scheduler"},
            {"at": int(now - 880), "to": "RUNNING", "from": "STARTING", "reason": "", "actor": "recovery"},
            {"at": int(now - 100), "to": "PENDING_HEALTHCHECK", "from": "RUNNING", "reason": "",
             "actor": "recovery"}]})
    capsys.readouterr()
    assert _cancel(api, job["job_id"])[1]["state"] == "CANCELED"
    assert _cancel(api, job["job_id"])[1]["changed"] is False
    out = capsys.readouterr().out.splitlines()
    emitted = [json.loads(line) for line in out if line.startswith('{"_aws"')]
    lost = [m for m in emitted if "GpuHoursLost" in m]
    assert sorted(m["Cause"] for m in lost) == ["diagnosis", "restart"]
    assert all(set(m) - {"_aws", "GpuHoursLost"} == {"Cause", "service"} for m in lost)
    assert len([m for m in emitted if "JobEttr" in m]) == 1


def test_a_large_gangs_cancel_sends_its_stop_batches_once_and_a_dead_senders_claim_goes_stale(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a gang whose stops go through the batch queue (every gang, ``GANG_INLINE_MAX_RANKS``
    0), and a first cancel whose SendMessageBatch fails after it claimed the sending
    When the cancel is asked again at once, and again once the claim is stale
    Then the first retry sends nothing (the claim may still be sending), the later one sends the
    batch once, and a retry after it sends nothing more."""
    from gpu_recovery.adapters import aws
    from gpu_recovery.constants import ENV_GANG_INLINE_MAX_RANKS, ENV_GANG_QUEUE_URL
    from gpu_recovery.recovery.fanout_send import SEND_CLAIM_SECONDS
    from tests.jobs_api.api_harness import ACCOUNT

    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="unused-gang")["QueueUrl"]
    assert url.endswith(f"{ACCOUNT}/unused-gang")
    monkeypatch.setenv(ENV_GANG_QUEUE_URL, url)
    monkeypatch.setenv(ENV_GANG_INLINE_MAX_RANKS, "0")
    refused = [1]

    def refuse_once(**_: object) -> None:
        if refused and refused.pop():
            raise RuntimeError("SendMessageBatch: connection reset")

    # On the session before the API's first request builds its clients (each copies the hooks).
    aws.session().events.register("before-call.sqs.SendMessageBatch", refuse_once)
    _, job = api.submit()
    start_job(api, job["job_id"])
    with pytest.raises(RuntimeError):
        api.call("POST", f"/v1/jobs/{job['job_id']}/cancel", user_arn=OPS)

    def queued() -> int:
        return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                   ["Attributes"]["ApproximateNumberOfMessages"])

    assert _job(api, job["job_id"])["job_state"] == "CANCELING"
    assert _cancel(api, job["job_id"])[0] == 200 and queued() == 0
    api.now[0] += SEND_CLAIM_SECONDS + 1
    assert _cancel(api, job["job_id"])[0] == 200 and queued() == 1
    assert _cancel(api, job["job_id"])[0] == 200 and queued() == 1
