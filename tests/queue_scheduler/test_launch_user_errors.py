"""A queue launch that fails its job for a user error (a task definition that does not exist or
is INACTIVE, found by the tick's claim; a StartTask that ECS refuses for the job's task
definition or overrides) tells its owner and operators: one `failed` e-mail that names what ECS
refused and what to fix, the job's Failures and goodput counted; as every other way a job fails.
Before, these were the only jobs that failed silently (their state said so, nobody was told)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE
from tests.fixtures.queue_cluster import QueueCluster, make_queue_cluster
from tests.notifications.truth import command_mentions_problems
from tests.queue_scheduler._launches import Recorded

#: the calls of the failure itself: the claim's failure with its e-mail, the publish, the outbox
FAIL_SITES = ("recovery/queue_launches.py", "recovery/notices.py")


def _failed_emails(qc: QueueCluster, job: str) -> list[dict[str, Any]]:
    return [n for n in qc.local.notifications()
            if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"
            and n["attributes"].get("job_id") == job]


def _unusable_task_definition(qc: QueueCluster, broken: str) -> str:
    if broken == "missing":
        return "does-not-exist:7"
    td = qc.sim.register_training_task_definition("retired", gpus=8)
    qc.local.client("ecs").deregister_task_definition(taskDefinition=td)
    return str(td)


@pytest.mark.parametrize("broken", ["missing", "inactive"])
def test_a_job_whose_task_definition_is_unusable_fails_told_why(qc, monkeypatch, broken):
    """Given a queued job whose task definition does not exist (or is INACTIVE)
    When the scheduler ticks, and again an hour later
    Then the job is FAILED (USER_ERROR) and its owner and operators get one `failed` e-mail that
    quotes the reason and says what to fix (naming only commands that exist); Failures counts
    it once; nothing runs, nothing is retried, no second e-mail."""
    recorded = Recorded()
    monkeypatch.setattr(qc.recovery.gang.metrics, "add_metric", recorded.add_metric)
    job = qc.submit(nnodes=2, gpus=8, task_definition=_unusable_task_definition(qc, broken))
    [launch] = qc.scheduler().tick().launches
    assert launch["action"] == "failed" and launch["kind"] == "USER_ERROR"
    item = qc.item(job)
    assert item["job_state"] == "FAILED" and item["failure_kind"] == "USER_ERROR"
    [mail] = _failed_emails(qc, job)
    body = mail["message"]
    assert "Job failed: its ranks could not start" in body and item["last_error"] in body
    what_to_do = body.split("What to do:", 1)[1]
    assert "task definition" in what_to_do and command_mentions_problems(what_to_do) == []
    assert recorded.names.count("Failures") == 1
    qc.sim.run_for(3600)
    assert qc.scheduler().tick().launches == [] and qc.live_tasks() == []
    assert len(_failed_emails(qc, job)) == 1


def test_a_start_task_refused_for_the_jobs_overrides_fails_it_told_why(qc, monkeypatch):
    """Given a 2-node launch whose StartTask ECS refuses with InvalidParameterException (an
    override names a container its task definition does not have)
    When the scheduler ticks, and the sweep runs for ten minutes
    Then the job is FAILED (USER_ERROR), one `failed` e-mail quotes ECS's message; no rank runs."""
    recorded = Recorded()
    monkeypatch.setattr(qc.recovery.gang.metrics, "add_metric", recorded.add_metric)
    message = "Override for container named x is not a container in the TaskDefinition."

    def refused(**_: Any) -> Any:
        raise ClientError({"Error": {"Code": "InvalidParameterException", "Message": message},
                           "ResponseMetadata": {"HTTPStatusCode": 400}}, "StartTask")

    job = qc.submit(nnodes=2, gpus=8)
    monkeypatch.setattr(qc.recovery.gang.ecs, "start_task", refused)
    [launch] = qc.scheduler().tick().launches
    assert launch["action"] == "failed" and launch["kind"] == "USER_ERROR"
    monkeypatch.undo()
    for _ in range(10):
        qc.sim.run_for(60)
        qc.recovery.sweep()
    assert qc.state(job) is JobState.FAILED and qc.live_tasks(job) == []
    [mail] = _failed_emails(qc, job)
    assert "Job failed: its ranks could not start" in mail["message"] and message in mail["message"]
    what_to_do = mail["message"].split("What to do:", 1)[1]
    assert "task definition" in what_to_do and command_mentions_problems(what_to_do) == []
    assert recorded.names.count("Failures") == 1


def _tick_broken(qc: QueueCluster, job: str, fault: tuple[int, str] | None) -> list[Any]:
    """One tick with ``fault`` broken (None: every call recorded), then the sweep and the
    scheduler every minute for ten minutes: the tick's calls."""
    qc.local.call_faults.arm(*(fault or (None,)), record_sites=True)
    try:
        with contextlib.suppress(Exception):  # the tick fails: the next one comes a minute later
            qc.scheduler().tick()
        calls = list(qc.local.call_faults.calls)
        assert fault is None or qc.local.call_faults.fired is not None
    finally:
        qc.local.call_faults.disarm()
    for _ in range(10):
        qc.sim.run_for(60)
        qc.recovery.sweep()
        with contextlib.suppress(Exception):
            qc.scheduler().tick()
    return calls


def test_the_user_errors_failure_with_each_of_its_calls_broken_still_fails_the_job_told_once():
    """Given a queued job whose task definition does not exist
    When the tick's failure has one of its calls (the job read, the failure's transaction with
    its e-mail, the publish, the outbox update) throttled or its answer lost, and the scheduler
    and the sweep run every minute after
    Then the job ends FAILED (USER_ERROR) with one START_FAILED attempt, its e-mail sent (twice
    at worst: a publish whose outbox update was lost), nothing started."""
    def fresh() -> tuple[Any, QueueCluster, str]:
        gen = make_queue_cluster(nodes=[8, 8])
        qc = next(gen)
        return gen, qc, qc.submit(nnodes=2, gpus=8, task_definition="does-not-exist:7")

    gen, qc, job = fresh()
    try:
        calls = _tick_broken(qc, job, None)
    finally:
        gen.close()
    window = [c for c in calls if c.site.startswith(FAIL_SITES)]
    assert {c.operation for c in window} >= {"GetItem", "TransactWriteItems", "Publish"}, window
    wrong = []
    for call in window:
        for mode in (THROTTLE, LOST_RESPONSE):
            gen, qc, job = fresh()
            try:
                _tick_broken(qc, job, (call.index, mode))
                item, mails = qc.item(job), len(_failed_emails(qc, job))
                outcome = (item["job_state"], item.get("failure_kind"), len(item.get("attempts") or []),
                           len(qc.live_tasks(job)))
                if outcome != ("FAILED", "USER_ERROR", 1, 0) or not 1 <= mails <= 2:
                    wrong.append(f"{call.operation} {call.site} {mode}: {outcome}, {mails} e-mail(s)")
            finally:
                gen.close()
    assert wrong == []


def test_the_deployed_scheduler_function_fails_and_tells_with_the_calls_its_role_grants():
    """Given the simulated deployment (the scheduler function on its schedule, each function's
    calls held to its role's grants) and a queued job whose task definition was deregistered
    after the submit
    When the scheduler function runs
    Then the job is FAILED and its `failed` e-mail is sent, every call granted by the scheduler
    function's own role (the e-mail's publish and outbox update are new calls of that function)."""
    from local_mode.campaigns.runner import mails
    from local_mode.world import build_world

    with build_world(dynamodb="memory") as world:
        sim = world.ecs
        world.schedule_queue_scheduler(60)
        for node in ("node-a", "node-b"):
            sim.add_node(node, gpus=8)
        td = sim.register_training_task_definition("retired", gpus=8)
        spec = {"name": "retired", "task_definition": td, "nnodes": 2, "gpus_per_node": 8}
        job = world.submit_queue_job(spec, "alice")
        world.aws.client("ecs").deregister_task_definition(taskDefinition=td)
        sim.run_for(3 * 60)
        found = world.repo.jobs.get_job(job)
        assert found is not None and found.state is JobState.FAILED
        assert mails(world.aws) == [("failed", job)]
        assert world.aws.grants is not None and world.aws.grants.denials == []
