"""Tag lookups: an SQS queue of ECS task events whose tags decide, and the worker that
describes them 100 at a time (issue 28, docs/architecture.md "Registering jobs").

The task handler sends the event of a task it finds neither registered, nor following the
registration convention, nor known to be unprotected (``TAG_LOOKUP_QUEUE_URL``,
``sqs:SendMessage`` on this queue only). The event source hands the worker up to 100
messages at once (waiting up to ``TAG_LOOKUP_BATCHING_WINDOW_SECONDS`` to fill a batch),
so a job of thousands of tag-registered tasks starting at once costs one DescribeTasks per
100 tasks, under the stack's Describe budget (its own token bucket item), at most
``TAG_LOOKUP_WORKER_CONCURRENCY`` batches at a time.

* **Queue**: visibility 6x the worker's timeout (a message failed on its first receive is
  asked back 75 s later by the worker itself); SQS-managed encryption, TLS only. A
  message that failed ``TAG_LOOKUP_MAX_RECEIVES`` receives goes to the DLQ (14 days,
  alarmed in infra/monitoring.py).
* **Worker role**: DescribeTasks (and what handling a task's event needs: the recovery
  functions' ECS, EC2 and SSM calls), the job and instance tables, the alert topic,
  receive, delete and change visibility on its queue, and send on the gang queue.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from gpu_recovery.constants import (
    TAG_LOOKUP_BATCH_SIZE,
    TAG_LOOKUP_BATCHING_WINDOW_SECONDS,
    TAG_LOOKUP_MAX_RECEIVES,
    TAG_LOOKUP_VISIBILITY_TIMEOUT_SECONDS,
    TAG_LOOKUP_WORKER_CONCURRENCY,
    TAG_LOOKUP_WORKER_TIMEOUT_SECONDS,
)
from infra.gang import CONSUME_ACTIONS, SEND_ACTIONS, worker_queue
from infra.lambda_common import LambdaDefaults, RecoveryFunction
from infra.notifications import Notifications
from infra.recovery import ClusterAccess, acknowledge_cluster_wildcards
from infra.tables import RecoveryTables

WORKER_HANDLER = "handlers.tag_lookup_worker.lambda_handler"


class TagLookups(Construct):
    """Attributes: ``queue``, ``dead_letter_queue``; after :meth:`add_worker`: ``worker``."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.queue, self.dead_letter_queue = worker_queue(
            self, visibility_timeout=Duration.seconds(TAG_LOOKUP_VISIBILITY_TIMEOUT_SECONDS),
            max_receives=TAG_LOOKUP_MAX_RECEIVES, of_what="the tag lookup queue")
        self.worker: RecoveryFunction | None = None
        self.event_source: lambda_.EventSourceMapping | None = None

    @property
    def queue_url(self) -> str:
        return self.queue.queue_url

    def grant_send(self, *functions: RecoveryFunction) -> None:
        for fn in functions:
            fn.add_to_policy(iam.PolicyStatement(sid="SendTagLookups", actions=SEND_ACTIONS,
                                                 resources=[self.queue.queue_arn]))

    def add_worker(self, *, defaults: LambdaDefaults, tables: RecoveryTables, notifications: Notifications,
                   access: ClusterAccess, extra: list[iam.PolicyStatement]) -> RecoveryFunction:
        if self.worker is not None:
            raise ValueError("the tag lookups have their worker already")
        worker = RecoveryFunction(
            self, "Worker", defaults=defaults, handler=WORKER_HANDLER, service_name="tag-lookup-worker",
            description="Tag lookups: describe up to 100 unknown tasks at once, register the protected ones",
            timeout=Duration.seconds(TAG_LOOKUP_WORKER_TIMEOUT_SECONDS),
        )
        # Handling a task's event (a STOPPED one included) takes what the task handler takes.
        for make in (access.start_task, access.stop_task, access.describe_tasks, access.list_tasks,
                     access.describe_container_instances, access.list_container_instances,
                     access.reboot_instances, access.send_reboot_command,
                     access.update_container_instances_state, access.placement_attributes,
                     access.terminate_in_asg):
            worker.add_to_policy(*make())
        tables.grant_read_write_data(worker.role)
        notifications.grant_publish(worker.role)
        worker.add_to_policy(
            iam.PolicyStatement(sid="ConsumeTagLookups", actions=CONSUME_ACTIONS,
                                resources=[self.queue.queue_arn]), *extra)
        self.event_source = lambda_.EventSourceMapping(
            self, "EventSource", target=worker.function, event_source_arn=self.queue.queue_arn,
            batch_size=TAG_LOOKUP_BATCH_SIZE,
            max_batching_window=Duration.seconds(TAG_LOOKUP_BATCHING_WINDOW_SECONDS),
            max_concurrency=TAG_LOOKUP_WORKER_CONCURRENCY, report_batch_item_failures=True,
        )
        self.event_source.node.add_dependency(worker.role)
        acknowledge_cluster_wildcards(self, worker, access)
        self.worker = worker
        return worker
