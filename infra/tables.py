"""DynamoDB tables, built from ``gpu_recovery.constants.table_definitions()``."""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from gpu_recovery.constants import (
    ECS_DESCRIBE_RATE_ITEM_KEY,
    ECS_RATE_ITEM_KEY,
    JOB_TABLE_TTL_ATTRIBUTE,
    PREFLIGHT_BASELINE_PREFIX,
    table_definitions,
)

_ATTRIBUTE_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}

# The data-plane actions the recovery loop and the heartbeat service use: keys, indexes,
# conditional writes and transactions (TransactWriteItems is authorized per item as
# UpdateItem / ConditionCheckItem). No Scan (no request path scans), no BatchWriteItem,
# no DeleteItem (nothing deletes: history is kept, and what must go, a sent notice, a negative
# task record, an expired lease, is given a TTL, JOB_TABLE_TTL_ATTRIBUTE, and DynamoDB removes it).
READ_WRITE_DATA_ACTIONS = [
    "dynamodb:BatchGetItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
]


def _attribute(definition: dict[str, Any], name: str) -> dynamodb.Attribute:
    types = {a["AttributeName"]: a["AttributeType"] for a in definition["AttributeDefinitions"]}
    return dynamodb.Attribute(name=name, type=_ATTRIBUTE_TYPES[types[name]])


def _keys(definition: dict[str, Any], key_schema: list[dict[str, str]]) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for key in key_schema:
        arg = "partition_key" if key["KeyType"] == "HASH" else "sort_key"
        keys[arg] = _attribute(definition, key["AttributeName"])
    return keys


# The recovery loop's tables (every recovery function reads and writes both). The quota
# table is the time-sharing scheduler's and the jobs API's only (grant_quota_data).
RECOVERY_TABLES = ("job", "instance")


class RecoveryTables(Construct):
    """The job, container-instance and quota tables (CloudFormation names them)."""

    def __init__(self, scope: Construct, construct_id: str, *, removal_policy: str) -> None:
        super().__init__(scope, construct_id)
        policy = RemovalPolicy.DESTROY if removal_policy == "destroy" else RemovalPolicy.RETAIN
        definitions = table_definitions()
        self.index_names: dict[str, list[str]] = {}
        self.tables: dict[str, dynamodb.Table] = {}
        for logical, construct_name in (("job", "JobTable"), ("instance", "InstanceTable"),
                                        ("quota", "QuotaTable")):
            definition = definitions[logical]
            table = dynamodb.Table(
                self,
                construct_name,
                billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
                point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                    point_in_time_recovery_enabled=True
                ),
                encryption=dynamodb.TableEncryption.AWS_MANAGED,
                removal_policy=policy,
                # The job table's negative task records expire (constants.unprotected_task_key).
                time_to_live_attribute=JOB_TABLE_TTL_ATTRIBUTE if logical == "job" else None,
                **_keys(definition, definition["KeySchema"]),
            )
            for gsi in definition.get("GlobalSecondaryIndexes", []):
                projection = gsi.get("Projection", {})
                table.add_global_secondary_index(
                    index_name=gsi["IndexName"],
                    projection_type=dynamodb.ProjectionType(projection.get("ProjectionType", "ALL")),
                    non_key_attributes=projection.get("NonKeyAttributes"),
                    **_keys(definition, gsi["KeySchema"]),
                )
            self.index_names[logical] = [
                gsi["IndexName"] for gsi in definition.get("GlobalSecondaryIndexes", [])
            ]
            self.tables[logical] = table
        self.job_table = self.tables["job"]
        self.instance_table = self.tables["instance"]
        self.quota_table = self.tables["quota"]

    def arns(self, *logical: str) -> list[str]:
        """Each named table and each of its indexes, by name (no wildcard)."""
        resources: list[str] = []
        for name in logical:
            table = self.tables[name]
            resources.append(table.table_arn)
            resources.extend(f"{table.table_arn}/index/{index}" for index in self.index_names[name])
        return resources

    def grant_read_write_data(self, grantee: iam.IGrantable,
                              tables: tuple[str, ...] = RECOVERY_TABLES) -> None:
        """Data access to ``tables`` (default: the job and instance tables) and their indexes."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=READ_WRITE_DATA_ACTIONS, resource_arns=self.arns(*tables)
        )

    def ecs_budget_statement(self) -> iam.PolicyStatement:
        """The ECS control-plane budget's item (``ECS_RATE_ITEM_KEY``) and nothing else of
        the instance table: for functions that call StartTask / StopTask but read no
        instance (the jobs API's cancel, the job-control API's go_suspend). A reservation
        is a GetItem and a conditional UpdateItem of that one key."""
        return iam.PolicyStatement(
            sid="EcsCallBudgetItem",
            actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
            resources=[self.instance_table.table_arn],
            # ... and the Describe budget's (a recovery service describing a task, rarely).
            conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [
                ECS_RATE_ITEM_KEY, ECS_DESCRIBE_RATE_ITEM_KEY]}},
        )

    def preflight_baselines_statement(self) -> iam.PolicyStatement:
        """The gang preflight's baselines (``PREFLIGHT_BASELINE#<class>#<nodes>``) and nothing
        else of the instance table: for the job-control API, which judges the preflight's
        reports and learns a passing run in the transaction that concludes it."""
        return iam.PolicyStatement(
            sid="PreflightBaselineItems",
            actions=["dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:UpdateItem"],
            resources=[self.instance_table.table_arn],
            conditions={"ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [f"{PREFLIGHT_BASELINE_PREFIX}*"]}},
        )

    def grant_quota_data(self, grantee: iam.IGrantable) -> None:
        """The quota table (limits and usage): the scheduler charges and releases, the jobs
        API reads and sets limits. Same actions as the other tables."""
        self.grant_read_write_data(grantee, ("quota",))
