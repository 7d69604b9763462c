"""The jobs API: ``/v1/jobs`` routes on an existing REST API, its Lambda and idempotency table.

``JobsApi`` plugs into a ``RestApi`` created elsewhere (``infra/node_api.py``); every
method it adds uses ``AuthorizationType.IAM`` (SigV4). The function gets least-privilege
permissions:

- DynamoDB data actions on the job table and its indexes (named, no Scan), on the
  idempotency table and (time sharing) on the quota table: quota views, limits set by
  administrators, the submit-time check against a user's quota;
- ``ecs:DescribeTaskDefinition`` on ``*`` (the action supports no resource-level
  permission), ``ecs:ListContainerInstances`` on the cluster, and
  ``ecs:DescribeContainerInstances`` / ``ecs:StopTask`` limited to the cluster;
- ``logs:GetLogEvents`` on the training log groups. Limitation: IAM cannot tie a log group
  to the cluster whose tasks write to it, so the groups are given by name or name pattern
  (``training_log_groups``, default ``/ecs/*``: the ECS console's ``/ecs/<family>``
  convention). Jobs whose task definitions log elsewhere need their group listed here;
- ``lambda:InvokeFunction`` on the scheduler function only (asynchronous trigger);
- granted by the stack (infra/stack.py): the ECS budget's item of the instance table
  (its StopTask calls take their tokens there; no other instance item) and
  ``sqs:SendMessage`` on the gang queue (a large job's cancel stops its ranks in batches).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from gpu_recovery.api_routes import JOBS_API_ROUTES
from gpu_recovery.constants import (
    ENV_CLUSTER_NAME,
    ENV_IDEMPOTENCY_TABLE,
    ENV_JOB_TABLE,
    ENV_QUOTA_TABLE,
    ENV_SCHEDULER_FUNCTION,
    table_definitions,
)
from infra.lambda_common import LambdaDefaults, RecoveryFunction
from infra.nag import acknowledge
from infra.tables import READ_WRITE_DATA_ACTIONS

JOBS_API_HANDLER = "handlers.jobs_api.lambda_handler"
DEFAULT_TRAINING_LOG_GROUPS = ("/ecs/*",)
JOB_TABLE_ACTIONS = [
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
]
IDEMPOTENCY_ACTIONS = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"]

# (HTTP method, resource path under the API root): one table with local mode's router.
SWAGGER_ROUTE = ("GET", "swagger")
ROUTES: tuple[tuple[str, str], ...] = tuple(r for r in JOBS_API_ROUTES if r != SWAGGER_ROUTE)


class JobsApi(Construct):
    """Adds the jobs API to ``rest_api``.

    Attributes: ``function`` (RecoveryFunction: ``.function``, ``.role``, ``.log_group``),
    ``idempotency_table``, ``methods`` ({"POST /v1/jobs": Method, ...}).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        rest_api: apigateway.IRestApi,
        job_table: dynamodb.ITable,
        cluster_name: str,
        defaults: LambdaDefaults,
        idempotency_table: dynamodb.ITable | None = None,
        scheduler_function: lambda_.IFunction | None = None,
        job_table_index_names: Sequence[str] | None = None,
        training_log_groups: Sequence[str] = DEFAULT_TRAINING_LOG_GROUPS,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        swagger: bool = True,
        extra_environment: Mapping[str, str] | None = None,
        quota_table: dynamodb.ITable | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        region, account, partition = stack.region, stack.account, stack.partition
        cluster_arn = f"arn:{partition}:ecs:{region}:{account}:cluster/{cluster_name}"

        if idempotency_table is None:
            idempotency_table = dynamodb.Table(
                self,
                "IdempotencyTable",
                partition_key=dynamodb.Attribute(name="id", type=dynamodb.AttributeType.STRING),
                time_to_live_attribute="expiration",
                billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
                point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                    point_in_time_recovery_enabled=True
                ),
                encryption=dynamodb.TableEncryption.AWS_MANAGED,
                removal_policy=removal_policy,
            )
        self.idempotency_table = idempotency_table

        environment = {
            **(extra_environment or {}),  # authorization settings (AccessPolicy.from_env)
            ENV_JOB_TABLE: job_table.table_name,
            ENV_CLUSTER_NAME: cluster_name,
            ENV_IDEMPOTENCY_TABLE: idempotency_table.table_name,
        }
        if quota_table is not None:
            environment[ENV_QUOTA_TABLE] = quota_table.table_name
        if scheduler_function is not None:
            environment[ENV_SCHEDULER_FUNCTION] = scheduler_function.function_name
        self.function = RecoveryFunction(
            self,
            "JobsApi",
            defaults=defaults,
            handler=JOBS_API_HANDLER,
            service_name="jobs-api",
            description="Jobs API: submit, list, get, cancel, events and logs of queued GPU jobs",
            timeout=Duration.seconds(29),
            memory_size=512,
            extra_environment=environment,
        )

        # ----------------------------------------------------------------- DynamoDB
        if job_table_index_names is None:
            job_table_index_names = [
                gsi["IndexName"] for gsi in table_definitions()["job"].get("GlobalSecondaryIndexes", [])
            ]
        self.function.add_to_policy(
            iam.PolicyStatement(
                sid="JobTableData",
                actions=JOB_TABLE_ACTIONS,
                resources=[job_table.table_arn]
                + [f"{job_table.table_arn}/index/{name}" for name in job_table_index_names],
            ),
            iam.PolicyStatement(
                sid="IdempotencyTableData",
                actions=IDEMPOTENCY_ACTIONS,
                resources=[idempotency_table.table_arn],
            ),
        )
        if quota_table is not None:
            self.function.add_to_policy(
                iam.PolicyStatement(
                    sid="QuotaTableData",
                    actions=READ_WRITE_DATA_ACTIONS,
                    resources=[quota_table.table_arn]
                    + [f"{quota_table.table_arn}/index/{gsi['IndexName']}"
                       for gsi in table_definitions()["quota"].get("GlobalSecondaryIndexes", [])],
                )
            )
        # ----------------------------------------------------------------------- ECS
        task_arns = f"arn:{partition}:ecs:{region}:{account}:task/{cluster_name}/*"
        container_instance_arns = (
            f"arn:{partition}:ecs:{region}:{account}:container-instance/{cluster_name}/*")
        in_cluster = {"ArnEquals": {"ecs:cluster": cluster_arn}}
        self.function.add_to_policy(
            iam.PolicyStatement(
                sid="DescribeTaskDefinitions",
                actions=["ecs:DescribeTaskDefinition"],
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="ListContainerInstancesOfCluster",
                actions=["ecs:ListContainerInstances"],
                resources=[cluster_arn],
            ),
            iam.PolicyStatement(
                sid="DescribeContainerInstancesInCluster",
                actions=["ecs:DescribeContainerInstances"],
                resources=[container_instance_arns],
                conditions=in_cluster,
            ),
            iam.PolicyStatement(
                sid="StopTaskInCluster",
                actions=["ecs:StopTask"],
                resources=[task_arns],
                conditions=in_cluster,
            ),
        )
        # ---------------------------------------------------------------------- Logs
        log_group_arns = [
            f"arn:{partition}:logs:{region}:{account}:log-group:{name}:*" for name in training_log_groups
        ]
        self.function.add_to_policy(
            iam.PolicyStatement(
                sid="ReadTrainingLogs", actions=["logs:GetLogEvents"], resources=log_group_arns
            )
        )
        # ------------------------------------------------------------------ scheduler
        if scheduler_function is not None:
            self.function.add_to_policy(
                iam.PolicyStatement(
                    sid="TriggerScheduler",
                    actions=["lambda:InvokeFunction"],
                    resources=[scheduler_function.function_arn],
                )
            )
        self._acknowledge(task_arns, container_instance_arns, log_group_arns)

        # ------------------------------------------------------------------- routes
        integration = apigateway.LambdaIntegration(self.function.function, allow_test_invoke=False)
        self.methods: dict[str, apigateway.Method] = {}
        routes = list(ROUTES) + ([SWAGGER_ROUTE] if swagger else [])
        for http_method, path in routes:
            resource = rest_api.root.resource_for_path(path)
            method = resource.add_method(
                http_method,
                integration,
                authorization_type=apigateway.AuthorizationType.IAM,
            )
            acknowledge(
                method,
                (
                    "AwsSolutions-COG4",
                    "The jobs API is authorized with IAM (SigV4, AuthorizationType AWS_IAM): "
                    "callers are IAM principals, not Cognito user-pool users.",
                ),
            )
            self.methods[f"{http_method} /{path}"] = method

    def _acknowledge(self, task_arns: str, container_instance_arns: str,
                     log_group_arns: list[str]) -> None:
        from infra.recovery import nag_resource_id

        role = self.function.role
        acknowledge(
            role,
            (
                "AwsSolutions-IAM5[Resource::*]",
                "ecs:DescribeTaskDefinition (validating a submitted task definition) and X-Ray "
                "PutTraceSegments/PutTelemetryRecords support no resource-level permissions.",
            ),
            (
                f"AwsSolutions-IAM5[Resource::{nag_resource_id(self, task_arns)}]",
                "Task ids are generated by ECS; StopTask (cancel) is limited to tasks of this "
                "cluster (task/<cluster>/*) and additionally by ArnEquals ecs:cluster.",
            ),
            (
                f"AwsSolutions-IAM5[Resource::{nag_resource_id(self, container_instance_arns)}]",
                "Container instance ids are generated by ECS; DescribeContainerInstances (GPU "
                "capacity check) is limited to this cluster and by ArnEquals ecs:cluster.",
            ),
        )
        for arn in log_group_arns:
            acknowledge(
                role,
                (
                    f"AwsSolutions-IAM5[Resource::{nag_resource_id(self, arn)}]",
                    "Log streams are named after ECS task ids (<prefix>/<container>/<task-id>), "
                    "unknown at deploy time; only GetLogEvents on the training log groups.",
                ),
            )
