"""Alarms that mean something: a transient failure does not page; every alarm says what to do."""

from __future__ import annotations

import json
from typing import Any

import pytest
from infra_synth import Synth

from infra.monitoring import Invocation

SCHEDULED = {"RecoverySweep", "HeartbeatSweep", "QueueScheduler"}


def _text(value: Any) -> str:
    """An alarm description: plain text, or an Fn::Join around the log group's name."""
    if isinstance(value, str):
        return value
    separator, parts = value["Fn::Join"]
    return separator.join(p if isinstance(p, str) else "<log group>" for p in parts)


def _alarms(synth: Synth) -> list[dict[str, Any]]:
    alarms = [dict(a["Properties"]) for a in synth.resources("AWS::CloudWatch::Alarm").values()]
    for alarm in alarms:
        alarm["AlarmDescription"] = _text(alarm["AlarmDescription"])
    return alarms


def _function_name_of(synth: Synth, alarm: dict[str, Any]) -> str:
    stack = synth.stack
    logical = alarm["Dimensions"][0]["Value"]["Ref"]
    for name, fn in stack.functions.items():
        if stack.resolve(fn.function.function_name) == {"Ref": logical}:
            return name
    raise AssertionError(logical)


def test_every_function_has_an_invocation_kind(default_synth: Synth) -> None:
    stack = default_synth.stack
    assert set(stack.invocations) == set(stack.functions)
    assert {n for n, kind in stack.invocations.items() if kind is Invocation.SCHEDULED} == SCHEDULED


def test_every_alarm_says_what_the_operator_should_do(default_synth: Synth) -> None:
    """Given every alarm, Then its description is an instruction (read, fix, replay or purge)
    pointing to the runbook, within CloudWatch's 1024 characters, and it notifies the topic."""
    alarms = _alarms(default_synth)
    # an errors alarm per function, a depth alarm per DLQ, overdue jobs, aborted launches' and ended
    # jobs' stops given up
    assert len(alarms) == 13 + 8 + 1 + 1 + 1
    for alarm in alarms:
        text = alarm["AlarmDescription"]
        assert len(text) <= 900, text  # CloudWatch allows 1024, with room for the log group name
        assert "docs/operations.md" in text
        assert any(verb in text for verb in ("Read ", "fix ", "Run `gpu-recovery-admin doctor`")), text
        if alarm["MetricName"] == "Errors":
            assert "log group <log group>" in text  # the function's own log group, by name
        (action,) = alarm["AlarmActions"]
        assert action["Ref"].startswith("NotificationsAlertTopic")


def test_a_single_failure_does_not_page(default_synth: Synth) -> None:
    """Given the errors alarms, Then none fires on one failed invocation: scheduled functions
    alarm after 3 failing one-minute runs in a row, event functions after errors in 2 of 3
    five-minute periods, API functions after 5+ errors in 2 consecutive periods, the gang
    worker (SQS: a failed batch is received again 6 minutes later) in 2 of 3 periods."""
    seen = set()
    for alarm in _alarms(default_synth):
        if alarm["MetricName"] != "Errors":
            continue
        name = _function_name_of(default_synth, alarm)
        seen.add(name)
        kind = default_synth.stack.invocations[name]
        policy = (alarm["Period"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"], alarm["Threshold"])
        expected = {Invocation.SCHEDULED: (60, 3, 3, 1), Invocation.EVENT: (300, 3, 2, 1),
                    Invocation.REQUEST: (300, 2, 2, 5), Invocation.QUEUE: (300, 3, 2, 1)}[kind]
        assert policy == expected, name
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"
        if kind is Invocation.SCHEDULED:
            text = alarm["AlarmDescription"]
            assert "does not page" in text and "nothing to replay" in text
    assert seen == set(default_synth.stack.functions)


def test_dlq_alarms_explain_retries_and_replay(default_synth: Synth) -> None:
    """A scheduled function's DLQ alarm says the tick failed all 3 tries and is purged, not
    replayed; an event function's says the event is kept and how to replay it."""
    dlq_alarms = {a["AlarmDescription"] for a in _alarms(default_synth)
                  if a["MetricName"] == "ApproximateNumberOfMessagesVisible"}
    assert len(dlq_alarms) == 8
    for name in SCHEDULED:
        (text,) = [t for t in dlq_alarms if t.startswith(f"A {name} tick")]
        assert "failed all 3 tries" in text and "purge" in text
    for name in ("TaskHandler", "DcgmMonitor", "InstanceMonitor"):
        (text,) = [t for t in dlq_alarms if t.startswith(f"An ECS event for {name}")]
        assert "replay" in text and f"{name}DeadLetterQueueUrl" in text
    (text,) = [t for t in dlq_alarms if t.startswith("A batch of GangWorker")]
    assert "failed 5 receives" in text and "GangWorkerDeadLetterQueueUrl" in text
    assert "start-message-move-task" in text and "idempotent" in text


def test_the_gang_worker_is_monitored_as_a_queue_worker(default_synth: Synth) -> None:
    """Given the gang worker (SQS event source), Then its errors alarm says a large job's stop
    or restart is stalled and how its batches come back; its DLQ is alarmed; the dashboard
    shows the gang queue's backlog and the age of its oldest batch."""
    stack = default_synth.stack
    assert stack.invocations["GangWorker"] is Invocation.QUEUE
    assert "GangWorker" in stack.monitoring.error_alarms and "GangWorker" in stack.monitoring.dlq_alarms
    (errors,) = [a for a in _alarms(default_synth) if a["MetricName"] == "Errors"
                 and _function_name_of(default_synth, a) == "GangWorker"]
    text = errors["AlarmDescription"]
    assert "stalled" in text and "received again" in text and "Dead-letter queues" in text
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "ApproximateAgeOfOldestMessage" in body and "GangFanout" in body


def test_dashboard_shows_suspects_the_stacks_check_cleared_per_evidence_source(default_synth: Synth) -> None:
    """Issue 49: an operator sees which kind of evidence cries wolf."""
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "SuspectsCleared" in body and "GpuTrainingRecovery,EvidenceSource,service" in body


def test_dashboard_shows_recoveries_mttr_dlq_breaker_and_alarms(default_synth: Synth) -> None:
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for text in ("Recoveries", "TimeToRestartSeconds", "MTTR", "Dead-letter queue depth", "Quarantines",
                 "BreakerTripped", "BreakerOpen", "SUM(SEARCH(", "alarm", "gpu-recovery-admin doctor"):
        assert text in body, text


def test_time_sharing_functions_and_metrics_are_monitored(default_synth: Synth) -> None:
    """The job-control authorizer and API are request-driven (training code calls them):
    their errors alarm like the other API functions'; the dashboard sums the suspend
    counters the recovery functions, the scheduler and the control API emit."""
    stack = default_synth.stack
    for name in ("JobControlAuthorizer", "JobControlApi"):
        assert stack.invocations[name] is Invocation.REQUEST
        assert name in stack.monitoring.error_alarms
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in ("SuspendsRequested", "SuspendsForced", "JobsSuspended"):
        assert metric in body, metric
    assert "Time sharing" in body


def test_the_dashboard_counts_aws_notices_and_their_jobs(default_synth: Synth) -> None:
    """AWS's notices (docs/aws-notices.md): nodes announced, jobs moved before the deadline, jobs
    stopped at it unsaved, jobs that crashed with the node, summed over the services."""
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in ("AwsNotices", "NoticeJobsMovedBeforeDeadline", "NoticeJobsStoppedUnsaved",
                   "NoticeJobsStopped", "NoticeJobsCrashed"):
        assert metric in body, metric
    assert "AWS notices" in body


def test_a_job_past_its_due_time_pages(default_synth: Synth) -> None:
    """Given the recovery sweep's OverdueJobs (jobs 15 minutes or more past their next step's
    deadline), Then one alarm fires when it is above 0 in 3 one-minute runs in a row, with
    no data breaching (a sweep that does not report is no all-clear), on the metric the
    sweep's handler emits (its Powertools service), telling the operator to run doctor and
    read the sweep's log; the dashboard graphs the count and the oldest due job's lateness."""
    from handlers import recovery_sweep

    (alarm,) = [a for a in _alarms(default_synth) if a["MetricName"] == "OverdueJobs"]
    service = default_synth.stack.functions["RecoverySweep"].service_name
    assert service == recovery_sweep.metrics.service  # the dimension the handler's metrics carry
    assert (alarm["Namespace"], alarm["Dimensions"]) == (
        "GpuTrainingRecovery", [{"Name": "service", "Value": service}])
    policy = (alarm["Statistic"], alarm["Period"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"],
              alarm["Threshold"], alarm["ComparisonOperator"], alarm["TreatMissingData"])
    assert policy == ("Maximum", 60, 3, 3, 0, "GreaterThanThreshold", "breaching")
    text = alarm["AlarmDescription"]
    for needed in ("15 minutes", "Run `gpu-recovery-admin doctor`", "log group <log group>",
                   "sweep step failed", "'Overdue jobs'", "No data counts as breaching",
                   "RecoverySweepErrorsAlarm"):
        assert needed in text, needed
    assert default_synth.stack.monitoring.overdue_alarm in default_synth.stack.monitoring.alarms
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "OverdueJobs" in body and "OldestDueJobSeconds" in body and "Jobs past their due time" in body


def test_the_dashboard_shows_the_goodput_of_the_jobs_that_ended(default_synth: Synth) -> None:
    """Issue 52: GPU-hours lost per cause (the Cause dimension, no job or node) and the finished
    jobs' ETTR, from the EMF the recovery functions emit when a job ends."""
    (dashboard,) = default_synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "GpuHoursLost" in body and "GpuTrainingRecovery,Cause,service" in body
    assert "JobEttr" in body and "ETTR" in body


@pytest.mark.parametrize(
    ("logical_id_prefix", "metric_name", "log_line", "section", "attribute"),
    [
        ("MonitoringAbortedLaunchStopsGivenUpAlarm", "AbortedLaunchStopsGivenUp",
         "stops of an aborted launch given up", "'Aborted launches whose stops were given up'",
         "aborted_launch_stops_alarm"),
        ("MonitoringEndedJobStopsGivenUpAlarm", "EndedJobStopsGivenUp",
         "stops of an ended job given up", "'Ended jobs whose stops were given up'",
         "ended_job_stops_alarm"),
    ],
    ids=["aborted-launch", "ended-job"],
)
def test_stops_given_up_page(default_synth: Synth, logical_id_prefix: str, metric_name: str,
                             log_line: str, section: str, attribute: str) -> None:
    """Given the recovery sweep's AbortedLaunchStopsGivenUp (a queue launch's stop given up after
    1 + 6 asks: its job queued again while a rank of it may still run) or EndedJobStopsGivenUp (an
    ended job's: a rank of it may still run, holding its node's GPUs), Then one alarm fires as soon
    as one is counted in 5 minutes, on the metric the sweep's handler emits, no data not breaching
    (emitted only when it happens), telling the operator where the job is named and what to do
    with its nodes."""
    (alarm,) = [dict(resource["Properties"]) for logical_id, resource
                in default_synth.resources("AWS::CloudWatch::Alarm").items()
                if logical_id.startswith(logical_id_prefix)]
    assert alarm["MetricName"] == metric_name
    service = default_synth.stack.functions["RecoverySweep"].service_name
    assert (alarm["Namespace"], alarm["Dimensions"]) == (
        "GpuTrainingRecovery", [{"Name": "service", "Value": service}])
    policy = (alarm["Statistic"], alarm["Period"], alarm["EvaluationPeriods"], alarm["Threshold"],
              alarm["ComparisonOperator"], alarm["TreatMissingData"])
    assert policy == ("Sum", 300, 1, 0, "GreaterThanThreshold", "notBreaching")
    assert [a for a in _alarms(default_synth) if a["MetricName"] == metric_name] == [
        {**alarm, "AlarmDescription": _text(alarm["AlarmDescription"])}], "one alarm on the metric"
    text = _text(alarm["AlarmDescription"])
    for needed in ("7 times", log_line, "log group <log group>", "gpujobs show", section):
        assert needed in text, needed
    monitoring = default_synth.stack.monitoring
    assert getattr(monitoring, attribute) in monitoring.alarms
