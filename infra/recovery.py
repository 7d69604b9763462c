"""The recovery loop: EventBridge rules -> Lambda functions, with retries and DLQs
(their alarms: infra/monitoring.py).

Also holds ``ClusterAccess``: the least-privilege IAM statements for the ECS cluster,
its GPU instances and SSM, shared by every function (and by constructs added later).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from gpu_recovery.constants import (
    ENV_HEALTH_CHECK_LOG_GROUP,
    RECOVERY_ASYNC_RETRIES,
    RECOVERY_EVENT_MAX_AGE_SECONDS,
    RECOVERY_FUNCTION_TIMEOUT_SECONDS,
    RECOVERY_SWEEP_RATE_SECONDS,
    RECOVERY_SWEEP_TIMEOUT_SECONDS,
)
from gpu_recovery.event_patterns import (
    container_instance_pattern,
    ec2_notice_pattern,
    health_check_task_pattern,
    health_notice_pattern,
    training_task_pattern,
)
from infra.config import RecoveryConfig
from infra.health_check import HealthCheck
from infra.lambda_common import (
    SCHEDULED_ASYNC_RETRIES,
    SCHEDULED_MAX_EVENT_AGE,
    LambdaDefaults,
    RecoveryFunction,
)
from infra.nag import acknowledge
from infra.notifications import Notifications
from infra.tables import RecoveryTables

EVENT_MAX_AGE = Duration.seconds(RECOVERY_EVENT_MAX_AGE_SECONDS)
EVENT_RETRY_ATTEMPTS = 8
DLQ_RETENTION = Duration.days(14)


def nag_resource_id(scope: Construct, value: str) -> str:
    """How cdk-nag 3 spells a resource in an IAM5 finding id (tokens as ``<Ref>``)."""
    resolved = Stack.of(scope).resolve(value)
    return _flatten(resolved)


def _flatten(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict):
        if "Fn::Join" in node:
            sep, parts = node["Fn::Join"]
            return sep.join(_flatten(p) for p in parts)
        if "Ref" in node:
            return f"<{node['Ref']}>"
        if "Fn::GetAtt" in node:
            return f"<{'.'.join(node['Fn::GetAtt'])}>"
    return str(node)


class ClusterAccess:
    """IAM statements scoped to one ECS cluster and its tagged GPU instances.

    ARNs carry the stack's partition (``aws``, ``aws-cn``, ``aws-us-gov``). Roles may be
    passed to ECS only when named with ``config.task_role_name_prefix`` (and the roles
    added with :meth:`allow_passing`, e.g. the stack's own health-check roles); GPU hosts
    managed by SSM are rebooted only through the reboot-only document
    (:meth:`use_reboot_document`).
    """

    def __init__(self, scope: Construct, config: RecoveryConfig) -> None:
        stack = Stack.of(scope)
        region, account, name = stack.region, stack.account, config.cluster_name
        partition = stack.partition
        self.config = config
        self.partition = partition
        self.cluster_arn = f"arn:{partition}:ecs:{region}:{account}:cluster/{name}"
        self.task_arns = f"arn:{partition}:ecs:{region}:{account}:task/{name}/*"
        self.container_instance_arns = f"arn:{partition}:ecs:{region}:{account}:container-instance/{name}/*"
        self.task_definition_arns = f"arn:{partition}:ecs:{region}:{account}:task-definition/*"
        self.ec2_instance_arns = f"arn:{partition}:ec2:{region}:{account}:instance/*"
        self.managed_instance_arns = f"arn:{partition}:ssm:{region}:{account}:managed-instance/*"
        self.auto_scaling_group_arns = (f"arn:{partition}:autoscaling:{region}:{account}:autoScalingGroup:*:"
                                        "autoScalingGroupName/*")
        self.task_role_arns = f"arn:{partition}:iam::{account}:role/{config.task_role_name_prefix}*"
        self.passable_role_arns: list[str] = []
        self.reboot_document_arn: str | None = None

    def allow_passing(self, *role_arns: str) -> None:
        """Roles (by exact ARN) that may be passed to ECS besides the prefixed ones."""
        self.passable_role_arns.extend(r for r in role_arns if r not in self.passable_role_arns)

    def use_reboot_document(self, document_arn: str) -> None:
        self.reboot_document_arn = document_arn

    @property
    def _in_cluster(self) -> dict[str, Any]:
        return {"ArnEquals": {"ecs:cluster": self.cluster_arn}}

    @property
    def _tagged(self) -> dict[str, Any]:
        key, value = self.config.instance_tag_key, self.config.instance_tag_value
        return {"StringEquals": {f"aws:ResourceTag/{key}": value}}

    def _in_cluster_statement(self, sid: str, actions: list[str], resource: str) -> list[iam.PolicyStatement]:
        """``actions`` on ``resource``, allowed only where the resource is in the cluster."""
        return [iam.PolicyStatement(sid=sid, actions=actions, resources=[resource],
                                    conditions=self._in_cluster)]

    # ----- ECS ---------------------------------------------------------------------
    def start_task(self) -> list[iam.PolicyStatement]:
        """StartTask (health checks, gang restarts) with the tags, and PassRole to ECS of
        the roles named with the configured prefix (plus :meth:`allow_passing`'s)."""
        return [
            iam.PolicyStatement(
                sid="StartTaskInCluster",
                actions=["ecs:StartTask"],
                resources=[self.task_definition_arns],
                conditions=self._in_cluster,
            ),
            iam.PolicyStatement(
                sid="TagTasksOnStart",
                actions=["ecs:TagResource"],
                resources=[self.task_arns],
                conditions={"StringEquals": {"ecs:CreateAction": "StartTask"}},
            ),
            iam.PolicyStatement(
                sid="PassTaskRolesToEcs",
                actions=["iam:PassRole"],
                resources=[self.task_role_arns, *self.passable_role_arns],
                conditions={"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}},
            ),
        ]

    def stop_task(self) -> list[iam.PolicyStatement]:
        return self._in_cluster_statement("StopTaskInCluster", ["ecs:StopTask"], self.task_arns)

    def describe_tasks(self) -> list[iam.PolicyStatement]:
        return self._in_cluster_statement(
            "DescribeTasksInCluster", ["ecs:DescribeTasks"], self.task_arns)

    def list_tasks(self) -> list[iam.PolicyStatement]:
        """ListTasks of the cluster (by startedBy, by desired status): a ListTasks naming no
        container instance is authorized against ``*`` (not the container-instance ARN the
        Service Authorization Reference lists: cdklabs/construct-hub#1207,
        awsdocs/amazon-ecs-developer-guide#211), limited to this cluster by ``ecs:cluster``."""
        return self._in_cluster_statement("ListTasksInCluster", ["ecs:ListTasks"], "*")

    def describe_container_instances(self) -> list[iam.PolicyStatement]:
        return self._in_cluster_statement(
            "DescribeContainerInstancesInCluster", ["ecs:DescribeContainerInstances"],
            self.container_instance_arns)

    def update_container_instances_state(self) -> list[iam.PolicyStatement]:
        return self._in_cluster_statement(
            "DrainContainerInstancesInCluster", ["ecs:UpdateContainerInstancesState"],
            self.container_instance_arns)

    def placement_attributes(self) -> list[iam.PolicyStatement]:
        """The placement attributes (``gpu_recovery.domain.placement``) put and deleted on the
        cluster's container instances: ``gpu-recovery.unavailable`` (a known-bad node's
        cordon, a spare's or a reserved node's hold) and the deprecated
        ``gpu-recovery.cordoned``. Whoever changes a cordon or a hold syncs the attributes
        at once (``recovery.cordons``): the functions that judge nodes, the instance monitor
        (a node back after its reboot is uncordoned; a node now wholly free becomes a spare),
        the node API (a boot report marks a node back), the heartbeat sweep, the recovery sweep
        (the worklist)."""
        return self._in_cluster_statement(
            "PlacementAttributesInCluster", ["ecs:PutAttributes", "ecs:DeleteAttributes"],
            self.container_instance_arns)

    def list_container_instances(self) -> list[iam.PolicyStatement]:
        """The breaker counts the cluster's GPU nodes; relocation looks for free ones."""
        return [
            iam.PolicyStatement(
                sid="ListContainerInstancesOfCluster",
                actions=["ecs:ListContainerInstances"],
                resources=[self.cluster_arn],
            )
        ]

    # ----- EC2 / SSM -----------------------------------------------------------------
    def reboot_instances(self) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="RebootTaggedGpuInstances",
                actions=["ec2:RebootInstances"],
                resources=[self.ec2_instance_arns],
                conditions=self._tagged,
            ),
            # No ec2:DescribeInstances: the reboot path never describes an instance (only the
            # queue scheduler reads private addresses, infra/scheduler.py); the grants guard's
            # usage report found it unused by every function that held it (issue 40).
        ]

    def describe_capacity_reservation_instances(self) -> list[iam.PolicyStatement]:
        """A Capacity Block's expiration warning names its reservation, not its instances: the
        instance monitor lists them (DescribeInstances filtered by ``capacity-reservation-id``,
        docs/aws-notices.md). DescribeInstances supports no resource-level permission."""
        return [
            iam.PolicyStatement(
                sid="DescribeCapacityReservationInstances",
                actions=["ec2:DescribeInstances"],
                resources=["*"],
            ),
        ]

    def send_reboot_command(self) -> list[iam.PolicyStatement]:
        """ECS Anywhere (mi-) hosts are rebooted with the stack's reboot-only document."""
        if self.reboot_document_arn is None:
            raise ValueError("ClusterAccess.use_reboot_document(...) first: SendCommand is "
                             "granted on the reboot-only document only")
        return [
            iam.PolicyStatement(
                sid="SendRebootDocument",
                actions=["ssm:SendCommand"],
                resources=[self.reboot_document_arn],
            ),
            iam.PolicyStatement(
                sid="SendCommandToTaggedManagedInstances",
                actions=["ssm:SendCommand"],
                resources=[self.managed_instance_arns],
                conditions=self._tagged,
            ),
        ]


    # ----- Auto Scaling ----------------------------------------------------------------
    def terminate_in_asg(self) -> list[iam.PolicyStatement]:
        """replace_action=terminate_in_asg only: terminate a GPU node in its Auto Scaling
        group (capacity kept), only in groups tagged with the cluster tag."""
        if dict(self.config.remediation).get("replace_action") != "terminate_in_asg":
            return []
        return [
            iam.PolicyStatement(
                sid="TerminateInTaggedAutoScalingGroups",
                actions=["autoscaling:TerminateInstanceInAutoScalingGroup"],
                resources=[self.auto_scaling_group_arns],
                conditions=self._tagged,
            ),
            iam.PolicyStatement(
                sid="DescribeAutoScalingInstances",
                actions=["autoscaling:DescribeAutoScalingInstances"],
                resources=["*"],
            ),
        ]


class RecoveryFunctions(Construct):
    """Four functions, each with its own role, trigger, retries and DLQ."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: RecoveryConfig,
        defaults: LambdaDefaults,
        tables: RecoveryTables,
        notifications: Notifications,
        health_check: HealthCheck,
        access: ClusterAccess,
    ) -> None:
        super().__init__(scope, construct_id)
        self._defaults = defaults
        self._max_event_age: dict[str, Duration] = {}
        self.access = access
        self.functions: dict[str, RecoveryFunction] = {}
        self.dead_letter_queues: dict[str, sqs.Queue] = {}
        self.rules: dict[str, events.Rule] = {}  # each function's own rule (the stack outputs name it)
        # Further rules of a function (AWS's notices, to the instance monitor): same target, retries, DLQ.
        self.extra_rules: dict[str, events.Rule] = {}
        cluster_arn = access.cluster_arn

        self.task_handler = self._function(
            "TaskHandler",
            handler="handlers.ecs_task_handler.lambda_handler",
            service="ecs-task-handler",
            description="Training task stopped: classify, stop the other ranks, start DCGM",
            # A definitive fault (the catalog's fast path) is remediated from here at once.
            permissions=[
                access.start_task,
                access.stop_task,
                access.describe_tasks,
                access.list_tasks,
                access.describe_container_instances,
                access.list_container_instances,
                access.reboot_instances,
                access.send_reboot_command,
                access.update_container_instances_state,
                access.placement_attributes,
                access.terminate_in_asg,
            ],
        )
        self.dcgm_monitor = self._function(
            "DcgmMonitor",
            handler="handlers.dcgm_task_monitor.lambda_handler",
            service="dcgm-task-monitor",
            description="DCGM health check stopped: reboot, quarantine or fail the job",
            # A verdict may also restart (or relocate) the job whose last node it was.
            permissions=[
                access.reboot_instances,
                access.send_reboot_command,
                access.update_container_instances_state,
                access.placement_attributes,
                access.describe_tasks,
                access.describe_container_instances,
                access.list_container_instances,
                access.terminate_in_asg,
                access.start_task,
                access.stop_task,
                access.list_tasks,
            ],
        )
        if health_check.log_group is not None:
            health_check.log_group.grant(self.dcgm_monitor.role, "logs:GetLogEvents")
            # Where the monitor reads the verdict JSON line to record it on the job.
            self.dcgm_monitor.function.add_environment(
                ENV_HEALTH_CHECK_LOG_GROUP, health_check.log_group.log_group_name)
        self.instance_monitor = self._function(
            "InstanceMonitor",
            handler="handlers.ecs_instance_monitor.lambda_handler",
            service="ecs-instance-monitor",
            description="Container instance back after reboot: gang-restart waiting jobs; AWS's notices",
            permissions=[
                access.start_task,
                access.describe_tasks,
                access.describe_container_instances,
                access.list_container_instances,
                access.list_tasks,
                # A node back after its reboot is uncordoned; a node now wholly free becomes a
                # spare (its hold's attribute put); a node AWS announced is going away is marked.
                access.placement_attributes,
                # AWS's notices: a Capacity Block's instances (docs/aws-notices.md; the sweep
                # drains them: this function takes no node action); a job with no control
                # channel on a node a Spot warning names is stopped at once, to move.
                access.describe_capacity_reservation_instances,
                access.stop_task,
            ],
        )
        self.sweep = self._function(
            "RecoverySweep",
            handler="handlers.recovery_sweep.lambda_handler",
            service="recovery-sweep",
            description="Every minute: reboot / health-check timeouts, pending health checks",
            timeout=Duration.seconds(RECOVERY_SWEEP_TIMEOUT_SECONDS),
            async_retries=SCHEDULED_ASYNC_RETRIES,
            max_event_age=SCHEDULED_MAX_EVENT_AGE,
            # It finishes what any delivery left undone: reboots, drains, terminations, the
            # breaker's released backlog.
            permissions=[
                access.start_task,
                access.stop_task,
                access.describe_tasks,
                access.list_tasks,
                access.describe_container_instances,
                access.list_container_instances,
                access.update_container_instances_state,
                # The cordons' worklist (attributes not confirmed, held ones after a reset).
                access.placement_attributes,
                # A reboot whose issue was not confirmed is re-issued by the sweep.
                access.reboot_instances,
                access.send_reboot_command,
                access.terminate_in_asg,
            ],
        )
        if health_check.log_group is not None:
            # A check whose STOPPED event was lost: the sweep reads its verdict line as the
            # event's path does (issue 49: a lost verdict never becomes a quarantine).
            health_check.log_group.grant(self.sweep.role, "logs:GetLogEvents")
            self.sweep.function.add_environment(ENV_HEALTH_CHECK_LOG_GROUP,
                                                health_check.log_group.log_group_name)
        for fn in self.functions.values():
            tables.grant_read_write_data(fn.role)
            notifications.grant_publish(fn.role)

        self._rule(
            "TaskHandler",
            "Training task state changes in the cluster (not the health-check group)",
            events.EventPattern(**_pattern_props(training_task_pattern(cluster_arn, config.registration))),
        )
        self._rule(
            "DcgmMonitor",
            "Health-check task stopped",
            events.EventPattern(**_pattern_props(health_check_task_pattern(cluster_arn))),
        )
        self._rule(
            "InstanceMonitor",
            "Container instance state changes in the cluster",
            events.EventPattern(**_pattern_props(container_instance_pattern(cluster_arn))),
        )
        # AWS's own notices that capacity goes away (docs/aws-notices.md).
        self._rule(
            "InstanceMonitor",
            "EC2 notices: Capacity Block expiration, Spot / reservation interruption, rebalance",
            events.EventPattern(**_pattern_props(ec2_notice_pattern())),
            rule_id="Ec2NoticesRule",
        )
        self._rule(
            "InstanceMonitor",
            "AWS Health scheduled changes of EC2 instances (retirement, maintenance)",
            events.EventPattern(**_pattern_props(health_notice_pattern())),
            rule_id="HealthNoticesRule",
        )
        self._rule(
            "RecoverySweep",
            "Recovery timeouts and pending health checks",
            schedule=events.Schedule.rate(Duration.seconds(RECOVERY_SWEEP_RATE_SECONDS)),
        )

    # ---------------------------------------------------------------------------------
    def _function(
        self,
        name: str,
        *,
        handler: str,
        service: str,
        description: str,
        permissions: list[Callable[[], list[iam.PolicyStatement]]],
        # No recovery function may outlive a claim's lease (see CLAIM_LEASE_SECONDS).
        timeout: Duration = Duration.seconds(RECOVERY_FUNCTION_TIMEOUT_SECONDS),
        async_retries: int = RECOVERY_ASYNC_RETRIES,
        max_event_age: Duration = EVENT_MAX_AGE,
    ) -> RecoveryFunction:
        fn = RecoveryFunction(
            self,
            name,
            defaults=self._defaults,
            handler=handler,
            service_name=service,
            description=description,
            timeout=timeout,
        )
        for make in permissions:
            fn.add_to_policy(*make())
        dlq = sqs.Queue(
            self,
            f"{name}Dlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=DLQ_RETENTION,
        )
        acknowledge(
            dlq,
            (
                "AwsSolutions-SQS3",
                "This queue is itself the dead-letter queue of the EventBridge target and "
                "the Lambda on-failure destination; a DLQ of a DLQ would never be read.",
            ),
        )
        # Lambda's own async handling: retry function errors, then keep the event.
        fn.function.configure_async_invoke(
            max_event_age=max_event_age,
            retry_attempts=async_retries,
            on_failure=destinations.SqsDestination(dlq),
        )
        self.functions[name] = fn
        self.dead_letter_queues[name] = dlq
        self._max_event_age[name] = max_event_age
        self._acknowledge_wildcards(fn)
        return fn

    def _rule(
        self,
        name: str,
        description: str,
        event_pattern: events.EventPattern | None = None,
        schedule: events.Schedule | None = None,
        rule_id: str = "",
    ) -> None:
        rule = events.Rule(
            self,
            rule_id or f"{name}Rule",
            description=description,
            event_pattern=event_pattern,
            schedule=schedule,
        )
        rule.add_target(
            targets.LambdaFunction(
                self.functions[name].function,
                dead_letter_queue=self.dead_letter_queues[name],
                retry_attempts=EVENT_RETRY_ATTEMPTS,
                max_event_age=self._max_event_age[name],
            )
        )
        if rule_id:
            self.extra_rules[rule_id] = rule
        else:
            self.rules[name] = rule

    def _acknowledge_wildcards(self, fn: RecoveryFunction) -> None:
        acknowledge_cluster_wildcards(self, fn, self.access)


def acknowledge_cluster_wildcards(scope: Construct, fn: RecoveryFunction, access: ClusterAccess) -> None:
    """Acknowledge exactly the wildcard resources this function's policy carries."""
    reasons = {
        access.task_definition_arns: (
            "ecs:StartTask restarts each job with its own task definition (any family, "
            "unknown at deploy time) and starts the health check; limited to this cluster "
            "by ArnEquals ecs:cluster."
        ),
        access.task_arns: (
            "Task ids are generated by ECS; access is limited to tasks of this one "
            "cluster (task/<cluster>/*) and additionally by ArnEquals ecs:cluster."
        ),
        access.container_instance_arns: (
            "Container instance ids are generated by ECS; limited to instances of this "
            "one cluster (container-instance/<cluster>/*) and ArnEquals ecs:cluster."
        ),
        access.task_role_arns: (
            "Jobs are restarted with their own task and execution roles (unknown at "
            "deploy time): PassRole only on roles named with the configured prefix "
            "(task_role_name_prefix) and only to ecs-tasks.amazonaws.com."
        ),
        access.ec2_instance_arns: (
            "GPU instances come and go with the Auto Scaling group; RebootInstances is "
            "allowed only on instances tagged with the configured cluster tag."
        ),
        access.managed_instance_arns: (
            "ECS Anywhere managed-instance ids are not known at deploy time; SendCommand "
            "is allowed only on managed instances tagged with the cluster tag."
        ),
        access.auto_scaling_group_arns: (
            "GPU nodes' Auto Scaling groups are not known at deploy time; "
            "TerminateInstanceInAutoScalingGroup is allowed only in groups tagged with the "
            "cluster tag (replace_action terminate_in_asg)."
        ),
    }
    policy_resources: set[str] = set()
    for statement in fn.statements:
        policy_resources.update(statement.resources)
    for resource, reason in reasons.items():
        if resource in policy_resources:
            acknowledge(
                fn.role,
                (f"AwsSolutions-IAM5[Resource::{nag_resource_id(scope, resource)}]", reason),
            )
    acknowledge_star(fn)


#: why an action of the stack's roles is granted on ``*`` (cdk-nag AwsSolutions-IAM5)
STAR_REASONS = {
    "ecs:ListTasks": ("ecs:ListTasks naming no container instance (startedBy, desired status) is "
                      "authorized against '*' (cdklabs/construct-hub#1207), limited to this cluster by "
                      "ArnEquals ecs:cluster"),
    "ec2:DescribeInstances": "ec2:DescribeInstances supports no resource-level permission",
    "autoscaling:DescribeAutoScalingInstances": ("autoscaling:DescribeAutoScalingInstances supports no "
                                                 "resource-level permission"),
    "ecs:DescribeTaskDefinition": "ecs:DescribeTaskDefinition supports no resource-level permission",
    "ssm:DescribeInstanceInformation": ("ssm:DescribeInstanceInformation supports no resource-level "
                                        "permission"),
}


def star_reason(actions: set[str]) -> str:
    """The acknowledgement of ``Resource::*`` for a role whose ``*`` statements hold ``actions``
    (X-Ray's, added by active tracing, always)."""
    unknown = sorted(actions - set(STAR_REASONS))
    if unknown:
        raise ValueError(f"no reason known for granting {unknown} on '*': add it to STAR_REASONS")
    reasons = [STAR_REASONS[a] for a in sorted(actions)]
    return "; ".join(["X-Ray PutTraceSegments/PutTelemetryRecords (active tracing) support no resource-level "
                      "permission", *reasons]) + "."


def acknowledge_star(fn: RecoveryFunction) -> None:
    """Acknowledge the role's ``Resource::*`` finding with the reason of each action on ``*``."""
    actions = {a for statement in fn.statements if "*" in statement.resources for a in statement.actions}
    acknowledge(fn.role, ("AwsSolutions-IAM5[Resource::*]", star_reason(actions)))


def _pattern_props(pattern: dict[str, Any]) -> dict[str, Any]:
    """constants' dict pattern -> EventPattern kwargs, rendering to exactly the dict."""
    mapping = {"source": "source", "detail-type": "detail_type", "detail": "detail"}
    unknown = set(pattern) - set(mapping)
    if unknown:
        raise ValueError(f"unsupported top-level pattern keys: {sorted(unknown)}")
    return {mapping[key]: value for key, value in pattern.items()}
