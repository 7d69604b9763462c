"""``gpu-recovery-admin goodput``: the cluster's ETTR, GPU-hours lost per cause per day and
the lemon list, from the jobs' ledgers on the job table (moto; the job-list index, no Scan)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from cli import admin
from gpu_recovery import constants as C
from gpu_recovery.domain import goodput
from gpu_recovery.repository import Repository, to_ddb


@pytest.fixture
def repo() -> Iterator[Repository]:
    with mock_aws():
        ddb = boto3.resource("dynamodb", region_name="us-east-1")
        defs = C.table_definitions()
        for kind, name in (("job", "jobs"), ("instance", "instances")):
            ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **defs[kind])
        yield Repository(ddb, "jobs", "instances")


def _job(repo: Repository, job_id: str, submitted: float, node: str, *, repair: float) -> None:
    """A 2x8-GPU queue job: queued 100 s, 1 h of training, a fault on ``node`` (10 min of lost
    work), a diagnosis of 2 min and a repair of ``repair`` s, then 1 h more, COMPLETE."""
    t = submitted
    marks = goodput.fault_marks(fault_at=t + 3700, checkpoint_at=t + 3100, node=node, rule="xid-79")
    history: list[dict[str, Any]] = [
        {"at": t, "to": "QUEUED"}, {"at": t + 100, "to": "STARTING"}, {"at": t + 100, "to": "RUNNING"},
        {"at": t + 3700, "to": "PENDING_HEALTHCHECK", goodput.GP: marks},
        {"at": t + 3820, "to": "PENDING_RESTART", goodput.GP: goodput.cause_marks("repair")},
        {"at": t + 3820 + repair, "to": "STARTING"}, {"at": t + 3820 + repair, "to": "RUNNING"},
        {"at": t + 7420 + repair, "to": "COMPLETE"}]
    item = {C.JOB_PK: C.job_item_key(job_id), "item_type": "JOB", "job_id": job_id, "job_state": "COMPLETE",
            "world_size": 2, "gpus_per_node": 8, "submitted_at": t, "created_at": t,
            C.LIST_PK: C.LIST_BUCKET, C.SUBMITTED_SK: t, "history": history}
    repo.tables.db.table("jobs").put_item(Item=to_ddb(item))


def test_the_cluster_view_sums_its_jobs_and_names_the_costliest_nodes(
        repo: Repository, capsys: pytest.CaptureFixture[str]) -> None:
    """Given two recent jobs whose faults were on ci-bad (a 10 min repair) and ci-meh (1 min),
    and one job of last month, When `gpu-recovery-admin goodput --json` runs, Then it counts
    the two: GPU-hours per cause (16 GPUs each), the ETTR over them, lost GPU-hours per day,
    and the lemon list with ci-bad first, with the faults its own history records."""
    now = time.time()
    _job(repo, "a", now - 3 * 86400, "ci-bad", repair=600)
    _job(repo, "b", now - 2 * 86400, "ci-meh", repair=60)
    _job(repo, "old", now - 40 * 86400, "ci-bad", repair=600)
    repo.tables.db.table("instances").put_item(Item={C.INSTANCE_PK: "ci-bad", "fault_history": [
        {"at": to_ddb(now - 3 * 86400 + 3700), "cause": "xid-79", "action": "reboot"}]})
    assert admin.main(["goodput", "--json"], repo=repo) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == 2
    hours = report["gpu_hours"]
    assert hours["productive"] == pytest.approx(2 * (3000 + 3600) * 16 / 3600, abs=1e-3)
    assert hours["lost_work"] == pytest.approx(2 * 600 * 16 / 3600, abs=1e-3)
    assert hours["repair"] == pytest.approx((600 + 60) * 16 / 3600, abs=1e-3)
    assert report["ettr"] == pytest.approx(hours["productive"] / report["wall_gpu_hours"], abs=1e-4)
    assert len(report["lost_per_day"]) == 2
    assert [lemon["node"] for lemon in report["lemons"]] == ["ci-bad", "ci-meh"]
    assert report["lemons"][0]["faults"] == ["xid-79"]
    assert admin.main(["goodput"], repo=repo) == 0
    out = capsys.readouterr().out
    assert "2 job(s) in the last 7 day(s)" in out and "ci-bad" in out and "ETTR" in out
