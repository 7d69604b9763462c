"""The recovery Lambdas on the bus, exactly as infra deploys them, for both worlds: the
EventBridge rules of the ECS events, the recovery sweep's schedule and the event sources of
the gang queue and the tag lookup queue, all read from ``local_mode.sim.deployment`` here
and nowhere else (:func:`wire_deployment`; the heartbeat sweep's and the queue scheduler's
schedules, which a moto world adds when asked, through the same :func:`wire_schedule`).

What differs between the worlds is only where a function runs, a :class:`FunctionHost`:

* the moto world (:func:`wire_recovery_handlers`, :class:`InProcessHost`): each function is
  its handler's ``lambda_handler``, invoked by the bus in process; its queues are the bus's
  (``EventBus.add_queue``), the handlers' ``SendMessageBatch`` to them answered by the bus
  (:func:`route_queues`);
* the scale world (``local_mode.scale_recovery``): each function is a
  :class:`~local_mode.sim.lambdas.LambdaService` function on the engine, its queues
  ``SqsQueue`` with Lambda's poller attached.
"""

from __future__ import annotations

import importlib
import uuid
from typing import Any, Protocol

from gpu_recovery import constants as C

from ..api_hooks import hook_answer, hook_error
from ..emulator import LocalAws
from . import deployment as D
from .bus import EventBus, Target
from .sqs_model import BatchRefused, change_visibility_batch

SWEEP_SCHEDULE = D.SWEEP_SCHEDULE.name
GANG_QUEUE = D.GANG_QUEUE.name


class FunctionHost(Protocol):
    """Where a world runs the recovery functions."""

    def target(self, function: D.Function) -> Target | str:
        """What a rule or schedule invokes: a handler (in process) or the engine's function name."""

    def attach_queue(self, source: D.QueueSource) -> None:
        """The queue and its event source to ``source.function``."""

    def first_tick(self, every_seconds: float) -> float | None:
        """When a schedule first fires (None: one period from now)."""


def wire_deployment(bus: EventBus, host: FunctionHost, cluster_arn: str, *, registration: str = "both",
                    sweep_every_seconds: float | None = D.SWEEP_SCHEDULE.every_seconds,
                    queues: tuple[D.QueueSource, ...] = D.QUEUES) -> None:
    """The deployed plumbing on ``bus``: each rule of :data:`~D.RULES` (its pattern for the
    cluster and the registration mode) to its function, with the function's asynchronous
    retry policy; each schedule every ``sweep_every_seconds`` (None: no schedule); each of
    ``queues`` with its event source."""
    for rule in D.RULES:
        function = D.FUNCTIONS[rule.function]
        bus.add_rule(rule.name, rule.pattern(cluster_arn, registration), host.target(function), rule.function,
                     retries=function.retries, timeout_seconds=function.timeout_seconds)
    if sweep_every_seconds:
        for schedule in D.SCHEDULES:
            wire_schedule(bus, host, schedule, sweep_every_seconds)
    for source in queues:
        host.attach_queue(source)


def wire_schedule(bus: EventBus, host: FunctionHost, schedule: D.Schedule,
                  every_seconds: float | None = None) -> None:
    """``schedule``'s ``rate()`` rule on ``bus``, every ``every_seconds`` (None: the deployed
    rate), its function invoked asynchronously with the function's retries, as deployed."""
    function = D.function(schedule.function)
    every = every_seconds or schedule.every_seconds
    bus.add_schedule(schedule.name, every, host.target(function), schedule.function,
                     first_at=host.first_tick(every), retries=function.retries,
                     timeout_seconds=function.timeout_seconds)


class InProcessHost:
    """The moto world's functions: each handler module's ``lambda_handler`` (imported lazily
    from ``package``), invoked in process by the bus; the queues are the bus's."""

    def __init__(self, bus: EventBus, package: str = "handlers") -> None:
        self.bus = bus
        self.package = package
        self.targets: dict[str, Target] = {}

    def target(self, function: D.Function) -> Target:
        if function.name not in self.targets:
            module = importlib.import_module(f"{self.package}.{function.name}")
            self.targets[function.name] = module.lambda_handler
        return self.targets[function.name]

    def attach_queue(self, source: D.QueueSource) -> None:
        self.bus.add_queue(source.name, self.target(D.FUNCTIONS[source.function]), source.function,
                           batch_size=source.batch_size, visibility_timeout=source.visibility_timeout_seconds,
                           max_receive_count=source.max_receives)

    def first_tick(self, every_seconds: float) -> float | None:
        return None


def wire_recovery_handlers(
    bus: EventBus,
    cluster_arn: str,
    *,
    sweep_every_seconds: float | None = D.SWEEP_SCHEDULE.every_seconds,
    package: str = "handlers",
) -> dict[str, Target]:
    """The moto world's recovery Lambdas, as infra deploys them (:func:`wire_deployment`).

    Rules: training task changes -> ``ecs_task_handler``; health-check task stopped
    -> ``dcgm_task_monitor``; container instance changes -> ``ecs_instance_monitor``, each
    with Lambda's asynchronous retries; ``recovery_sweep`` every ``sweep_every_seconds``
    (None: no schedule; a failed tick retried as Lambda retries the deployed schedule's
    asynchronous invocation); the gang queue ->
    ``gang_worker``; the tag lookup queue -> ``tag_lookup_worker`` (the handlers told its
    URL, so tags-only tasks are looked up there). Handlers are imported lazily from
    ``package``. Returns name -> handler.
    """
    host = InProcessHost(bus, package)
    wire_deployment(bus, host, cluster_arn, sweep_every_seconds=sweep_every_seconds)
    route_queues(bus)
    return host.targets


def route_queues(bus: EventBus) -> None:
    """The handlers' SendMessageBatch to the gang queue or the tag lookup queue lands in the
    bus's queue of that name (in simulated time) instead of moto's, answered as SQS answers it;
    so does a worker's ChangeMessageVisibilityBatch of the messages it received from one.
    The tag lookup queue is named in the handlers' environment here, with its worker wired
    (as infra deploys the two together; the gang queue's URL is set by ``LocalAws``)."""
    local = LocalAws.active()
    if local is None:
        return
    by_url = {local.env.get(C.ENV_GANG_QUEUE_URL, ""): D.GANG_QUEUE.name}
    if D.TAG_LOOKUP_QUEUE.name in bus.queues:
        by_url[local.use_tag_lookup_queue()] = D.TAG_LOOKUP_QUEUE.name
    by_url.pop("", None)
    for url, name in by_url.items():
        if name in bus.queues:  # its records name the queue the handlers were told of
            bus.queues[name].queue.known_as(url)

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

    def change_visibility(params: dict[str, Any], context: dict[str, Any]) -> Any:
        # A worker brings its failed messages forward (adapters.queue.Redeliveries), naming
        # the queue by its URL as the record's ARN gives it.
        source = next((s for s in bus.queues.values() if s.queue.url == params.get("QueueUrl")), None)
        if source is None:
            return None
        try:
            answer = change_visibility_batch(source.queue, list(params.get("Entries") or []))
        except BatchRefused as refused:
            return hook_error("sqs", refused.code, refused.message)
        return hook_answer("sqs", answer)

    local.hooks.on_before_call("sqs", "ChangeMessageVisibilityBatch", change_visibility)
