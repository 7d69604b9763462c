"""Alarms that mean something, and the dashboard an operator opens first.

Every alarm pages (SNS topic) only for what a person must act on, and its description
says what to do (the runbook is docs/operations.md):

* **dead-letter queue not empty** (one per DLQ): an event or tick failed every retry;
* **errors that persist** (one per function), judged by how the function is invoked:
  a scheduled function failing three one-minute runs in a row (one failed run is
  retried by Lambda and fixed by the next tick, so it does not page); an event function
  failing in two of three 5-minute periods (a single failure is retried, and one that
  never succeeds reaches the DLQ alarm); a queue worker (SQS event source: the gang
  fan-out) failing in two of three 5-minute periods (a failed message is received again
  after the queue's visibility timeout, 6 minutes, so one failure does not page, but a
  batch that fails again, or many that fail at once, do: a large job's stop or restart
  is stalled meanwhile; after 5 receives the batch is in the DLQ, which pages on its
  own); an API function with 5 or more errors in each of two consecutive 5-minute
  periods (callers retry single failures);
* **jobs past their due time**: the recovery sweep counted, in each of 3 one-minute runs
  in a row, a job 15 minutes or more past its next step's deadline (``OverdueJobs``):
  nothing moves it on, so it neither recovers nor fails and nobody is e-mailed. No data
  is breaching: the sweep emits the count every run, so a gap means it is not running or
  not reaching the job items, and that must not read as "no job is stuck".
* **an aborted launch's stops given up**: the recovery sweep asked a queue launch's started
  ranks to stop 1 + 6 times, a rank still not confirmed stopped, and gave up
  (``AbortedLaunchStopsGivenUp``, counted once per launch): a rank of it may still run (its
  node's agent gone) while the job is queued again (or has failed). No data is not breaching:
  the metric is emitted only when it happens;
* **an ended job's stops given up**: the same for the ranks of a job already over
  (``EndedJobStopsGivenUp``): a rank of it may still run, holding its node's GPUs.

The dashboard: recoveries and failures, time to restart (MTTR), quarantines and the
circuit breaker, jobs past their due time, suspends (time sharing), the work queues (gang
fan-out: batches waiting and the oldest one's age), dead-letter queue depth, Lambda errors
and duration, the API, and the state of every alarm. Business metrics come from
Powertools (namespace ``GpuTrainingRecovery``, dimension ``service``), summed over
services with SEARCH (the overdue jobs: the recovery sweep's own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from gpu_recovery.constants import GANG_QUEUE_MAX_RECEIVES, MAX_STOP_ROUNDS
from gpu_recovery.domain.overdue import OVERDUE_AFTER_SECONDS
from gpu_recovery.metric_names import (
    DIMENSION_CAUSE,
    DIMENSION_EVIDENCE_SOURCE,
    METRIC_ABORTED_LAUNCH_STOPS_GIVEN_UP,
    METRIC_ENDED_JOB_STOPS_GIVEN_UP,
    METRIC_GPU_HOURS_LOST,
    METRIC_JOB_ETTR,
    METRIC_OLDEST_DUE_JOB_SECONDS,
    METRIC_OVERDUE_JOBS,
    METRIC_SUSPECTS_CLEARED,
    METRICS_NAMESPACE,
)
from infra.lambda_common import SCHEDULED_ASYNC_RETRIES, RecoveryFunction

# CoupledNodesChecked: nodes whose exits followed a fault's first ones, checked because the
# fault's first checks found nothing (issue 50: docs/recovery-loop.md).
RECOVERY_COUNTERS = ("FaultsDetected", "HealthChecksStarted", "CoupledNodesChecked", "Reboots", "Recoveries",
                     "Failures")
TIME_TO_RESTART = "TimeToRestartSeconds"
# Quarantines: the recovery loop; BreakerTripped (count) / BreakerOpen (1 while open): the
# remediation circuit breaker, graphed as soon as the code emits them.
QUARANTINE_COUNTERS = ("Quarantines", "BreakerTripped")
BREAKER_GAUGE = "BreakerOpen"
# Time sharing: suspends asked (preemption, a user, a rank's go_suspend()), suspends forced
# after the grace, jobs suspended (every rank stopped): the recovery functions, the
# scheduler and the job-control API emit them.
SUSPEND_COUNTERS = ("SuspendsRequested", "SuspendsForced", "JobsSuspended")
# AWS's notices (docs/aws-notices.md): nodes announced, jobs moved off them at their checkpoint
# before the deadline, jobs stopped at the deadline without a checkpoint, and jobs still on a
# node when AWS took it (they crashed with it).
NOTICE_COUNTERS = ("AwsNotices", "NoticeJobsMovedBeforeDeadline", "NoticeJobsStoppedUnsaved",
                   "NoticeJobsStopped", "NoticeJobsCrashed")
BUSINESS_COUNTERS = RECOVERY_COUNTERS + QUARANTINE_COUNTERS + SUSPEND_COUNTERS
RUNBOOK = "Runbook: docs/operations.md of the gpu-training-recovery repository."
# Jobs past their due time: OverdueJobs > 0 in this many one-minute runs of the sweep in a row.
OVERDUE_ALARM_MINUTES = 3


class Invocation(Enum):
    """How a function is invoked: decides when its errors are worth a page."""

    SCHEDULED = "scheduled"  # EventBridge schedule, every minute
    EVENT = "event"  # EventBridge event pattern (asynchronous, retried, DLQ)
    REQUEST = "request"  # API Gateway (synchronous: the caller sees the error)
    QUEUE = "queue"  # SQS event source (a failed message is received again, then its DLQ)


@dataclass(frozen=True)
class ErrorAlarmPolicy:
    """Errors >= ``threshold`` in ``datapoints`` of ``periods`` periods of ``minutes``."""

    minutes: int
    threshold: int
    periods: int
    datapoints: int


ERROR_ALARM_POLICIES = {
    Invocation.SCHEDULED: ErrorAlarmPolicy(minutes=1, threshold=1, periods=3, datapoints=3),
    Invocation.EVENT: ErrorAlarmPolicy(minutes=5, threshold=1, periods=3, datapoints=2),
    Invocation.REQUEST: ErrorAlarmPolicy(minutes=5, threshold=5, periods=2, datapoints=2),
    Invocation.QUEUE: ErrorAlarmPolicy(minutes=5, threshold=1, periods=3, datapoints=2),
}


def error_alarm_description(name: str, fn: RecoveryFunction, invocation: Invocation) -> str:
    logs = f"Read the ERROR lines of its log group {fn.log_group.log_group_name} (CloudWatch Logs Insights)"
    if invocation is Invocation.SCHEDULED:
        return (
            f"{name} ({fn.service_name}) failed in each of the last 3 one-minute runs; a single "
            f"failed run is retried and does not page. Timeouts, reboots and escalations it "
            f"drives are late until it runs again. {logs}; usual causes: DynamoDB throttling, "
            f"a changed IAM policy, the ECS cluster renamed or deleted. Run `gpu-recovery-admin "
            f"doctor`. Once fixed, the next tick catches up by itself: nothing to replay. {RUNBOOK}"
        )
    if invocation is Invocation.QUEUE:
        return (
            f"{name} ({fn.service_name}) failed in two of the last three 5-minute periods. Each "
            f"failed batch of a large job's ranks is received again after the queue's visibility "
            f"timeout, then kept in its dead-letter queue: that job's stop or restart is stalled "
            f"meanwhile. {logs}; run `gpu-recovery-admin doctor`; once fixed, move what reached "
            f"the dead-letter queue back (section 'Dead-letter queues'). {RUNBOOK}"
        )
    if invocation is Invocation.EVENT:
        return (
            f"{name} ({fn.service_name}) kept failing for 10 minutes or more. Failed ECS events "
            f"are retried and finally kept in its dead-letter queue, so GPU faults may be "
            f"waiting unhandled. {logs}; run `gpu-recovery-admin doctor`; once fixed, replay "
            f"what reached the dead-letter queue (section 'Dead-letter queues'). {RUNBOOK}"
        )
    return (
        f"{name} ({fn.service_name}) answered 5 or more errors in each of two 5-minute periods: "
        f"callers (node agents, gpujobs, training code) got 5xx. Node agents retry every 30 s, but "
        f"nodes that cannot report are marked NODE_LOST after heartbeat_stale_seconds; a job "
        f"that cannot learn of its suspend is stopped by force after its grace. {logs}; check the "
        f"API's 5XX on the dashboard and `gpu-recovery-admin doctor`. {RUNBOOK}"
    )


def dlq_alarm_description(name: str, invocation: Invocation) -> str:
    if invocation is Invocation.QUEUE:
        return (
            f"A batch of {name} (stopping or starting up to 100 ranks of a large job) failed "
            f"{GANG_QUEUE_MAX_RECEIVES} receives and is kept in its dead-letter queue (stack output "
            f"{name}DeadLetterQueueUrl, 14 days): those ranks may not have been stopped or "
            f"started, and the job waits. Read the worker's ERROR log lines, fix the cause, then "
            f"move the messages back to the gang queue (aws sqs start-message-move-task "
            f"--source-arn <the DLQ's ARN>; batches are idempotent, a replay repeats nothing). "
            f"The alarm clears when the queue is empty. {RUNBOOK}"
        )
    if invocation is Invocation.SCHEDULED:
        return (
            f"A {name} tick failed all {1 + SCHEDULED_ASYNC_RETRIES} tries (one run and "
            f"{SCHEDULED_ASYNC_RETRIES} retries, minutes apart) and was set aside in its "
            f"dead-letter queue: it failed repeatedly, not once. The tick carries no data: fix "
            f"the cause from the function's ERROR log lines (see its Errors alarm), then purge "
            f"the queue (stack output {name}DeadLetterQueueUrl; aws sqs purge-queue). The alarm "
            f"clears when the queue is empty. {RUNBOOK}"
        )
    return (
        f"An ECS event for {name} failed every retry and is kept in its dead-letter queue "
        f"(stack output {name}DeadLetterQueueUrl, 14 days): that job or node may not have "
        f"been recovered. Read the message (aws sqs receive-message) and the function's ERROR "
        f"log lines, fix the cause, replay the event (section 'Dead-letter queues'), then "
        f"delete the message. The alarm clears when the queue is empty. {RUNBOOK}"
    )


def overdue_alarm_description(sweep: RecoveryFunction) -> str:
    late = f"{OVERDUE_AFTER_SECONDS // 60} minutes"
    return (
        f"A job is stuck: in {OVERDUE_ALARM_MINUTES} runs in a row the recovery sweep "
        f"({sweep.node.id}) counted job(s) {late} or more past the deadline of their next "
        f"step ({METRIC_OVERDUE_JOBS}). Nothing moves them on: they neither recover nor fail, and "
        f"nobody else is told. No data counts as breaching (the sweep did not report: see "
        f"{sweep.node.id}ErrorsAlarm). Run `gpu-recovery-admin doctor`: it lists each overdue "
        f"job, its state and last error. Read the ERROR lines 'sweep step failed' (the failed "
        f"call's traceback) in log group {sweep.log_group.log_group_name}, fix the cause: the next "
        f"sweep goes on by itself, nothing to replay. A job nothing moves on is settled by hand "
        f"(section 'Overdue jobs'). {RUNBOOK}"
    )


def _stops_given_up_description(sweep: RecoveryFunction, *, whose_ranks: str, metric_name: str,
                                consequence: str, log_line: str, section: str) -> str:
    """What the two give-up alarms say alike: how many asks, the metric, where the job is named and
    what to do with its nodes; ``whose_ranks`` ends with the ranks' subject (they/its ... were)."""
    return (
        f"The recovery sweep ({sweep.node.id}) gave up the stop of {whose_ranks} asked to stop "
        f"{1 + MAX_STOP_ROUNDS} times and one is still not confirmed stopped ({metric_name}). "
        f"{consequence}, typically on a node whose ECS agent is gone. Read the ERROR line "
        f"'{log_line}' in log group {sweep.log_group.log_group_name} (it names the job and "
        f"attempt); `gpujobs show` lists its ranks' nodes: stop a task of the attempt still running "
        f"by hand, replace a node whose agent is gone (section '{section}'). {RUNBOOK}"
    )


def aborted_launch_stops_alarm_description(sweep: RecoveryFunction) -> str:
    return _stops_given_up_description(
        sweep, whose_ranks="a queue launch it aborted: its started ranks were",
        metric_name=METRIC_ABORTED_LAUNCH_STOPS_GIVEN_UP,
        consequence="The job, queued again unless its launch failed it, may start while that rank still runs",
        log_line="stops of an aborted launch given up",
        section="Aborted launches whose stops were given up")


def ended_job_stops_alarm_description(sweep: RecoveryFunction) -> str:
    return _stops_given_up_description(
        sweep, whose_ranks="an ended job's ranks: they were",
        metric_name=METRIC_ENDED_JOB_STOPS_GIVEN_UP,
        consequence=("The job is over (failed, canceled or completed) but that rank may still run and "
                     "hold its node's GPUs"),
        log_line="stops of an ended job given up",
        section="Ended jobs whose stops were given up")


def sweep_metric(sweep: RecoveryFunction, metric_name: str = METRIC_OVERDUE_JOBS,
                        statistic: str = "Maximum", minutes: int = 1) -> cloudwatch.Metric:
    """A metric the sweep emits (Powertools: namespace, ``service`` dimension): once per run by
    default, or when it happens (another ``statistic`` over ``minutes``)."""
    return cloudwatch.Metric(namespace=METRICS_NAMESPACE, metric_name=metric_name,
                             dimensions_map={"service": sweep.service_name}, statistic=statistic,
                             period=Duration.minutes(minutes))


class Monitoring(Construct):
    """An error alarm per function, a depth alarm per dead-letter queue, the dashboard.

    ``invocations`` says how each function of ``functions`` is invoked (every function
    needs one); ``dead_letter_queues`` are named like the function they serve;
    ``recovery_sweep`` emits the overdue-jobs metric.
    Attributes: ``error_alarms``, ``dlq_alarms`` (by name), ``overdue_alarm``,
    ``aborted_launch_stops_alarm``, ``ended_job_stops_alarm``, ``alarms`` (all), ``dashboard``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Mapping[str, RecoveryFunction],
        invocations: Mapping[str, Invocation],
        dead_letter_queues: Mapping[str, sqs.IQueue],
        topic: sns.ITopic,
        recovery_sweep: RecoveryFunction,
        rest_api: apigw.RestApi | None = None,
        work_queues: Mapping[str, sqs.IQueue] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        missing = set(functions) - set(invocations)
        if missing:
            raise ValueError(f"say how these functions are invoked: {sorted(missing)}")
        self.error_alarms: dict[str, cloudwatch.Alarm] = {}
        self.dlq_alarms: dict[str, cloudwatch.Alarm] = {}
        action = cw_actions.SnsAction(topic)

        for name, queue in dead_letter_queues.items():
            alarm = cloudwatch.Alarm(
                self, f"{name}DlqAlarm",
                alarm_description=dlq_alarm_description(name, invocations.get(name, Invocation.EVENT)),
                metric=queue.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(1), statistic="Maximum"),
                threshold=0,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(action)
            self.dlq_alarms[name] = alarm
        for name, fn in functions.items():
            policy = ERROR_ALARM_POLICIES[invocations[name]]
            alarm = cloudwatch.Alarm(
                self, f"{name}ErrorsAlarm",
                alarm_description=error_alarm_description(name, fn, invocations[name]),
                metric=fn.function.metric_errors(period=Duration.minutes(policy.minutes), statistic="Sum"),
                threshold=policy.threshold,
                evaluation_periods=policy.periods,
                datapoints_to_alarm=policy.datapoints,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(action)
            self.error_alarms[name] = alarm
        self.overdue_alarm = cloudwatch.Alarm(
            self, "OverdueJobsAlarm",
            alarm_description=overdue_alarm_description(recovery_sweep),
            metric=sweep_metric(recovery_sweep),
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=OVERDUE_ALARM_MINUTES,
            datapoints_to_alarm=OVERDUE_ALARM_MINUTES,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        self.overdue_alarm.add_alarm_action(action)
        self.aborted_launch_stops_alarm = self._pages_on_any(
            "AbortedLaunchStopsGivenUpAlarm", recovery_sweep, METRIC_ABORTED_LAUNCH_STOPS_GIVEN_UP,
            aborted_launch_stops_alarm_description(recovery_sweep), action)
        self.ended_job_stops_alarm = self._pages_on_any(
            "EndedJobStopsGivenUpAlarm", recovery_sweep, METRIC_ENDED_JOB_STOPS_GIVEN_UP,
            ended_job_stops_alarm_description(recovery_sweep), action)
        self.alarms: list[cloudwatch.Alarm] = [*self.dlq_alarms.values(), *self.error_alarms.values(),
                                               self.overdue_alarm, self.aborted_launch_stops_alarm,
                                               self.ended_job_stops_alarm]
        self.dashboard = self._dashboard(functions, dead_letter_queues, rest_api, work_queues or {},
                                         recovery_sweep)

    def _pages_on_any(self, scope_id: str, sweep: RecoveryFunction, metric_name: str, description: str,
                      action: cw_actions.SnsAction) -> cloudwatch.Alarm:
        """An alarm paging as soon as one of the sweep's ``metric_name`` is counted in 5 minutes; no
        data is not breaching (the metric is emitted only when it happens)."""
        alarm = cloudwatch.Alarm(
            self, scope_id,
            alarm_description=description,
            metric=sweep_metric(sweep, metric_name, "Sum", 5),
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(action)
        return alarm

    def _dashboard(self, functions: Mapping[str, RecoveryFunction],
                   dead_letter_queues: Mapping[str, sqs.IQueue],
                   rest_api: apigw.RestApi | None,
                   work_queues: Mapping[str, sqs.IQueue],
                   recovery_sweep: RecoveryFunction) -> cloudwatch.Dashboard:
        period = Duration.minutes(5)
        dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(24))
        dashboard.add_widgets(cloudwatch.TextWidget(
            width=24, height=2,
            markdown=("**GPU training recovery.** Something red below? Run `gpu-recovery-admin "
                      "doctor --stack-name <stack>` and see docs/operations.md (alarms, "
                      "dead-letter queues, quarantined nodes)."),
        ))
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Recoveries, failures and what led to them (all services)", width=8,
                left=[_total(name, period) for name in RECOVERY_COUNTERS],
            ),
            cloudwatch.GraphWidget(
                title="Time to restart after a fault, MTTR (s)", width=8,
                left=[
                    _combined("AVG", TIME_TO_RESTART, "Average", period, "MTTR (average)"),
                    _combined("MAX", TIME_TO_RESTART, "p90", period, "p90"),
                    _combined("MAX", TIME_TO_RESTART, "Maximum", period, "slowest"),
                ],
            ),
            cloudwatch.GraphWidget(
                title="Quarantined nodes and remediation circuit breaker", width=8,
                left=[_total(name, period) for name in QUARANTINE_COUNTERS],
                right=[_combined("MAX", BREAKER_GAUGE, "Maximum", period, "breaker open (1)")],
            ),
        )
        dashboard.add_widgets(cloudwatch.GraphWidget(
            title=("Suspects the stack's own DCGM check cleared, by evidence source (a source that keeps "
                   "naming healthy nodes cries wolf: docs/remediation.md, issue 49)"),
            width=24,
            left=[cloudwatch.MathExpression(
                expression=(f"SEARCH('{{{METRICS_NAMESPACE},{DIMENSION_EVIDENCE_SOURCE},service}} "
                            f"MetricName=\"{METRIC_SUSPECTS_CLEARED}\"', 'Sum', {int(period.to_seconds())})"),
                using_metrics={}, label="", period=period)],
        ))
        dashboard.add_widgets(*self._goodput_widgets())
        dashboard.add_widgets(cloudwatch.GraphWidget(
            title=(f"Jobs past their due time (should be 0; {OVERDUE_AFTER_SECONDS // 60} min or more late), "
                   "and how late the oldest due job is (s, right)"),
            width=24,
            left=[sweep_metric(recovery_sweep).with_(label="overdue jobs")],
            right=[sweep_metric(recovery_sweep, metric_name=METRIC_OLDEST_DUE_JOB_SECONDS).with_(
                label="oldest due job, s late")],
            right_annotations=[cloudwatch.HorizontalAnnotation(
                value=OVERDUE_AFTER_SECONDS, label="overdue", color=cloudwatch.Color.RED)],
        ))
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Dead-letter queue depth (should be 0)", width=8,
                left=[queue.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(1), statistic="Maximum", label=name)
                    for name, queue in dead_letter_queues.items()],
            ),
            cloudwatch.GraphWidget(
                title="Lambda errors", width=8,
                left=[fn.function.metric_errors(period=period, statistic="Sum", label=name)
                      for name, fn in functions.items()],
            ),
            cloudwatch.GraphWidget(
                title="Lambda duration p90 (ms)", width=8,
                left=[fn.function.metric_duration(period=period, statistic="p90", label=name)
                      for name, fn in functions.items()],
            ),
        )
        sharing = cloudwatch.GraphWidget(
            title="Time sharing: suspends asked, forced after the grace, done (all services)",
            width=12 if work_queues else 24, left=[_total(name, period) for name in SUSPEND_COUNTERS],
        )
        if work_queues:
            minute = Duration.minutes(1)
            dashboard.add_widgets(sharing, cloudwatch.GraphWidget(
                title="Work queues: messages waiting (left), oldest one's age in s (right)", width=12,
                left=[q.metric_approximate_number_of_messages_visible(period=minute, statistic="Maximum",
                                                                      label=name)
                      for name, q in work_queues.items()],
                right=[q.metric_approximate_age_of_oldest_message(period=minute, statistic="Maximum",
                                                                  label=f"{name} oldest")
                       for name, q in work_queues.items()],
            ))
        else:
            dashboard.add_widgets(sharing)
        dashboard.add_widgets(cloudwatch.GraphWidget(
            title="AWS notices: nodes announced, jobs moved before the deadline, stopped unsaved, crashed",
            width=24, left=[_total(name, period) for name in NOTICE_COUNTERS],
        ))
        if rest_api is not None:
            dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="API requests and errors", width=12,
                    left=[
                        rest_api.metric_count(period=period, statistic="Sum", label="Requests"),
                        rest_api.metric_client_error(period=period, statistic="Sum", label="4XX"),
                        rest_api.metric_server_error(period=period, statistic="Sum", label="5XX"),
                    ],
                ),
                cloudwatch.GraphWidget(
                    title="API latency p90 (ms)", width=12,
                    left=[rest_api.metric_latency(period=period, statistic="p90", label="Latency")],
                ),
            )
        dashboard.add_widgets(cloudwatch.AlarmStatusWidget(
            title="Alarms", width=24, alarms=self.alarms,
            sort_by=cloudwatch.AlarmStatusWidgetSortBy.STATE_UPDATED_TIMESTAMP,
        ))
        return dashboard


    @staticmethod
    def _goodput_widgets() -> list[cloudwatch.IWidget]:
        """The goodput ledger of the jobs that ended (docs/goodput.md): GPU-hours lost per
        cause, summed per hour over the services, and the finished jobs' ETTR."""
        hour = Duration.hours(1)
        lost = cloudwatch.MathExpression(
            expression=(f"SEARCH('{{{METRICS_NAMESPACE},{DIMENSION_CAUSE},service}} "
                        f"MetricName=\"{METRIC_GPU_HOURS_LOST}\"', 'Sum', {int(hour.to_seconds())})"),
            using_metrics={}, label="", period=hour)
        return [
            cloudwatch.GraphWidget(
                title="GPU-hours lost per cause, by the jobs that ended (goodput: docs/goodput.md)",
                width=16, stacked=True, left=[lost]),
            cloudwatch.GraphWidget(
                title="ETTR of the jobs that ended (%, productive / time not of the job's own making)",
                width=8, left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
                left=[_combined("AVG", METRIC_JOB_ETTR, "Average", hour, "average"),
                      _combined("MIN", METRIC_JOB_ETTR, "Minimum", hour, "worst job")]),
        ]


def _search(metric_name: str, statistic: str, period: Duration) -> str:
    """Powertools adds a ``service`` dimension; SEARCH finds the metric of every service."""
    return (f"SEARCH('{{{METRICS_NAMESPACE},service}} MetricName=\"{metric_name}\"', "
            f"'{statistic}', {int(period.to_seconds())})")


def _combined(function: str, metric_name: str, statistic: str, period: Duration,
              label: str) -> cloudwatch.MathExpression:
    return cloudwatch.MathExpression(
        expression=f"{function}({_search(metric_name, statistic, period)})",
        using_metrics={}, label=label, period=period,
    )


def _total(metric_name: str, period: Duration) -> cloudwatch.MathExpression:
    """The metric summed over every service that emits it (one line per metric)."""
    return _combined("SUM", metric_name, "Sum", period, metric_name)
