"""The job-control routes training code calls (time sharing): ``GET /v1/control`` and
``POST /v1/control/suspend`` on THE RestApi (``infra/node_api.py``), stage ``prod``.

Callers are the ranks of queue jobs (``gpu_recovery_client``): they hold no AWS
credentials, only the per-rank control token the launcher put in their environment, so
the routes use a Lambda TOKEN authorizer (``Authorization: Bearer <job>.<rank>.<mac>``)
like the node routes, with the same identity validation expression (a malformed header
is refused by API Gateway without invoking the authorizer) and result cache. Its Allow
covers both routes of the stage, so one cached decision serves a rank's polls.

Least privilege:

- the authorizer: ``dynamodb:GetItem`` on the job table only (the job's control secret);
- the control function: the recovery service's ``go_suspend`` (read and write the job
  and rank items: the job table and its indexes, the same data actions as the recovery
  functions; ``ecs:StopTask`` on the cluster's tasks through ``ClusterAccess.stop_task``).
  No StartTask, no PassRole, no SNS: suspending starts nothing and notifies no one; the
  rest of the suspension (SUSPENDED once every rank stopped) is the task handler's and the
  recovery sweep's. A large job's stop batches go to the gang queue (infra/stack.py).
  The gang preflight's handover, on the report that pins nodes, keeps them out of new
  placement as the task-event path does (``recovery.preflight.handover``): the pinned
  nodes' suspect fence and the job's reservations are instance-table items (the instance
  table's data, as the recovery functions), synced as the ``gpu-recovery.unavailable``
  attribute (``ClusterAccess.placement_attributes``); with a spare pool, the reservation
  refreshes the pool (List/DescribeContainerInstances of the cluster).
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from constructs import Construct

from gpu_recovery.api_routes import CONTROL_API_ROUTES, NODE_TOKEN_HEADER_PATTERN
from gpu_recovery.constants import ENV_CONTROL_POLL_SECONDS
from infra.lambda_common import LambdaDefaults, RecoveryFunction
from infra.nag import acknowledge
from infra.recovery import ClusterAccess, acknowledge_cluster_wildcards
from infra.tables import READ_WRITE_DATA_ACTIONS, RecoveryTables

CONTROL_API_HANDLER = "handlers.job_control_api.lambda_handler"
CONTROL_AUTHORIZER_HANDLER = "handlers.job_control_authorizer.lambda_handler"
TOKEN_HEADER = "Authorization"
# How often a rank may ask (the API tells the client): 2 s keeps "rank 0 informed within
# 5 s of the decision" with room for one failed poll; the authorizer's cache absorbs it.
CONTROL_POLL_SECONDS = 2


class JobControlApi(Construct):
    """Adds the job-control routes to ``rest_api``.

    Attributes: ``function`` and ``authorizer_function`` (RecoveryFunction),
    ``authorizer`` (TokenAuthorizer), ``methods`` ({"GET /v1/control": Method, ...}).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        rest_api: apigw.IRestApi,
        defaults: LambdaDefaults,
        tables: RecoveryTables,
        access: ClusterAccess,
        authorizer_cache_seconds: int = 300,
    ) -> None:
        super().__init__(scope, construct_id)
        self.access = access
        self.authorizer_function = RecoveryFunction(
            self, "Authorizer", defaults=defaults, handler=CONTROL_AUTHORIZER_HANDLER,
            service_name="job-control-authorizer",
            description="Job-control API: checks the per-rank control tokens of training code",
            timeout=Duration.seconds(10),
        )
        # The control secret is on the job item: one GetItem, no index, no other table.
        self.authorizer_function.add_to_policy(iam.PolicyStatement(
            sid="ReadJobItems", actions=["dynamodb:GetItem"], resources=[tables.job_table.table_arn]))

        self.function = RecoveryFunction(
            self, "Function", defaults=defaults, handler=CONTROL_API_HANDLER,
            service_name="job-control-api",
            description="Job-control API: training code asks whether to suspend, or suspends its job",
            # go_suspend stops every rank (one StopTask each) within API Gateway's 29 s.
            timeout=Duration.seconds(29),
            extra_environment={ENV_CONTROL_POLL_SECONDS: str(CONTROL_POLL_SECONDS)},
        )
        self.function.add_to_policy(
            iam.PolicyStatement(sid="RecoveryTableData", actions=READ_WRITE_DATA_ACTIONS,
                                resources=tables.arns("job", "instance")),
            *access.stop_task(),
            *access.placement_attributes(),
            *access.list_container_instances(),
            *access.describe_container_instances(),
        )
        self.functions = {"Authorizer": self.authorizer_function, "Function": self.function}
        self._acknowledge()

        self.authorizer = apigw.TokenAuthorizer(
            self, "TokenAuthorizer",
            handler=self.authorizer_function.function,
            identity_source=apigw.IdentitySource.header(TOKEN_HEADER),
            validation_regex=NODE_TOKEN_HEADER_PATTERN,
            results_cache_ttl=Duration.seconds(authorizer_cache_seconds),
        )
        integration = apigw.LambdaIntegration(self.function.function, allow_test_invoke=False)
        self.methods: dict[str, apigw.Method] = {}
        for http_method, path in CONTROL_API_ROUTES:
            method = rest_api.root.resource_for_path(path).add_method(
                http_method, integration,
                authorizer=self.authorizer, authorization_type=apigw.AuthorizationType.CUSTOM,
            )
            acknowledge(method, (
                "AwsSolutions-COG4",
                "Callers are training containers of queue jobs, authenticated per rank by a "
                "control token (Lambda TOKEN authorizer); there are no Cognito users."))
            self.methods[f"{http_method} /{path}"] = method

    def _acknowledge(self) -> None:
        # StopTask on the job's tasks, the attributes of the cluster's container instances.
        acknowledge_cluster_wildcards(self, self.function, self.access)
        acknowledge(self.authorizer_function.role, (
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray PutTraceSegments/PutTelemetryRecords (active tracing) support no "
            "resource-level permissions, so their resource must be '*'."))
