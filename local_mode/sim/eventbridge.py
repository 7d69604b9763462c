"""``EventBus``: EventBridge in the scale simulator, in simulated time.

Rules matched with the *deployed* patterns (moto's matcher, as
:class:`~local_mode.sim.bus.LocalEventBus` does), every event delivered ``copies`` times
(2: at-least-once), each copy after its own random delivery delay (seeded), so a burst
arrives in random order; ``rate()`` schedules. Targets are functions of a
:class:`~local_mode.sim.lambdas.LambdaService`, invoked asynchronously (so Lambda's retry
policy applies).

Limits: EventBridge delivers within a fixed random delay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

from moto.events.models import EventPattern

from .. import events as ev
from ..events import ACCOUNT_ID, REGION
from .engine import Simulation
from .lambdas import LambdaService


@dataclass
class _Rule:
    name: str
    pattern: dict[str, Any]
    function: str
    matcher: Any


class EventBus:
    """EventBridge: rules with the deployed patterns, at-least-once delivery, schedules."""

    def __init__(self, sim: Simulation, lambdas: LambdaService, *, copies: int = 2,
                 delivery_delay: tuple[float, float] = (0.05, 0.5)) -> None:
        self.sim = sim
        self.lambdas = lambdas
        self.copies = copies
        self.delivery_delay = delivery_delay
        self.rules: list[_Rule] = []
        self.events_put = 0
        self.deliveries = 0

    def add_rule(self, name: str, pattern: dict[str, Any], function: str) -> None:
        self.rules.append(_Rule(name, pattern, function, EventPattern.load(json.dumps(pattern))))

    def add_schedule(self, name: str, every_seconds: float, function: str, *,
                     first_at: float | None = None) -> None:
        """A ``rate()`` rule: a Scheduled Event to ``function`` every ``every_seconds``."""
        arn = f"arn:aws:events:{REGION}:{ACCOUNT_ID}:rule/{name}"

        def fire() -> None:
            event = ev.scheduled_event(arn, time=self.sim.now, account=ACCOUNT_ID, region=REGION)
            self.lambdas.invoke_async(function, event)
            self.sim.after(every_seconds, fire, f"schedule {name}")

        self.sim.at(first_at if first_at is not None else self.sim.now + every_seconds, fire,
                    f"schedule {name}")

    def put(self, event: dict[str, Any]) -> int:
        """Deliver ``event`` to every matching rule, ``copies`` times; returns the deliveries."""
        self.events_put += 1
        count = 0
        for rule in self.rules:
            if not rule.matcher.matches_event(event):
                continue
            for _ in range(self.copies):
                received = self.sim.now
                delay = self.sim.rng.uniform(*self.delivery_delay)
                payload = json.loads(json.dumps(event))  # each target gets its own decoded copy
                deliver = partial(self.lambdas.invoke_async, rule.function, payload, received_at=received)
                self.sim.after(delay, deliver, f"deliver to {rule.function}")
                count += 1
        self.deliveries += count
        return count

