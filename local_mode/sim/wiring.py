"""The recovery Lambdas on the local bus, exactly as infra deploys them: the EventBridge rules
of the ECS events, the recovery sweep's schedule and the gang queue's event source (with the
handlers' ``SendMessageBatch`` to it answered by the bus's local queue)."""

from __future__ import annotations

import importlib
import uuid
from typing import Any

from gpu_recovery import constants as C

from ..api_hooks import hook_answer
from ..emulator import LocalAws
from .bus import LocalEventBus, Target
from .lambdas import LAMBDA_ASYNC_RETRY_DELAYS

SWEEP_SCHEDULE = "recovery-sweep"
GANG_QUEUE = "gang-batches"
# As infra configures the gang queue (infra/gang.py): visibility 6x the worker's timeout.
GANG_VISIBILITY_TIMEOUT_SECONDS = float(C.GANG_QUEUE_VISIBILITY_TIMEOUT_SECONDS)
GANG_MAX_RECEIVES = C.GANG_QUEUE_MAX_RECEIVES


def wire_recovery_handlers(
    bus: LocalEventBus,
    cluster_arn: str,
    *,
    sweep_every_seconds: float | None = 60,
    package: str = "handlers",
) -> dict[str, Target]:
    """Connect the recovery Lambdas exactly as infra deploys them.

    Rules: training task changes -> ``ecs_task_handler``; health-check task stopped
    -> ``dcgm_task_monitor``; container instance changes -> ``ecs_instance_monitor``;
    ``recovery_sweep`` every ``sweep_every_seconds`` (None: no schedule).
    Handlers are imported lazily from ``package``. Returns name -> handler.
    """

    def load(module: str) -> Target:
        return importlib.import_module(f"{package}.{module}").lambda_handler

    targets = {
        "ecs_task_handler": load("ecs_task_handler"),
        "dcgm_task_monitor": load("dcgm_task_monitor"),
        "ecs_instance_monitor": load("ecs_instance_monitor"),
    }
    bus.add_rule(
        "training-task-state",
        C.training_task_pattern(cluster_arn),
        targets["ecs_task_handler"],
        "ecs_task_handler",
        retry_delays=LAMBDA_ASYNC_RETRY_DELAYS,
    )
    bus.add_rule(
        "health-check-task-stopped",
        C.health_check_task_pattern(cluster_arn),
        targets["dcgm_task_monitor"],
        "dcgm_task_monitor",
        retry_delays=LAMBDA_ASYNC_RETRY_DELAYS,
    )
    bus.add_rule(
        "container-instance-state",
        C.container_instance_pattern(cluster_arn),
        targets["ecs_instance_monitor"],
        "ecs_instance_monitor",
        retry_delays=LAMBDA_ASYNC_RETRY_DELAYS,
    )
    if sweep_every_seconds:
        sweep = load("recovery_sweep")
        targets["recovery_sweep"] = sweep
        bus.add_schedule(SWEEP_SCHEDULE, sweep_every_seconds, sweep, "recovery_sweep")
    targets["gang_worker"] = load("gang_worker")
    bus.add_queue(GANG_QUEUE, targets["gang_worker"], "gang_worker", batch_size=1,
                  visibility_timeout=GANG_VISIBILITY_TIMEOUT_SECONDS, max_receive_count=GANG_MAX_RECEIVES)
    route_gang_queue(bus)
    return targets


def route_gang_queue(bus: LocalEventBus) -> None:
    """The handlers' SendMessageBatch to the gang queue lands in the bus's local queue (in
    simulated time) instead of moto's, answered as SQS answers it."""
    local = LocalAws.active()
    if local is None:
        return
    url = local.env.get(C.ENV_GANG_QUEUE_URL, "")

    def send_batch(params: dict[str, Any], context: dict[str, Any]) -> Any:
        if params.get("QueueUrl") != url or GANG_QUEUE not in bus.queues:
            return None
        entries = params.get("Entries") or []
        for entry in entries:
            bus.send(GANG_QUEUE, [entry["MessageBody"]], float(entry.get("DelaySeconds") or 0))
        return hook_answer("sqs", {
            "Successful": [{"Id": e["Id"], "MessageId": str(uuid.uuid4()), "MD5OfMessageBody": ""}
                           for e in entries],
            "Failed": []})

    local.hooks.on_before_call("sqs", "SendMessageBatch", send_batch)
