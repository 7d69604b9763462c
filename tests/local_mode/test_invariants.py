"""The backstop invariant's checks (``local_mode.invariants``), which the campaigns and the
soak hold every run to: a job neither RUNNING nor ended, or a node in validation, with nothing
due (or due long ago) is reported; one the sweep or the queue will reach is not."""

from __future__ import annotations

from typing import Any

import boto3

from gpu_recovery import constants as C
from local_mode.invariants import OVERDUE_SECONDS, forgotten_jobs, forgotten_validations
from tests.recovery.fakes import world

NOW = 1_800_000_000


def put(table: str, item: dict[str, Any]) -> None:
    boto3.resource("dynamodb", region_name="us-east-1").Table(table).put_item(Item=item)


def job(job_id: str, state: str, **fields: Any) -> None:
    history = [{"at": NOW - i, "reason": "x" * 200} for i in range(50)]  # a large item, a few fields read
    put("jobs", {C.JOB_PK: C.job_item_key(job_id), "item_type": "JOB", "job_id": job_id, "job_state": state,
                 "history": history, **fields})


def test_a_job_nothing_will_reach_is_reported_and_one_the_sweep_or_queue_reaches_is_not() -> None:
    with world() as w:
        bucket = w.repo.db.deadline_buckets()[0]
        job("lost", "PENDING_HEALTHCHECK")
        job("late", "PENDING_RESTART", **{C.DEADLINE_PK: bucket, C.DEADLINE_SK: NOW - OVERDUE_SECONDS - 60})
        job("due", "PENDING_HEALTHCHECK", **{C.DEADLINE_PK: bucket, C.DEADLINE_SK: NOW + 60})
        job("queued", "QUEUED", **{C.QUEUE_PK: "QUEUE"})
        job("running", "RUNNING")
        job("done", "COMPLETE")
        ids = ["lost", "late", "due", "queued", "running", "done", "never-written"]
        assert forgotten_jobs(w.repo, NOW, job_ids=ids) == {
            "lost": "PENDING_HEALTHCHECK with nothing due",
            "late": f"PENDING_RESTART due {OVERDUE_SECONDS + 60} s ago"}
        assert forgotten_jobs(w.repo, NOW) == forgotten_jobs(w.repo, NOW, job_ids=ids)  # the scan's


def test_a_node_in_validation_with_nothing_due_is_reported() -> None:
    with world() as w:
        bucket = w.repo.db.deadline_buckets()[0]
        validation = {"since": NOW - 60, "until": NOW + 3600, "attempts": 0}
        put("instances", {C.INSTANCE_PK: "node-a", "instance_state": "REBOOTING", "validation": validation})
        put("instances", {C.INSTANCE_PK: "node-b", "instance_state": "REBOOTING", "validation": validation,
                          C.DEADLINE_PK: bucket, C.DEADLINE_SK: NOW + 60})
        put("instances", {C.INSTANCE_PK: "node-c", "instance_state": "REBOOTING"})  # a reboot, no validation
        put("instances", {C.INSTANCE_PK: "node-d", "instance_state": "AVAILABLE", "validation": validation})
        assert forgotten_validations(w.repo, NOW, ["node-a", "node-b", "node-c", "node-d", "node-e"]) == {
            "node-a": "validating with nothing due"}
