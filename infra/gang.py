"""The gang fan-out: an SQS queue of stop/start batches and the worker that runs them.

A large job's ranks are stopped and restarted in batches (``gpu_recovery.recovery.gang``):
whoever commits the intent (a recovery function, the node API or heartbeat sweep handing
a lost node to the loop, the job-control API's ``go_suspend``, the queue scheduler's
preemption, the jobs API's cancel) sends the batches to this queue (``GANG_QUEUE_URL``,
``sqs:SendMessage`` on this queue only: :meth:`GangFanout.grant_send`), and the worker
runs them, a few at a time (``gang_worker_concurrency``), each batch in its own
invocation. Gangs of up to 16 ranks never use the queue (their batches run inline).

Built in two steps, because every function's environment names the queue:
``GangFanout(...)`` creates the queue and its dead-letter queue before the stack's
``LambdaDefaults``; :meth:`GangFanout.add_worker` then creates the worker.

* **Worker timeout** ``GANG_WORKER_TIMEOUT_SECONDS`` (= the recovery functions' 60 s): a
  start batch claims each rank's launch for ``CLAIM_LEASE_SECONDS`` (75 s), and a claim
  older than that is taken over as the claim of a dead invocation, so no function that
  claims may outlive it. A batch sends the rest of itself back to the queue 10 s before
  its time is up, so a shorter timeout only means more (cheap) continuations.
* **Queue**: visibility 6x the worker's timeout (AWS's advice for a Lambda event source:
  room for the poller's retries of a throttled invoke; a batch failed on its first receive
  is asked back 75 s later by the worker itself); SQS-managed encryption, TLS only.
  A batch that failed ``GANG_QUEUE_MAX_RECEIVES`` (5) receives goes to the DLQ (14 days;
  alarmed in infra/monitoring.py; replay: docs/operations.md).
* **Event source**: batch size 1 (a batch is up to 100 ranks of ECS work already), partial
  batch responses (``ReportBatchItemFailures``), maximum concurrency from the config.
* **Worker role**: ECS start/stop/describe/list tasks and describe/list container instances
  in the cluster (``ClusterAccess``, PassRole as the other functions), the job and
  instance tables, the alert topic, receive, delete and change visibility on its queue
  and send on it (the rest of a batch, sent back).
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from gpu_recovery.constants import (
    GANG_BATCH_SIZE,
    GANG_QUEUE_MAX_RECEIVES,
    GANG_QUEUE_VISIBILITY_TIMEOUT_SECONDS,
    GANG_WORKER_TIMEOUT_SECONDS,
)
from infra.lambda_common import LambdaDefaults, RecoveryFunction
from infra.nag import acknowledge
from infra.notifications import Notifications
from infra.recovery import DLQ_RETENTION, ClusterAccess, acknowledge_star, nag_resource_id
from infra.tables import RecoveryTables

WORKER_HANDLER = "handlers.gang_worker.lambda_handler"
WORKER_TIMEOUT = Duration.seconds(GANG_WORKER_TIMEOUT_SECONDS)
VISIBILITY_TIMEOUT = Duration.seconds(GANG_QUEUE_VISIBILITY_TIMEOUT_SECONDS)
# What a Lambda event source mapping needs of its queue (AWSLambdaSQSQueueExecutionRole), and
# the worker's own ChangeMessageVisibility: a failed message back sooner (adapters.queue).
CONSUME_ACTIONS = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes",
                   "sqs:ChangeMessageVisibility"]
# SendMessageBatch is authorized as sqs:SendMessage.
SEND_ACTIONS = ["sqs:SendMessage"]



def worker_queue(scope: Construct, *, visibility_timeout: Duration, max_receives: int,
                 of_what: str) -> tuple[sqs.Queue, sqs.Queue]:
    """A worker's queue (``Queue``) and its dead-letter queue (``Dlq``, 14 days) in ``scope``:
    SQS-managed encryption, TLS only; a message received ``max_receives`` times moves to the DLQ."""
    dead_letter_queue = sqs.Queue(
        scope, "Dlq", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
        retention_period=DLQ_RETENTION,
    )
    acknowledge(dead_letter_queue, (
        "AwsSolutions-SQS3",
        f"This queue is itself the dead-letter queue of {of_what}; a DLQ of a DLQ would never be read.",
    ))
    queue = sqs.Queue(
        scope, "Queue", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
        visibility_timeout=visibility_timeout,
        dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=max_receives, queue=dead_letter_queue),
    )
    return queue, dead_letter_queue

class GangFanout(Construct):
    """Attributes: ``queue``, ``dead_letter_queue``; after :meth:`add_worker`: ``worker``
    (RecoveryFunction), ``event_source`` (EventSourceMapping)."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.queue, self.dead_letter_queue = worker_queue(
            self, visibility_timeout=VISIBILITY_TIMEOUT, max_receives=GANG_QUEUE_MAX_RECEIVES,
            of_what="the gang fan-out queue (batches received 5 times)")
        self.worker: RecoveryFunction | None = None
        self.event_source: lambda_.EventSourceMapping | None = None

    @property
    def queue_url(self) -> str:
        return self.queue.queue_url

    def send_statement(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(sid="SendGangBatches", actions=SEND_ACTIONS,
                                   resources=[self.queue.queue_arn])

    def grant_send(self, *functions: RecoveryFunction) -> None:
        """``sqs:SendMessage`` on this queue only (not ``grant_send_messages``: no
        GetQueueUrl / GetQueueAttributes, which nobody here calls)."""
        for fn in functions:
            fn.add_to_policy(self.send_statement())

    def add_worker(self, *, defaults: LambdaDefaults, tables: RecoveryTables,
                   notifications: Notifications, access: ClusterAccess,
                   max_concurrency: int) -> RecoveryFunction:
        if self.worker is not None:
            raise ValueError("the gang fan-out has its worker already")
        worker = RecoveryFunction(
            self, "Worker", defaults=defaults, handler=WORKER_HANDLER, service_name="gang-worker",
            description="Gang fan-out: stop or start one batch of a large job's ranks",
            # Claims rank launches: may not outlive CLAIM_LEASE_SECONDS (module docstring).
            timeout=WORKER_TIMEOUT,
        )
        # A restart whose last batch places every rank releases the job's reserved nodes
        # (the placement attribute: PutAttributes / DeleteAttributes, the pool refilled).
        for make in (access.start_task, access.stop_task, access.describe_tasks, access.list_tasks,
                     access.describe_container_instances, access.list_container_instances,
                     access.placement_attributes):
            worker.add_to_policy(*make())
        tables.grant_read_write_data(worker.role)
        notifications.grant_publish(worker.role)
        worker.add_to_policy(
            iam.PolicyStatement(sid="ConsumeGangBatches", actions=CONSUME_ACTIONS,
                                resources=[self.queue.queue_arn]),
            self.send_statement(),  # the rest of a batch goes back to the queue, delayed
        )
        self.event_source = lambda_.EventSourceMapping(
            self, "EventSource", target=worker.function, event_source_arn=self.queue.queue_arn,
            batch_size=GANG_BATCH_SIZE, max_concurrency=max_concurrency, report_batch_item_failures=True,
        )
        # Lambda checks the role's permissions on the queue when the mapping is created.
        self.event_source.node.add_dependency(worker.role)
        self._acknowledge_wildcards(worker, access)
        self.worker = worker
        return worker

    def _acknowledge_wildcards(self, fn: RecoveryFunction, access: ClusterAccess) -> None:
        reasons = {
            access.task_definition_arns: (
                "A gang restart starts each rank with its job's own task definition (any family, "
                "unknown at deploy time); limited to this cluster by ArnEquals ecs:cluster."),
            access.task_arns: (
                "Task ids are generated by ECS; limited to tasks of this one cluster "
                "(task/<cluster>/*) and ArnEquals ecs:cluster."),
            access.container_instance_arns: (
                "Container instance ids are generated by ECS; limited to instances of this one "
                "cluster (container-instance/<cluster>/*) and ArnEquals ecs:cluster."),
            access.task_role_arns: (
                "Ranks are restarted with their own task and execution roles (unknown at deploy "
                "time): PassRole only on roles named with the configured prefix "
                "(task_role_name_prefix) and only to ecs-tasks.amazonaws.com."),
        }
        for resource, reason in reasons.items():
            acknowledge(fn.role, (f"AwsSolutions-IAM5[Resource::{nag_resource_id(self, resource)}]", reason))
        acknowledge_star(fn)
