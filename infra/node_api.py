"""The stack's REST API (node heartbeats + GPU telemetry), its authorizer, the
heartbeat sweep and the node-token table.

``NodeApi.rest_api`` is THE RestApi of the stack; other routes are added to it, one
method per route of the route tables in ``gpu_recovery.constants`` (no ``{proxy+}``:
an unknown route or method is refused by API Gateway itself). Every method must carry an
authorization type (the template test rejects NONE):

* the jobs API (``infra/jobs_api.py``): ``JOBS_API_ROUTES``, IAM (SigV4);
* the job-control API (``infra/control_api.py``): ``CONTROL_API_ROUTES``, its own TOKEN
  authorizer (per-rank control tokens of training code).

Stage ``prod`` (``node_api.url`` ends with ``/prod/``): throttling, JSON access logs
to ``node_api.access_log_group``, X-Ray tracing, execution logs (ERROR) and metrics.
The node routes use a TOKEN authorizer (``Authorization: Bearer <node>.<secret>``)
whose Allow covers both node routes and is cached ``authorizer_cache_seconds`` (a
revoked token stops working within that time).
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from gpu_recovery.api_routes import (
    GATEWAY_ERRORS,
    NODE_API_ROUTES,
    NODE_TOKEN_HEADER_PATTERN,
)
from gpu_recovery.constants import (
    ENV_HANG_ACTION,
    ENV_HANG_SECONDS,
    ENV_HEARTBEAT_MAX_SKEW_SECONDS,
    ENV_HEARTBEAT_STALE_SECONDS,
    ENV_HW_SIGNAL_NOTIFY_SECONDS,
    ENV_HW_SIGNAL_RETENTION_SECONDS,
    ENV_NODE_LOST_FAIL_SECONDS,
    ENV_NODE_TOKEN_TABLE,
    HEARTBEAT_SWEEP_RATE_SECONDS,
    HEARTBEAT_SWEEP_TIMEOUT_SECONDS,
    NODE_TOKEN_PK,
)
from infra.lambda_common import (
    SCHEDULED_ASYNC_RETRIES,
    SCHEDULED_MAX_EVENT_AGE,
    LambdaDefaults,
    RecoveryFunction,
)
from infra.nag import acknowledge
from infra.notifications import Notifications
from infra.recovery import EVENT_RETRY_ATTEMPTS, ClusterAccess, acknowledge_star, nag_resource_id
from infra.tables import RecoveryTables

STAGE_NAME = "prod"
#: the node routes under v1/ (api_routes.NODE_API_ROUTES, the one list, all POST)
NODE_ROUTES = tuple(path.removeprefix("v1/") for _, path in NODE_API_ROUTES)
TOKEN_HEADER = "Authorization"


@dataclass(frozen=True)
class HeartbeatConfig:
    """Heartbeat thresholds (env of the node-API and sweep functions)."""

    stale_seconds: int = 180
    node_lost_fail_seconds: int = 1800  # 0 disables
    hang_seconds: int = 0  # 0 disables hang detection
    hang_action: str = "notify"  # notify | recover
    max_skew_seconds: int = 300
    throttle_rate: float = 1000.0  # requests/s, stage-wide (10,000 nodes at 30 s send ~667/s)
    throttle_burst: int = 2000
    authorizer_cache_seconds: int = 300
    signal_notify_seconds: int = 3600  # one hardware-signal e-mail per node and kind at most
    signal_retention_seconds: int = 604_800

    def __post_init__(self) -> None:
        if self.hang_action not in ("notify", "recover"):
            raise ValueError(f"hang_action must be 'notify' or 'recover', got {self.hang_action!r}")
        if not 0 <= self.authorizer_cache_seconds <= 3600:
            raise ValueError("authorizer_cache_seconds must be within 0..3600")

    def environment(self) -> dict[str, str]:
        return {
            ENV_HEARTBEAT_STALE_SECONDS: str(self.stale_seconds),
            ENV_NODE_LOST_FAIL_SECONDS: str(self.node_lost_fail_seconds),
            ENV_HANG_SECONDS: str(self.hang_seconds),
            ENV_HANG_ACTION: self.hang_action,
            ENV_HEARTBEAT_MAX_SKEW_SECONDS: str(self.max_skew_seconds),
            ENV_HW_SIGNAL_NOTIFY_SECONDS: str(self.signal_notify_seconds),
            ENV_HW_SIGNAL_RETENTION_SECONDS: str(self.signal_retention_seconds),
        }


class NodeApi(Construct):
    """Attributes: ``rest_api``, ``v1`` (the /v1 resource), ``stage``, ``url``,
    ``token_table``, ``authorizer``, ``authorizer_function``, ``api_function``,
    ``sweep_function``, ``functions``, ``access_log_group``, ``sweep_rule``,
    ``sweep_dead_letter_queue``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        defaults: LambdaDefaults,
        tables: RecoveryTables,
        notifications: Notifications,
        access: ClusterAccess,
        heartbeat: HeartbeatConfig | None = None,
        removal_policy: str = "retain",
    ) -> None:
        super().__init__(scope, construct_id)
        config = heartbeat or HeartbeatConfig()
        self.access = access
        policy = RemovalPolicy.DESTROY if removal_policy == "destroy" else RemovalPolicy.RETAIN

        self.token_table = dynamodb.Table(
            self, "NodeTokenTable",
            partition_key=dynamodb.Attribute(name=NODE_TOKEN_PK, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            removal_policy=policy,
        )
        token_env = {ENV_NODE_TOKEN_TABLE: self.token_table.table_name}
        env = {**token_env, **config.environment()}

        # ------------------------------------------------------------- functions
        self.authorizer_function = RecoveryFunction(
            self, "Authorizer", defaults=defaults, handler="handlers.node_authorizer.lambda_handler",
            service_name="node-authorizer", description="Node API: checks node report tokens",
            timeout=Duration.seconds(10), extra_environment=token_env,
        )
        iam.Grant.add_to_principal(grantee=self.authorizer_function.role, actions=["dynamodb:GetItem"],
                                   resource_arns=[self.token_table.table_arn])
        # StartTask / PassRole: the node API hands a rebooted node's boot report to the
        # recovery loop, which gang-restarts the jobs waiting for it, and (hang_action
        # recover) a hung rank to a health check; the sweep escalates NODE_LOST ranks to
        # a health check. PassRole stays limited to the task-role prefix. A fault entering
        # recovery reserves its job's nodes (PutAttributes) and, with a spare pool, decides
        # the spare it moves to (ListContainerInstances: the cluster's free nodes).
        recovery_permissions = [access.describe_container_instances, access.start_task, access.stop_task,
                                access.describe_tasks, access.list_tasks, access.list_container_instances,
                                access.placement_attributes]
        self.api_function = RecoveryFunction(
            self, "NodeApiFunction", defaults=defaults, handler="handlers.node_api.lambda_handler",
            service_name="node-api", description="Node API: task heartbeats and GPU telemetry",
            timeout=Duration.seconds(25), memory_size=512, extra_environment=env,
        )
        self.sweep_function = RecoveryFunction(
            self, "HeartbeatSweep", defaults=defaults, handler="handlers.heartbeat_sweep.lambda_handler",
            service_name="heartbeat-sweep",
            description="Every minute: stale heartbeats -> NODE_LOST; NODE_LOST too long -> recovery",
            timeout=Duration.seconds(HEARTBEAT_SWEEP_TIMEOUT_SECONDS), extra_environment=env,
        )
        self.functions = {"Authorizer": self.authorizer_function, "NodeApi": self.api_function,
                          "HeartbeatSweep": self.sweep_function}
        # Placement attributes (recovery.cordons): a node back after its reboot (boot report)
        # is uncordoned and its waiting jobs' relocation releases holds (the node API); a node
        # lost whose quarantine the breaker held is cordoned (the sweep).
        for fn, extra in ((self.api_function, [access.placement_attributes]),
                          (self.sweep_function, [access.update_container_instances_state,
                                                 access.placement_attributes])):
            for make in recovery_permissions + extra:
                fn.add_to_policy(*make())
            tables.grant_read_write_data(fn.role)
            notifications.grant_publish(fn.role)
        for fn in self.functions.values():
            self._acknowledge_wildcards(fn)

        # --------------------------------------------------------------- REST API
        self.access_log_group = logs.LogGroup(self, "AccessLogs", retention=logs.RetentionDays.THREE_MONTHS,
                                              removal_policy=RemovalPolicy.DESTROY)
        self.rest_api = apigw.RestApi(
            self, "RestApi",
            rest_api_name=f"{scope.node.id}-gpu-recovery-api"[:120],
            description="GPU training recovery: node heartbeats / telemetry (token) and jobs (IAM)",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=RemovalPolicy.DESTROY,
            deploy_options=apigw.StageOptions(
                stage_name=STAGE_NAME,
                throttling_rate_limit=config.throttle_rate,
                throttling_burst_limit=config.throttle_burst,
                tracing_enabled=True,
                metrics_enabled=True,
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                access_log_destination=apigw.LogGroupLogDestination(self.access_log_group),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True, http_method=True, ip=True, protocol=True, request_time=True,
                    resource_path=True, response_length=True, status=True, user=True),
            ),
        )
        self.stage = self.rest_api.deployment_stage
        self.url = self.rest_api.url
        self.authorizer_cache_seconds = config.authorizer_cache_seconds
        self.authorizer = apigw.TokenAuthorizer(
            self, "TokenAuthorizer",
            handler=self.authorizer_function.function,
            identity_source=apigw.IdentitySource.header(TOKEN_HEADER),
            validation_regex=NODE_TOKEN_HEADER_PATTERN,
            results_cache_ttl=Duration.seconds(config.authorizer_cache_seconds),
        )
        validator = self.rest_api.add_request_validator(
            "BodyValidator", validate_request_body=True, validate_request_parameters=True)
        report_model = self.rest_api.add_model(
            "NodeReport", content_type="application/json",
            schema=apigw.JsonSchema(
                schema=apigw.JsonSchemaVersion.DRAFT4, type=apigw.JsonSchemaType.OBJECT,
                required=["node_id", "timestamp"],
                properties={"node_id": apigw.JsonSchema(type=apigw.JsonSchemaType.STRING, max_length=128),
                            "timestamp": apigw.JsonSchema(type=apigw.JsonSchemaType.NUMBER)}),
        )
        integration = apigw.LambdaIntegration(self.api_function.function)
        self.v1 = self.rest_api.root.add_resource("v1")
        self.node_methods: dict[str, apigw.Method] = {}
        for route in NODE_ROUTES:
            self.node_methods[route] = self.v1.add_resource(route).add_method(
                "POST", integration,
                authorizer=self.authorizer, authorization_type=apigw.AuthorizationType.CUSTOM,
                request_validator=validator,
                request_models={"application/json": report_model},
            )
        # What API Gateway answers itself (bad token, unsigned call, unknown route or method,
        # throttled, too large, body schema) comes in the APIs' error shape; local mode
        # sends the same (gpu_recovery.api_routes.GATEWAY_ERRORS).
        responses = [(apigw.ResponseType.of(name), '"' + message + '"')
                     for name, (_, message) in GATEWAY_ERRORS.items()]
        responses += [(apigw.ResponseType.BAD_REQUEST_BODY, '"$context.error.validationErrorString"'),
                      (apigw.ResponseType.DEFAULT_4_XX, "$context.error.messageString"),
                      (apigw.ResponseType.DEFAULT_5_XX, "$context.error.messageString")]
        for response_type, message in responses:
            self.rest_api.add_gateway_response(
                f"{response_type.response_type}Response", type=response_type,
                templates={"application/json":
                           '{"error": "$context.error.responseType", "message": ' + message + '}'})
        acknowledge(
            self.rest_api,
            ("AwsSolutions-APIG3", "Node reports are authenticated per node by the token authorizer "
             "and throttled at the stage; WAF is left to the operator (web ACL of their choice)."),
            ("AwsSolutions-COG4", "Callers are GPU node agents (per-node bearer tokens, Lambda "
             "authorizer) and IAM principals (jobs routes); there are no Cognito users."),
            ("AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
             "AmazonAPIGatewayPushToCloudWatchLogs]",
             "The account-level API Gateway CloudWatch role must use the AWS managed push-to-logs "
             "policy (execution logging of the stage needs it)."),
        )

        # ------------------------------------------------------------------ sweep
        dlq = sqs.Queue(self, "SweepDlq", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                        retention_period=Duration.days(14))
        acknowledge(dlq, ("AwsSolutions-SQS3", "This queue is the dead-letter queue of the sweep "
                                               "schedule target; a DLQ of a DLQ would never be read."))
        self.sweep_dead_letter_queue = dlq
        self.sweep_rule = events.Rule(
            self, "HeartbeatSweepRule", description="Heartbeat sweep: stale ranks, NODE_LOST timeouts",
            schedule=events.Schedule.rate(Duration.seconds(HEARTBEAT_SWEEP_RATE_SECONDS)),
        )
        # Same delivery retries as the other two every-minute rules (recovery sweep,
        # scheduler): EventBridge retries only a failed delivery (a throttled asynchronous
        # invoke), within the 5-minute event age, instead of dead-lettering it at once.
        self.sweep_rule.add_target(targets.LambdaFunction(
            self.sweep_function.function, dead_letter_queue=dlq, retry_attempts=EVENT_RETRY_ATTEMPTS,
            max_event_age=SCHEDULED_MAX_EVENT_AGE))
        # As the recovery sweep and the scheduler: a failed run is retried by Lambda (a
        # throttle passes); only a run that failed every retry lands in the same DLQ.
        self.sweep_function.function.configure_async_invoke(
            max_event_age=SCHEDULED_MAX_EVENT_AGE, retry_attempts=SCHEDULED_ASYNC_RETRIES,
            on_failure=destinations.SqsDestination(dlq),
        )

    @property
    def stage_url(self) -> str:
        """The ``prod`` stage's base URL (``https://<id>.execute-api.<region>.<suffix>/prod/``,
        as ``url``) built from the RestApi id alone. ``url`` references the stage, which
        depends on the deployment, which depends on every method: a function whose
        environment holds ``url`` and that a method's function references in turn (the
        scheduler, named in the jobs API's environment) would close a dependency cycle."""
        return (f"https://{self.rest_api.rest_api_id}.execute-api.{Aws.REGION}.{Aws.URL_SUFFIX}"
                f"/{STAGE_NAME}/")

    def _acknowledge_wildcards(self, fn: RecoveryFunction) -> None:
        access = self.access
        reasons = {
            access.container_instance_arns: (
                "Container instance ids are generated by ECS; limited to instances of this one "
                "cluster (container-instance/<cluster>/*) and ArnEquals ecs:cluster."),
            access.task_definition_arns: (
                "A hung / lost job handed to the recovery loop starts the DCGM health check (task "
                "definition known only by family); limited to this cluster by ArnEquals ecs:cluster."),
            access.task_arns: (
                "Task ids are generated by ECS; limited to tasks of this one cluster "
                "(task/<cluster>/*) and ArnEquals ecs:cluster."),
            access.task_role_arns: (
                "A rebooted node's waiting jobs are restarted with their own roles: PassRole "
                "only on roles named with the configured prefix (task_role_name_prefix) and "
                "only to ecs-tasks.amazonaws.com."),
        }
        resources: set[str] = set()
        for statement in fn.statements:
            resources.update(statement.resources)
        for resource, reason in reasons.items():
            if resource in resources:
                acknowledge(fn.role, (f"AwsSolutions-IAM5[Resource::{nag_resource_id(self, resource)}]",
                                      reason))
        acknowledge_star(fn)
