"""The local world every local app and test runs in: the emulated AWS account (``LocalAws``),
the event bus (``LocalEventBus``) and the simulated ECS data plane (``SimulatedEcs``),
with the recovery Lambdas wired to the bus as infra deploys them.

``build_world`` is the one place that sets this up and tears it down; the demo, the
playground, the scenarios, the campaigns, the benches and the tests all enter it::

    with build_world(duplicate_delivery=True, max_recovery_attempts=3) as world:
        world.ecs.add_node("node-a")
        ...
        world.ecs.run_for(3600)

The handlers' services (``runtime``) are forgotten right after the emulator starts and
again before it stops: a handler never runs on services built for another emulator.
Apps that also serve the jobs API wrap the world in ``harness.reset_handler_caches``
(before the emulator and after it), which drops the jobs API's own caches too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import runtime

from .emulator import LocalAws
from .sim.bus import LambdaContext, LocalEventBus, Target
from .sim.ecs import SimulatedEcs
from .sim.wiring import wire_recovery_handlers

#: the deployed rate(1 minute) schedules of the heartbeat sweep and the queue scheduler
HEARTBEAT_SWEEP_SCHEDULE = "heartbeat-sweep"
QUEUE_SCHEDULER_SCHEDULE = "queue-scheduler"


@dataclass
class World:
    """One emulated account, its event bus and its simulated ECS data plane."""

    #: the emulated AWS account: tables, topic, cluster, handler environment, API hooks
    aws: LocalAws
    #: EventBridge rules and schedules, the gang queue; at-least-once delivery
    bus: LocalEventBus
    #: the ECS data plane in simulated time: nodes, agents, tasks, faults
    ecs: SimulatedEcs
    #: the recovery Lambdas wired to the bus, by name (empty when built without handlers)
    handlers: dict[str, Target] = field(default_factory=dict)

    def schedule_heartbeat_sweep(self, every_seconds: float = 60) -> None:
        """The heartbeat sweep Lambda on its schedule."""
        from handlers import heartbeat_sweep

        self.bus.add_schedule(HEARTBEAT_SWEEP_SCHEDULE, every_seconds, heartbeat_sweep.lambda_handler,
                              "heartbeat_sweep")

    def schedule_queue_scheduler(self, every_seconds: float = 60, *, target: Target | None = None) -> None:
        """The queue scheduler Lambda on its schedule (``target``: the handler, wrapped)."""
        from handlers import queue_scheduler

        self.bus.add_schedule(QUEUE_SCHEDULER_SCHEDULE, every_seconds,
                              target or queue_scheduler.lambda_handler, "queue_scheduler")

    def invoke_scheduler_in_process(self, on_failure: Callable[[Exception], None], *,
                                    target: Target | None = None) -> None:
        """The jobs API's asynchronous Invoke of the queue scheduler (after a submit, a
        cancel...), made in this process; a failure goes to ``on_failure``, never to the API
        call that triggered it (an async invoke's failure is not the caller's)."""
        from gpu_recovery.queue.jobs_api.triggers import CallbackSchedulerTrigger
        from handlers import jobs_api, queue_scheduler

        scheduler = target or queue_scheduler.lambda_handler

        def tick_now(payload: dict[str, Any]) -> None:
            try:
                scheduler(payload, LambdaContext("queue_scheduler"))
            except Exception as error:  # an async invoke failure: reported, never raised
                on_failure(error)

        jobs_api.set_scheduler_trigger(CallbackSchedulerTrigger(tick_now))


@contextmanager
def build_world(*, duplicate_delivery: bool = False, handlers: bool = True,
                sweep_every_seconds: float | None = 60, train_seconds: float | None = None,
                real_time_start: bool = False, sim_options: Mapping[str, Any] | None = None,
                **aws_options: Any) -> Iterator[World]:
    """Set up a world, yield it, tear it down.

    ``aws_options`` go to ``LocalAws`` (``metrics_disabled`` defaults to True here);
    ``duplicate_delivery``: every event delivered twice; ``handlers``: wire the recovery
    Lambdas (``wire_recovery_handlers``), with the recovery sweep every
    ``sweep_every_seconds`` (None: no sweep schedule); ``train_seconds`` and
    ``sim_options`` go to ``SimulatedEcs`` (training ranks run until stopped by default);
    ``real_time_start``: simulated time starts at the wall-clock time the data plane is
    built (the playground, driven in real time), not at the fixed ``DEFAULT_START``.
    """
    aws_options = {"metrics_disabled": True, **aws_options}
    with LocalAws(**aws_options) as aws:
        runtime.reset(clients=False)
        try:
            bus = LocalEventBus(duplicate_delivery=duplicate_delivery)
            options = dict(sim_options or {})
            if real_time_start:
                options["start"] = time.time()
            ecs = SimulatedEcs(aws, bus, train_seconds=train_seconds, **options)
            wired = (wire_recovery_handlers(bus, aws.cluster_arn, sweep_every_seconds=sweep_every_seconds)
                     if handlers else {})
            yield World(aws, bus, ecs, wired)
        finally:
            runtime.reset(clients=False)
