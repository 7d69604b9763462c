"""The backstop invariant's checks (``local_mode.invariants``), which the campaigns and the
soak hold every run to: a job neither RUNNING nor ended, or a node in validation, with nothing
due (or due long ago) is reported; one the sweep or the queue will reach is not."""

from __future__ import annotations

from typing import Any

import boto3

from gpu_recovery import constants as C
from gpu_recovery.domain import started_by
from local_mode.invariants import OVERDUE_SECONDS, forgotten_jobs, forgotten_validations, started_twice
from local_mode.sim.ecs_model import Placement
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
        bucket = w.repo.tables.db.deadline_buckets()[0]
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
        bucket = w.repo.tables.db.deadline_buckets()[0]
        validation = {"since": NOW - 60, "until": NOW + 3600, "attempts": 0}
        put("instances", {C.INSTANCE_PK: "node-a", "instance_state": "REBOOTING", "validation": validation})
        put("instances", {C.INSTANCE_PK: "node-b", "instance_state": "REBOOTING", "validation": validation,
                          C.DEADLINE_PK: bucket, C.DEADLINE_SK: NOW + 60})
        put("instances", {C.INSTANCE_PK: "node-c", "instance_state": "REBOOTING"})  # a reboot, no validation
        put("instances", {C.INSTANCE_PK: "node-d", "instance_state": "AVAILABLE", "validation": validation})
        assert forgotten_validations(w.repo, NOW, ["node-a", "node-b", "node-c", "node-d", "node-e"]) == {
            "node-a": "validating with nothing due"}


def test_a_second_task_of_one_startedby_on_one_node_is_reported() -> None:
    check = started_by.node_task(started_by.HEALTH_CHECK, "node-b", 1.0, 0)
    call = started_by.rank_launch(started_by.RESTART, "job", 2, "g0", digest=10)

    def placed(at: float, node: str, by: str, arn: str) -> Placement:
        return Placement(at, node, by, arn, "healthy", True, "")

    placements = [placed(1, "node-b", check, "t1"), placed(2, "node-a", call, "t2"),
                  placed(2, "node-c", call, "t3"),  # one call of identical ranks: one task a node
                  placed(3, "node-a", "eager-scheduler", "t4"), placed(4, "node-a", "eager-scheduler", "t5"),
                  placed(5, "node-b", check, "t1")]  # the same task seen again is not a second
    assert started_twice(placements) == []
    again = [placed(300, "node-b", check, "t6"), placed(301, "node-c", call, "t7")]
    assert started_twice([*placements, *again]) == [
        f"{check} on node-b at 300 s", f"{call} on node-c at 301 s"]
