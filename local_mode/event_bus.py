"""``LocalEventBus``: EventBridge rules and schedules, in process and in simulated time.

Rules are ``(name, pattern, target)``; patterns are the *deployed* ones from
``gpu_recovery.constants`` and are matched with moto's EventBridge matcher. Targets
are ``lambda_handler(event, context)`` callables; each gets a Lambda-shaped context.

* ``put_events(event)`` delivers synchronously to every matching rule's target.
  ``duplicate_delivery=True`` delivers each event twice (EventBridge is
  at-least-once; the duplicate is the same dict content with the same ``id``).
* A target exception is recorded in ``deliveries`` (ok=False) and ``dead_letters``
  (like an async Lambda invoke failure landing in a DLQ) and never stops the bus.
* ``add_schedule(name, every_seconds, target)`` fires "Scheduled Event" events as
  the simulation clock passes each due time (the driver in ``ecs_sim`` calls
  :meth:`fire_due`).

``wire_recovery_handlers(bus, cluster_arn)`` connects the four recovery handlers.
"""

from __future__ import annotations

import copy
import importlib
import json
import threading
import time as _time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moto.events.models import EventPattern

from gpu_recovery import constants as C

from . import events as ev

Target = Callable[[dict[str, Any], Any], Any]


@dataclass
class LambdaContext:
    """The parts of the Lambda context object handlers and Powertools read."""

    function_name: str
    memory_limit_in_mb: int = 256
    function_version: str = "$LATEST"
    timeout_seconds: int = 300
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    region: str = ev.REGION
    account: str = ev.ACCOUNT_ID
    log_group_name: str = ""
    log_stream_name: str = "local"

    def __post_init__(self) -> None:
        self.invoked_function_arn = (
            f"arn:aws:lambda:{self.region}:{self.account}:function:{self.function_name}"
        )
        self.log_group_name = self.log_group_name or f"/aws/lambda/{self.function_name}"
        self._deadline = _time.monotonic() + self.timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - _time.monotonic()) * 1000))


@dataclass
class Rule:
    name: str
    pattern: dict[str, Any]
    target: Target
    target_name: str
    _matcher: Any = field(repr=False, default=None)

    @property
    def arn(self) -> str:
        return f"arn:aws:events:{ev.REGION}:{ev.ACCOUNT_ID}:rule/{self.name}"

    def matches(self, event: dict[str, Any]) -> bool:
        if self._matcher is None:
            self._matcher = EventPattern.load(json.dumps(self.pattern))
        return bool(self._matcher.matches_event(event))


@dataclass
class Schedule:
    name: str
    every_seconds: float
    target: Target
    target_name: str
    next_due: float

    @property
    def arn(self) -> str:
        return f"arn:aws:events:{ev.REGION}:{ev.ACCOUNT_ID}:rule/{self.name}"


@dataclass
class Delivery:
    """One invocation of a target (the bus's delivery log)."""

    event_id: str
    detail_type: str
    rule: str
    target: str
    ok: bool
    error: str | None = None
    time: float | None = None
    duplicate: bool = False
    result: Any = None


@dataclass
class DeadLetter:
    rule: str
    target: str
    event: dict[str, Any]
    error: BaseException
    traceback: str


def _name_of(target: Target) -> str:
    module = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", type(target).__name__)
    if name == "lambda_handler" and module:
        return module.rsplit(".", 1)[-1]
    return name


class LocalEventBus:
    """In-process EventBridge: rules, targets, schedules; thread-safe."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        duplicate_delivery: bool = False,
        raise_errors: bool = False,
    ) -> None:
        self.clock = clock or _time.time
        self.duplicate_delivery = duplicate_delivery
        #: re-raise target exceptions (handy while debugging a handler)
        self.raise_errors = raise_errors
        self.rules: list[Rule] = []
        self.schedules: list[Schedule] = []
        self.deliveries: list[Delivery] = []
        self.dead_letters: list[DeadLetter] = []
        self.events: list[dict[str, Any]] = []  # every event put, in order
        self._lock = threading.RLock()

    # --- configuration -----------------------------------------------------------
    def add_rule(
        self, name: str, pattern: dict[str, Any], target: Target, target_name: str | None = None
    ) -> Rule:
        rule = Rule(name, pattern, target, target_name or _name_of(target))
        rule.matches({"source": "probe"})  # fail fast on a pattern moto cannot load
        with self._lock:
            self.rules.append(rule)
        return rule

    def add_schedule(
        self,
        name: str,
        every_seconds: float,
        target: Target,
        target_name: str | None = None,
        first_at: float | None = None,
    ) -> Schedule:
        """A ``rate(...)`` rule: first fires at ``first_at`` (default now + period)."""
        due = first_at if first_at is not None else self.clock() + every_seconds
        sched = Schedule(name, every_seconds, target, target_name or _name_of(target), due)
        with self._lock:
            self.schedules.append(sched)
        return sched

    # --- delivery ----------------------------------------------------------------
    def matching_rules(self, event: dict[str, Any]) -> list[Rule]:
        with self._lock:
            rules = list(self.rules)
        return [r for r in rules if r.matches(event)]

    def put_events(self, event: dict[str, Any]) -> list[Delivery]:
        """Deliver ``event`` to every matching rule's target (twice if duplicating)."""
        with self._lock:
            self.events.append(event)
        out: list[Delivery] = []
        for rule in self.matching_rules(event):
            copies = 2 if self.duplicate_delivery else 1
            for i in range(copies):
                out.append(self._invoke(rule.name, rule.target, rule.target_name, event, i > 0))
        return out

    def _invoke(
        self, rule: str, target: Target, target_name: str, event: dict[str, Any], dup: bool
    ) -> Delivery:
        payload = copy.deepcopy(event)  # each invocation gets its own JSON-decoded copy
        context = LambdaContext(function_name=target_name)
        delivery = Delivery(
            event_id=event.get("id", ""),
            detail_type=event.get("detail-type", ""),
            rule=rule,
            target=target_name,
            ok=True,
            time=self.clock(),
            duplicate=dup,
        )
        try:
            delivery.result = target(payload, context)
        except Exception as exc:
            delivery.ok = False
            delivery.error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.dead_letters.append(
                    DeadLetter(rule, target_name, event, exc, traceback.format_exc())
                )
            if self.raise_errors:
                with self._lock:
                    self.deliveries.append(delivery)
                raise
        with self._lock:
            self.deliveries.append(delivery)
        return delivery

    # --- schedules ---------------------------------------------------------------
    def next_schedule_due(self) -> float | None:
        with self._lock:
            return min((s.next_due for s in self.schedules), default=None)

    def fire_due(self, now: float | None = None) -> list[Delivery]:
        """Fire every schedule due at or before ``now`` (each period once, in order)."""
        now = self.clock() if now is None else now
        out: list[Delivery] = []
        while True:
            with self._lock:
                due = [s for s in self.schedules if s.next_due <= now]
                if not due:
                    return out
                sched = min(due, key=lambda s: s.next_due)
                fire_at = sched.next_due
                sched.next_due += sched.every_seconds
            event = ev.scheduled_event(sched.arn, time=fire_at)
            with self._lock:
                self.events.append(event)
            out.append(self._invoke(sched.name, sched.target, sched.target_name, event, False))

    # --- inspection --------------------------------------------------------------
    def failures(self) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if not d.ok]

    def delivered_to(self, target_name: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.target == target_name]


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
    )
    bus.add_rule(
        "health-check-task-stopped",
        C.health_check_task_pattern(cluster_arn),
        targets["dcgm_task_monitor"],
        "dcgm_task_monitor",
    )
    bus.add_rule(
        "container-instance-state",
        C.container_instance_pattern(cluster_arn),
        targets["ecs_instance_monitor"],
        "ecs_instance_monitor",
    )
    if sweep_every_seconds:
        sweep = load("recovery_sweep")
        targets["recovery_sweep"] = sweep
        bus.add_schedule("recovery-sweep", sweep_every_seconds, sweep, "recovery_sweep")
    return targets
