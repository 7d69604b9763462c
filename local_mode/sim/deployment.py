"""The recovery stack's event plumbing as infra deploys it, as data both simulated worlds wire.

``infra/recovery.py``, ``infra/gang.py`` and ``infra/tag_lookups.py`` deploy: which
EventBridge rule (pattern) feeds which function, the sweep's ``rate()`` schedule, the SQS
queues and their event sources (batch size, batching window, visibility timeout, redrive
after so many receives, maximum concurrency), each function's timeout and Lambda's
asynchronous retry policy for it. This module says the same from the same numbers
(``gpu_recovery.constants``, which infra reads too); tests/infra/test_infra_scale_sim.py
checks it against the synthesized template.

The moto world (``local_mode.sim.wiring``: :class:`~local_mode.sim.bus.EventBus`) and
the scale world (``local_mode.scale_recovery``: the same bus timed over ``LambdaService``) both
read :data:`RULES`, :data:`SCHEDULES`, :data:`QUEUES` and :data:`FUNCTIONS`; neither
writes the table again. The heartbeat sweep's and the queue scheduler's schedules
(:data:`ALL_SCHEDULES`, :data:`SCHEDULED_FUNCTIONS`) are wired by the same
``wiring.wire_schedule`` when a moto world asks for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery import event_patterns as patterns

#: Lambda asynchronous invocation: on a function error, the next attempt about a minute
#: after the failure and the one after that about two minutes later (Lambda's documented
#: behaviour; infra keeps the 2 retries of :data:`RECOVERY_RETRIES`).
LAMBDA_ASYNC_RETRY_DELAYS: tuple[float, ...] = (60.0, 120.0)


@dataclass(frozen=True)
class AsyncRetries:
    """A function's ``EventInvokeConfig``: retries of a failed asynchronous invocation and the
    oldest event still worth a try; spent, the event goes to the function's dead-letter queue."""

    attempts: int
    max_event_age_seconds: float
    delays: tuple[float, ...] = LAMBDA_ASYNC_RETRY_DELAYS


@dataclass(frozen=True)
class Function:
    """A recovery function: ``handlers.<name>.lambda_handler``, its timeout, and its
    asynchronous retry policy (None: only an event source invokes it, synchronously)."""

    name: str
    timeout_seconds: float
    retries: AsyncRetries | None

    @property
    def handler(self) -> str:
        return f"handlers.{self.name}.lambda_handler"


@dataclass(frozen=True)
class EventRule:
    """An EventBridge rule: the deployed pattern (for a cluster and a registration mode) and
    the function it targets."""

    name: str
    function: str
    pattern_of: Callable[[str, str], dict[str, Any]]

    def pattern(self, cluster_arn: str, registration: str = "both") -> dict[str, Any]:
        return self.pattern_of(cluster_arn, registration)


@dataclass(frozen=True)
class Schedule:
    """A ``rate()`` rule: a Scheduled Event to ``function`` every ``every_seconds``."""

    name: str
    function: str
    every_seconds: float


@dataclass(frozen=True)
class QueueSource:
    """An SQS queue (with its dead-letter queue) and the Lambda event source mapping on it
    (partial batch responses on)."""

    name: str
    function: str
    batch_size: int
    batching_window_seconds: float
    visibility_timeout_seconds: float
    max_receives: int
    max_concurrency: int


RECOVERY_RETRIES = AsyncRetries(C.RECOVERY_ASYNC_RETRIES, C.RECOVERY_EVENT_MAX_AGE_SECONDS)
SCHEDULED_RETRIES = AsyncRetries(C.SCHEDULED_ASYNC_RETRIES, C.SCHEDULED_MAX_EVENT_AGE_SECONDS)

TASK_HANDLER = "ecs_task_handler"
DCGM_MONITOR = "dcgm_task_monitor"
INSTANCE_MONITOR = "ecs_instance_monitor"
RECOVERY_SWEEP = "recovery_sweep"
GANG_WORKER = "gang_worker"
TAG_LOOKUP_WORKER = "tag_lookup_worker"

FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function(TASK_HANDLER, C.RECOVERY_FUNCTION_TIMEOUT_SECONDS, RECOVERY_RETRIES),
    Function(DCGM_MONITOR, C.RECOVERY_FUNCTION_TIMEOUT_SECONDS, RECOVERY_RETRIES),
    Function(INSTANCE_MONITOR, C.RECOVERY_FUNCTION_TIMEOUT_SECONDS, RECOVERY_RETRIES),
    Function(RECOVERY_SWEEP, C.RECOVERY_SWEEP_TIMEOUT_SECONDS, SCHEDULED_RETRIES),
    Function(GANG_WORKER, C.GANG_WORKER_TIMEOUT_SECONDS, None),
    Function(TAG_LOOKUP_WORKER, C.TAG_LOOKUP_WORKER_TIMEOUT_SECONDS, None),
)}

RULES: tuple[EventRule, ...] = (
    EventRule("training-task-state", TASK_HANDLER, patterns.training_task_pattern),
    EventRule("health-check-task-stopped", DCGM_MONITOR,
              lambda cluster_arn, _registration: patterns.health_check_task_pattern(cluster_arn)),
    EventRule("container-instance-state", INSTANCE_MONITOR,
              lambda cluster_arn, _registration: patterns.container_instance_pattern(cluster_arn)),
    # AWS's notices that capacity goes away (docs/aws-notices.md): to the instance monitor too.
    EventRule("ec2-capacity-notices", INSTANCE_MONITOR,
              lambda _cluster_arn, _registration: patterns.ec2_notice_pattern()),
    EventRule("health-scheduled-changes", INSTANCE_MONITOR,
              lambda _cluster_arn, _registration: patterns.health_notice_pattern()),
)

HEARTBEAT_SWEEP = "heartbeat_sweep"
QUEUE_SCHEDULER = "queue_scheduler"

#: the other two scheduled functions (infra/node_api.py, infra/scheduler.py: rate(1 minute),
#: the same asynchronous retries as the recovery sweep). A moto world runs them when asked
#: (``World.schedule_heartbeat_sweep`` / ``schedule_queue_scheduler``); the scale world not.
SCHEDULED_FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function(HEARTBEAT_SWEEP, C.HEARTBEAT_SWEEP_TIMEOUT_SECONDS, SCHEDULED_RETRIES),
    Function(QUEUE_SCHEDULER, C.QUEUE_SCHEDULER_TIMEOUT_SECONDS, SCHEDULED_RETRIES),
)}


def function(name: str) -> Function:
    """A deployed function by name (the recovery functions and the other scheduled ones)."""
    return FUNCTIONS.get(name) or SCHEDULED_FUNCTIONS[name]


SWEEP_SCHEDULE = Schedule("recovery-sweep", RECOVERY_SWEEP, float(C.RECOVERY_SWEEP_RATE_SECONDS))
HEARTBEAT_SWEEP_SCHEDULE = Schedule("heartbeat-sweep", HEARTBEAT_SWEEP, float(C.HEARTBEAT_SWEEP_RATE_SECONDS))
QUEUE_SCHEDULER_SCHEDULE = Schedule("queue-scheduler", QUEUE_SCHEDULER, float(C.QUEUE_SCHEDULER_RATE_SECONDS))
#: the schedules wired with the recovery functions (``wiring.wire_deployment``)
SCHEDULES: tuple[Schedule, ...] = (SWEEP_SCHEDULE,)
#: every deployed ``rate()`` rule of the stack (tests/infra checks them against the template)
ALL_SCHEDULES: tuple[Schedule, ...] = (SWEEP_SCHEDULE, HEARTBEAT_SWEEP_SCHEDULE, QUEUE_SCHEDULER_SCHEDULE)

GANG_QUEUE = QueueSource(
    "gang-batches", GANG_WORKER, batch_size=C.GANG_BATCH_SIZE, batching_window_seconds=0.0,
    visibility_timeout_seconds=float(C.GANG_QUEUE_VISIBILITY_TIMEOUT_SECONDS),
    max_receives=C.GANG_QUEUE_MAX_RECEIVES, max_concurrency=C.DEFAULT_GANG_WORKER_CONCURRENCY)
TAG_LOOKUP_QUEUE = QueueSource(
    "tag-lookups", TAG_LOOKUP_WORKER, batch_size=C.TAG_LOOKUP_BATCH_SIZE,
    batching_window_seconds=float(C.TAG_LOOKUP_BATCHING_WINDOW_SECONDS),
    visibility_timeout_seconds=float(C.TAG_LOOKUP_VISIBILITY_TIMEOUT_SECONDS),
    max_receives=C.TAG_LOOKUP_MAX_RECEIVES, max_concurrency=C.TAG_LOOKUP_WORKER_CONCURRENCY)
QUEUES: tuple[QueueSource, ...] = (GANG_QUEUE, TAG_LOOKUP_QUEUE)
