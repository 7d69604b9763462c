"""Dashboard and alarms: Lambda health, DLQ depth and the recovery business metrics."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from gpu_recovery.constants import METRICS_NAMESPACE
from infra.lambda_common import RecoveryFunction

BUSINESS_COUNTERS = ("FaultsDetected", "HealthChecksStarted", "Reboots", "Recoveries", "Failures")
TIME_TO_RESTART = "TimeToRestartSeconds"


class Monitoring(Construct):
    """An error alarm per function, the dashboard, and optionally the API's traffic.

    ``dead_letter_queues`` are graphed; those also in ``unalarmed_dead_letter_queues``
    (queues whose owner made no alarm) get a depth > 0 alarm to ``topic`` here
    (``dlq_alarms``). ``rest_api``: a widget with its requests, 4XX/5XX and latency.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Mapping[str, RecoveryFunction],
        dead_letter_queues: Mapping[str, sqs.IQueue],
        topic: sns.ITopic,
        unalarmed_dead_letter_queues: Mapping[str, sqs.IQueue] | None = None,
        rest_api: apigw.RestApi | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.error_alarms: dict[str, cloudwatch.Alarm] = {}
        self.dlq_alarms: dict[str, cloudwatch.Alarm] = {}
        period = Duration.minutes(5)
        for name, queue in (unalarmed_dead_letter_queues or {}).items():
            alarm = cloudwatch.Alarm(
                self,
                f"{name}DlqAlarm",
                alarm_description=f"{name}: events ended in its dead-letter queue",
                metric=queue.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(1), statistic="Maximum"
                ),
                threshold=0,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(cw_actions.SnsAction(topic))
            self.dlq_alarms[name] = alarm
        for name, fn in functions.items():
            alarm = cloudwatch.Alarm(
                self,
                f"{name}ErrorsAlarm",
                alarm_description=f"{fn.service_name} Lambda function reported errors",
                metric=fn.function.metric_errors(period=period, statistic="Sum"),
                threshold=0,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(cw_actions.SnsAction(topic))
            self.error_alarms[name] = alarm

        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            default_interval=Duration.hours(24),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Recovery events (per service)",
                width=12,
                left=[_search(name, "Sum", period) for name in BUSINESS_COUNTERS],
            ),
            cloudwatch.GraphWidget(
                title="Time to restart (s)",
                width=12,
                left=[_search(TIME_TO_RESTART, stat, period) for stat in ("Average", "Maximum")],
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Lambda errors",
                width=8,
                left=[
                    fn.function.metric_errors(period=period, statistic="Sum", label=name)
                    for name, fn in functions.items()
                ],
            ),
            cloudwatch.GraphWidget(
                title="Lambda duration p90 (ms)",
                width=8,
                left=[
                    fn.function.metric_duration(period=period, statistic="p90", label=name)
                    for name, fn in functions.items()
                ],
            ),
            cloudwatch.GraphWidget(
                title="Dead-letter queue depth",
                width=8,
                left=[
                    queue.metric_approximate_number_of_messages_visible(
                        period=Duration.minutes(1), statistic="Maximum", label=name
                    )
                    for name, queue in dead_letter_queues.items()
                ],
            ),
        )
        if rest_api is not None:
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="API requests and errors",
                    width=12,
                    left=[
                        rest_api.metric_count(period=period, statistic="Sum", label="Requests"),
                        rest_api.metric_client_error(period=period, statistic="Sum", label="4XX"),
                        rest_api.metric_server_error(period=period, statistic="Sum", label="5XX"),
                    ],
                ),
                cloudwatch.GraphWidget(
                    title="API latency p90 (ms)",
                    width=12,
                    left=[rest_api.metric_latency(period=period, statistic="p90", label="Latency")],
                ),
            )


def _search(metric_name: str, statistic: str, period: Duration) -> cloudwatch.MathExpression:
    """Powertools adds a ``service`` dimension; SEARCH finds the metric for every service."""
    return cloudwatch.MathExpression(
        expression=(
            f"SEARCH('{{{METRICS_NAMESPACE},service}} MetricName=\"{metric_name}\"', "
            f"'{statistic}', {int(period.to_seconds())})"
        ),
        using_metrics={},
        label=f"{metric_name} ({statistic})",
        period=period,
    )
