"""``LambdaService``: Lambda in the scale simulator's account, in simulated time, and the
engine's timing of the one event bus (:class:`EngineTiming`).

Asynchronous invocations (EventBridge targets, schedules) and synchronous ones (an SQS
event source); an account concurrency limit (1,000: an invocation beyond it waits for a
free slot, as Lambda's async queue does); a container per concurrent invocation, reused
afterwards (per-container state: the service object, its clients and their retry quota);
the function timeout ends an invocation at its next AWS call or sleep past the deadline
(:class:`~local_mode.sim.engine.LambdaTimeout`); a failed asynchronous invocation is
retried by the bus's policy (:func:`~local_mode.sim.bus.async_retry_delay`: twice, about 1
and then 2 minutes later, up to 5 s of jitter, unless older than the maximum event age), then
dead-lettered (:class:`~local_mode.sim.bus.DeadLetter`: counted, kept).

:class:`EngineTiming` is how :class:`~local_mode.sim.bus.EventBus` delivers on the engine:
each copy of an event reaches Lambda after its own random (seeded) delay and is invoked
asynchronously; a schedule fires on the engine.

Limits: Lambda scales to the concurrency limit at once (no burst ramp-up); no cold starts.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .. import events as ev
from ..events import ACCOUNT_ID, REGION
from .bus import DeadLetter, Rule, Schedule, async_retry_delay
from .deployment import LAMBDA_ASYNC_RETRY_DELAYS, AsyncRetries
from .engine import Process, Simulation
from .lambda_context import new_request_id, simulated_context

# "About" a minute: Lambda's internal queue does not replay failures in lockstep (an
# assumption of the model; exact delays would make every retry of a burst collide again).
ASYNC_RETRY_JITTER = 5.0
LAMBDA_CONCURRENCY = 1000  # the account's default concurrent executions


@dataclass
class Invocation:
    """One run of a function (a retry is a new Invocation with ``attempt`` + 1)."""

    function: str
    payload: Any
    attempt: int
    received_at: float  # when the event first reached Lambda (for the maximum event age)
    queued_at: float
    started_at: float | None = None
    ended_at: float | None = None
    ok: bool = False
    timed_out: bool = False
    error: str = ""
    result: Any = None
    synchronous: bool = False
    request_id: str = field(default_factory=new_request_id)  # a retry keeps the failed attempt's

    @property
    def duration(self) -> float:
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return self.ended_at - self.started_at


@dataclass
class FunctionStats:
    invocations: int = 0
    errors: int = 0
    timeouts: int = 0
    retries: int = 0
    dead_letters: int = 0
    max_duration: float = 0.0
    total_duration: float = 0.0
    max_wait: float = 0.0  # queued behind the concurrency limit

    def as_dict(self, timeout: float) -> dict[str, Any]:
        return {"invocations": self.invocations, "errors": self.errors, "timeouts": self.timeouts,
                "retries": self.retries, "dead_letters": self.dead_letters,
                "longest_s": round(self.max_duration, 2), "timeout_s": timeout,
                "mean_s": round(self.total_duration / self.invocations, 3) if self.invocations else 0.0,
                "max_queue_wait_s": round(self.max_wait, 2)}


@dataclass
class LambdaFunction:
    name: str
    handler: Callable[[Any, Any], Any]  # (container, payload) -> result
    timeout: float
    make_container: Callable[[], Any]
    retries: AsyncRetries = field(default_factory=lambda: AsyncRetries(2, 7200.0, LAMBDA_ASYNC_RETRY_DELAYS))
    idle: list[Any] = field(default_factory=list)
    stats: FunctionStats = field(default_factory=FunctionStats)


class LambdaService:
    """Lambda in the simulated account (see the module docstring)."""

    def __init__(self, sim: Simulation, *, concurrency: int = LAMBDA_CONCURRENCY,
                 keep_invocations: bool = True, retry_jitter: float = ASYNC_RETRY_JITTER) -> None:
        self.sim = sim
        self.concurrency = concurrency
        self.retry_jitter = retry_jitter
        self.functions: dict[str, LambdaFunction] = {}
        self.running = 0
        self.max_running = 0
        self.throttled = 0  # invocations that waited for a free slot
        self._waiting: list[tuple[Invocation, Callable[[Invocation], None] | None]] = []
        self._waiting_head = 0
        self.dead_letters: list[DeadLetter] = []
        self.keep_invocations = keep_invocations
        self.invocations: list[Invocation] = []
        self._numbers = itertools.count(1)  # invocation ids (the conflict model tells them apart)

    def add_function(self, name: str, handler: Callable[[Any, Any], Any], *, timeout: float,
                     make_container: Callable[[], Any] | None = None, async_retries: int = 2,
                     max_event_age: float = 7200.0) -> LambdaFunction:
        function = LambdaFunction(name, handler, timeout, make_container or (lambda: None),
                                  AsyncRetries(async_retries, max_event_age))
        self.functions[name] = function
        return function

    def reset_stats(self) -> None:
        for function in self.functions.values():
            function.stats = FunctionStats()
        self.dead_letters.clear()
        self.invocations.clear()
        self.max_running = self.running
        self.throttled = 0

    # --- invoking ----------------------------------------------------------------------
    def invoke_async(self, name: str, payload: Any, *, received_at: float | None = None,
                     attempt: int = 1, request_id: str | None = None) -> None:
        """An asynchronous invocation (an EventBridge target, a schedule); ``request_id``: a
        retry's, the failed attempt's (Lambda keeps it)."""
        now = self.sim.now
        invocation = Invocation(name, payload, attempt, received_at if received_at is not None else now, now)
        if request_id is not None:
            invocation.request_id = request_id
        self._admit(invocation, None)

    def invoke(self, name: str, payload: Any, on_done: Callable[[Invocation], None]) -> None:
        """A synchronous invocation (an SQS event source): no Lambda retries; ``on_done``
        gets the outcome."""
        now = self.sim.now
        self._admit(Invocation(name, payload, 1, now, now, synchronous=True), on_done)

    def _admit(self, invocation: Invocation, on_done: Callable[[Invocation], None] | None) -> None:
        if self.running >= self.concurrency:
            self.throttled += 1
            self._waiting.append((invocation, on_done))
            return
        self._start(invocation, on_done)

    def _start(self, invocation: Invocation, on_done: Callable[[Invocation], None] | None) -> None:
        function = self.functions[invocation.function]
        container = function.idle.pop() if function.idle else function.make_container()
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        invocation.started_at = self.sim.now
        function.stats.max_wait = max(function.stats.max_wait, invocation.started_at - invocation.queued_at)

        def finished(process: Process) -> None:
            self.running -= 1
            invocation.ended_at = self.sim.now
            invocation.result = process.result
            invocation.timed_out = process.timed_out
            invocation.ok = process.error is None
            if process.error is not None:
                invocation.error = f"{type(process.error).__name__}: {process.error}"[:500]
            if not process.timed_out:  # a timed-out environment is not reused
                function.idle.append(container)
            self._account(function, invocation)
            if on_done is not None:
                on_done(invocation)
            elif not invocation.ok:
                self._retry_or_dead_letter(function, invocation)
            self._start_waiting()

        process = self.sim.spawn(lambda: function.handler(container, invocation.payload),
                                 name=f"{function.name}#{next(self._numbers)}", label=function.name,
                                 timeout=function.timeout, on_done=finished)
        # Its Lambda context: the request id, the time left to the process's deadline.
        process.context = simulated_context(function.name, request_id=invocation.request_id,
                                            clock=lambda: self.sim.now, timeout_seconds=function.timeout)
        if self.keep_invocations:
            self.invocations.append(invocation)

    def _start_waiting(self) -> None:
        while self.running < self.concurrency and self._waiting_head < len(self._waiting):
            invocation, on_done = self._waiting[self._waiting_head]
            self._waiting_head += 1
            self._start(invocation, on_done)
        if self._waiting_head > 1024 and self._waiting_head * 2 > len(self._waiting):
            del self._waiting[:self._waiting_head]
            self._waiting_head = 0

    @staticmethod
    def _account(function: LambdaFunction, invocation: Invocation) -> None:
        stats = function.stats
        stats.invocations += 1
        stats.total_duration += invocation.duration
        stats.max_duration = max(stats.max_duration, invocation.duration)
        if invocation.timed_out:
            stats.timeouts += 1
        if not invocation.ok:
            stats.errors += 1

    def _retry_or_dead_letter(self, function: LambdaFunction, invocation: Invocation) -> None:
        attempt = invocation.attempt
        delay = async_retry_delay(function.retries, attempt, self.sim.now - invocation.received_at,
                                  lambda: self.sim.rng.uniform(0.0, self.retry_jitter))
        if delay is not None:
            function.stats.retries += 1
            self.sim.after(delay, lambda: self.invoke_async(
                function.name, invocation.payload, received_at=invocation.received_at,
                attempt=attempt + 1, request_id=invocation.request_id), f"retry {function.name}")
            return
        function.stats.dead_letters += 1
        self.dead_letters.append(DeadLetter("", function.name, invocation.payload, invocation.error, attempt,
                                            self.sim.now))

    def summary(self) -> dict[str, Any]:
        return {"functions": {name: f.stats.as_dict(f.timeout) for name, f in sorted(self.functions.items())},
                "max_concurrency": self.max_running, "waited_for_concurrency": self.throttled,
                "dead_letters": len(self.dead_letters)}



class EngineTiming:
    """The event bus's delivery on the engine (:class:`~local_mode.sim.bus.EventBus` ``timing``):
    each copy of an event reaches ``lambdas`` after a random ``delivery_delay`` (seeded, so a
    burst arrives in random order) as an asynchronous invocation of the rule's function; a
    schedule's Scheduled Events are invoked the same way as the engine passes their times.

    Limits: EventBridge delivers within a fixed random delay."""

    def __init__(self, sim: Simulation, lambdas: LambdaService, *,
                 delivery_delay: tuple[float, float] = (0.05, 0.5)) -> None:
        self.sim = sim
        self.lambdas = lambdas
        self.delivery_delay = delivery_delay

    def deliver(self, rule: Rule, event: dict[str, Any]) -> None:
        received = self.sim.now
        delay = self.sim.rng.uniform(*self.delivery_delay)
        payload = json.loads(json.dumps(event))  # each target gets its own decoded copy
        deliver = partial(self.lambdas.invoke_async, rule.target_name, payload, received_at=received)
        self.sim.after(delay, deliver, f"deliver to {rule.target_name}")

    def start_schedule(self, schedule: Schedule) -> None:
        def fire() -> None:
            event = ev.scheduled_event(schedule.arn, time=self.sim.now, account=ACCOUNT_ID, region=REGION)
            self.lambdas.invoke_async(schedule.target_name, event)
            schedule.next_due = self.sim.now + schedule.every_seconds
            self.sim.after(schedule.every_seconds, fire, f"schedule {schedule.name}")

        self.sim.at(schedule.next_due, fire, f"schedule {schedule.name}")
