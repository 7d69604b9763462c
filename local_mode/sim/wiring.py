"""The recovery Lambdas on the local bus, exactly as infra deploys them: the EventBridge rules
of the ECS events, the recovery sweep's schedule and the event sources of the gang queue and the
tag lookup queue (with the handlers' ``SendMessageBatch`` to them answered by the bus's local
queues), all read from ``local_mode.sim.deployment``."""

from __future__ import annotations

import importlib
import uuid
from typing import Any

from gpu_recovery import constants as C

from ..api_hooks import hook_answer
from ..emulator import LocalAws
from . import deployment as D
from .bus import EventBus, Target

SWEEP_SCHEDULE = D.SWEEP_SCHEDULE.name
GANG_QUEUE = D.GANG_QUEUE.name


def wire_recovery_handlers(
    bus: EventBus,
    cluster_arn: str,
    *,
    sweep_every_seconds: float | None = D.SWEEP_SCHEDULE.every_seconds,
    package: str = "handlers",
) -> dict[str, Target]:
    """Connect the recovery Lambdas exactly as infra deploys them (``local_mode.sim.deployment``).

    Rules: training task changes -> ``ecs_task_handler``; health-check task stopped
    -> ``dcgm_task_monitor``; container instance changes -> ``ecs_instance_monitor``, each
    with Lambda's asynchronous retries; ``recovery_sweep`` every ``sweep_every_seconds``
    (None: no schedule); the gang queue -> ``gang_worker``; the tag lookup queue ->
    ``tag_lookup_worker`` (the handlers told its URL, so tags-only tasks are looked up there).
    Handlers are imported lazily from ``package``. Returns name -> handler.
    """

    def load(module: str) -> Target:
        return importlib.import_module(f"{package}.{module}").lambda_handler

    targets: dict[str, Target] = {}
    for rule in D.RULES:
        targets[rule.function] = load(rule.function)
        bus.add_rule(rule.name, rule.pattern(cluster_arn), targets[rule.function], rule.function,
                     retries=D.FUNCTIONS[rule.function].retries)
    if sweep_every_seconds:
        for schedule in D.SCHEDULES:
            # The moto world's schedules are not retried (a failed tick is a dead letter at once).
            targets[schedule.function] = load(schedule.function)
            bus.add_schedule(schedule.name, sweep_every_seconds, targets[schedule.function],
                             schedule.function)
    for queue in D.QUEUES:
        targets[queue.function] = load(queue.function)
        bus.add_queue(queue.name, targets[queue.function], queue.function, batch_size=queue.batch_size,
                      visibility_timeout=queue.visibility_timeout_seconds,
                      max_receive_count=queue.max_receives)
    route_queues(bus)
    return targets


def route_queues(bus: EventBus) -> None:
    """The handlers' SendMessageBatch to the gang queue or the tag lookup queue lands in the
    bus's queue of that name (in simulated time) instead of moto's, answered as SQS answers it.
    The tag lookup queue is named in the handlers' environment here, with its worker wired
    (as infra deploys the two together; the gang queue's URL is set by ``LocalAws``)."""
    local = LocalAws.active()
    if local is None:
        return
    by_url = {local.env.get(C.ENV_GANG_QUEUE_URL, ""): D.GANG_QUEUE.name}
    if D.TAG_LOOKUP_QUEUE.name in bus.queues:
        by_url[local.use_tag_lookup_queue()] = D.TAG_LOOKUP_QUEUE.name
    by_url.pop("", None)

    def send_batch(params: dict[str, Any], context: dict[str, Any]) -> Any:
        name = by_url.get(params.get("QueueUrl") or "")
        if name is None or name not in bus.queues:
            return None
        entries = params.get("Entries") or []
        for entry in entries:
            bus.send(name, [entry["MessageBody"]], float(entry.get("DelaySeconds") or 0))
        return hook_answer("sqs", {
            "Successful": [{"Id": e["Id"], "MessageId": str(uuid.uuid4()), "MD5OfMessageBody": ""}
                           for e in entries],
            "Failed": []})

    local.hooks.on_before_call("sqs", "SendMessageBatch", send_batch)
