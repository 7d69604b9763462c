"""The recovery sweep's give-up of a stop intent whose rounds are spent (``GangFanout.stop_due``):
an aborted launch's and an ended job's are each counted (an alarm pages on each) and logged, the
count flushed at once, not with the invocation's metrics at its end (the intent is gone: a sweep
timing out after the give-up would lose the count for good)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from aws_lambda_powertools.metrics import Metrics

from gpu_recovery import clock, runtime
from gpu_recovery.adapters import aws
from gpu_recovery.constants import JobState
from gpu_recovery.metric_names import METRICS_NAMESPACE
from gpu_recovery.recovery.gang import MAX_STOP_ROUNDS
from tests.fixtures.queue_cluster import QueueCluster, make_queue_cluster
from tests.queue_scheduler._cluster_moves import throttled
from tests.queue_scheduler._launches import (
    Recorded,
    launch_that_fails_on_node_1,
    requeued_launch_failed_on_node_1,
    set_fields,
)


@pytest.fixture
def sweep_metrics() -> Iterator[Metrics]:
    """The recovery sweep's Powertools metrics (shared by every instance): left empty after."""
    metrics = Metrics(namespace=METRICS_NAMESPACE, service="recovery-sweep")
    metrics.clear_metrics()
    yield metrics
    metrics.clear_metrics()


def _emitted_at_once(out: str) -> dict[str, dict[str, Any]]:
    """The EMF lines written to stdout, by metric name."""
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{\"_aws\"")]
    return {metric["Name"]: line for line in lines
            for directive in line["_aws"]["CloudWatchMetrics"] for metric in directive["Metrics"]}


def _spend_the_rounds(qc: QueueCluster, job: str, **fields: Any) -> None:
    """The job's stop intent asked 1 + MAX_STOP_ROUNDS times, the last ask long ago."""
    intent = dict(qc.item(job)["stop_fanout"])
    now = int(clock.now())
    set_fields(qc, job, stop_fanout={**intent, "sent_at": now - 7200, "rounds": MAX_STOP_ROUNDS}, **fields)


def test_an_aborted_launchs_given_up_stop_is_counted_at_once(monkeypatch, capsys, caplog, sweep_metrics):
    """Given a 2-node launch aborted after rank 0 started (ECS refused its stop: it still runs),
    its stop intent's rounds spent, and the recovery pointed at the sweep's Powertools metrics
    When the sweep gives the stop up and its invocation then times out (its metrics never flushed)
    Then AbortedLaunchStopsGivenUp was written already (its own EMF line: the sweep's namespace
    and service), not left in the invocation's metrics for a flush that never comes (nor counted
    twice when it does), and the ERROR line names the job."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job, scheduler, thieves = launch_that_fails_on_node_1(qc)

        def refused(task_arn: str, reason: str) -> None:
            raise throttled("StopTask")

        monkeypatch.setattr(qc.recovery.gang.ecs, "stop_task", refused)
        [launch] = scheduler.tick().launches
        assert launch["action"] == "requeued" and qc.item(job)["stop_fanout"]["aborted_launch"]
        for thief in thieves:
            aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thief)
        _spend_the_rounds(qc, job)
        monkeypatch.setattr(qc.recovery.metrics_relay, "target", runtime.PowertoolsMetrics(sweep_metrics))
        capsys.readouterr()
        with caplog.at_level(logging.ERROR, logger="gpu_recovery.recovery.gang"):
            assert qc.recovery.gang.stop_due(qc.repo.jobs.get_job(job), clock.now()) == "stop_given_up"
        assert "stop_fanout" not in qc.item(job)  # the intent is gone: nothing counts it again
        emitted = _emitted_at_once(capsys.readouterr().out)
        line = emitted["AbortedLaunchStopsGivenUp"]
        assert line["AbortedLaunchStopsGivenUp"] == [1.0] and line["service"] == "recovery-sweep"
        assert line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == METRICS_NAMESPACE
        assert line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["service"]]  # what the alarm matches
        assert "AbortedLaunchStopsGivenUp" not in sweep_metrics.metric_set
        [record] = [r for r in caplog.records if "aborted launch given up" in r.getMessage()]
        assert record.job_id == job  # type: ignore[attr-defined]
    finally:
        gen.close()


@pytest.mark.parametrize("ended", [JobState.FAILED, JobState.CANCELED])
def test_an_ended_jobs_given_up_stop_is_counted(qc, monkeypatch, caplog, ended):
    """Given a running 1-node job that ended meanwhile (FAILED, CANCELED) with its stop intent's
    rounds spent and its rank still running (its node's agent gone: never reported stopped)
    When the sweep gives the stop up
    Then EndedJobStopsGivenUp counts it and an ERROR line names the job (the intent ended
    silently: nothing asks that rank to stop again, nor told anyone)."""
    job = qc.submit(nnodes=1, gpus=8)
    assert qc.scheduler().tick().admitted == [job]
    qc.sim.run_for(60)
    [rank0] = qc.live_tasks(job)
    set_fields(qc, job, stop_fanout={"attempt": 1, "at": int(clock.now()) - 9000, "why": "job ended",
                                     "remediation": False})
    _spend_the_rounds(qc, job, job_state=ended.value)
    recorded = Recorded()
    monkeypatch.setattr(qc.recovery.metrics_relay, "target", recorded)
    with caplog.at_level(logging.ERROR, logger="gpu_recovery.recovery.gang"):
        assert qc.recovery.gang.stop_due(qc.repo.jobs.get_job(job), clock.now()) == "stop_given_up"
    assert "stop_fanout" not in qc.item(job)
    assert recorded.names == ["EndedJobStopsGivenUp"]
    assert recorded.flushed_now == ["EndedJobStopsGivenUp"]  # not lost with a sweep timing out after
    [record] = [r for r in caplog.records if "ended job given up" in r.getMessage()]
    assert (record.job_id, record.job_state) == (job, ended.value)  # type: ignore[attr-defined]
    assert rank0 in qc.live_tasks(job)  # what the count is for: it may run on


def test_an_ended_jobs_given_up_stop_with_no_rank_left_running_is_not_counted(monkeypatch, caplog):
    """Given a 2-node job whose launch placed rank 0 only (rank 1 never started, so its end is
    never reported), rank 0 since ended, the job FAILED with a stop intent whose rounds are spent
    When the sweep gives the stop up
    Then the intent ends but nothing is counted or logged as an error: no rank registered and not
    ended may still run (an alarm for it would page for nothing)."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job, thieves = requeued_launch_failed_on_node_1(qc)
        qc.sim.run_for(120)  # the aborted launch's stop: rank 0 stopped, its end recorded
        for thief in thieves:
            aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thief)
        assert qc.live_tasks(job) == []
        assert qc.recovery.gang.data.latches.registered_not_ended(job, 1, 2) == set()
        set_fields(qc, job, job_state=JobState.FAILED.value,
                   stop_fanout={"attempt": 1, "at": int(clock.now()) - 9000, "why": "job ended",
                                "remediation": False})
        _spend_the_rounds(qc, job)
        recorded = Recorded()
        monkeypatch.setattr(qc.recovery.metrics_relay, "target", recorded)
        with caplog.at_level(logging.ERROR, logger="gpu_recovery.recovery.gang"):
            assert qc.recovery.gang.stop_due(qc.repo.jobs.get_job(job), clock.now()) == "stop_given_up"
        assert "stop_fanout" not in qc.item(job)
        assert recorded.names == []
        assert not [r for r in caplog.records if "given up" in r.getMessage()]
    finally:
        gen.close()
