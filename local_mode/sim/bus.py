"""``LocalEventBus``: EventBridge rules and schedules, in process and in simulated time.

Rules are ``(name, pattern, target)``; patterns are the *deployed* ones from
``gpu_recovery.constants`` and are matched with moto's EventBridge matcher. Targets
are ``lambda_handler(event, context)`` callables; each gets a Lambda-shaped context.

* ``put_events(event)`` delivers synchronously to every matching rule's target.
  ``duplicate_delivery=True`` delivers each event twice (EventBridge is
  at-least-once; the duplicate is the same dict content with the same ``id``).
* A target exception is recorded in ``deliveries`` (ok=False) and never stops the bus.
  A rule's ``retry_delays`` redeliver the failed event later, as Lambda's asynchronous
  invocation does for the deployed functions (2 retries, about 1 and 2 minutes apart);
  when they are spent (or there are none) the event lands in ``dead_letters``, like an
  async invoke failure landing in the function's DLQ.
* ``add_schedule(name, every_seconds, target)`` fires "Scheduled Event" events as
  the simulation clock passes each due time (the driver in ``sim.ecs_core`` calls
  :meth:`fire_due`).

* ``add_queue(name, target)`` is an SQS queue with a Lambda event source mapping, in
  simulated time: ``send(bodies, delay_seconds)`` makes messages visible after their
  delay; due messages are delivered (``batch_size`` per invocation, as SQS records with
  ``ApproximateReceiveCount``) when the clock passes them; a record the target reports
  failed (a partial batch response, or the whole batch on an exception) is delivered
  again after ``visibility_timeout``, and after ``max_receive_count`` receives it lands
  in ``dead_letters`` as a redrive policy would. With ``duplicate_delivery`` each
  message is delivered twice (SQS standard queues are at-least-once too).

``local_mode.sim.wiring`` connects the recovery handlers to it as infra deploys them.
"""

from __future__ import annotations

import copy
import heapq
import json
import threading
import time as _time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moto.events.models import EventPattern

from .. import events as ev
from .lambda_context import LambdaContext

Target = Callable[[dict[str, Any], Any], Any]


@dataclass
class Rule:
    name: str
    pattern: dict[str, Any]
    target: Target
    target_name: str
    retry_delays: tuple[float, ...] = ()
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
    attempt: int = 1  # 2, 3...: a retry of a failed delivery


@dataclass(order=True)
class _Retry:
    due: float
    seq: int
    rule: Rule = field(compare=False)
    event: dict[str, Any] = field(compare=False)
    attempt: int = field(compare=False)


@dataclass
class DeadLetter:
    rule: str
    target: str
    event: dict[str, Any]
    error: BaseException
    traceback: str


@dataclass(order=True)
class _Message:
    visible_at: float
    seq: int
    message_id: str = field(compare=False)
    body: str = field(compare=False)
    receives: int = field(compare=False, default=0)
    sent_at: float = field(compare=False, default=0.0)


@dataclass
class LocalQueue:
    """An SQS queue and its Lambda event source mapping (see the module docstring)."""

    name: str
    target: Target
    target_name: str
    batch_size: int = 1
    visibility_timeout: float = 300.0
    max_receive_count: int = 5
    messages: list[_Message] = field(default_factory=list)
    sent: int = 0
    _seq: int = 0

    @property
    def arn(self) -> str:
        return f"arn:aws:sqs:{ev.REGION}:{ev.ACCOUNT_ID}:{self.name}"

    def push(self, body: str, visible_at: float, *, receives: int = 0, message_id: str = "",
             sent_at: float = 0.0) -> str:
        self._seq += 1
        message_id = message_id or str(uuid.uuid4())
        heapq.heappush(self.messages, _Message(visible_at, self._seq, message_id, body, receives, sent_at))
        return message_id

    def next_visible(self) -> float | None:
        return self.messages[0].visible_at if self.messages else None


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
        self._retries: list[_Retry] = []
        self._retry_seq = 0
        self.queues: dict[str, LocalQueue] = {}
        #: called after every invocation (a campaign's invariant checks), in delivery order
        self.observers: list[Callable[[Delivery], None]] = []
        self._lock = threading.RLock()

    # --- configuration -----------------------------------------------------------
    def add_rule(
        self,
        name: str,
        pattern: dict[str, Any],
        target: Target,
        target_name: str | None = None,
        retry_delays: tuple[float, ...] = (),
    ) -> Rule:
        rule = Rule(name, pattern, target, target_name or _name_of(target), retry_delays)
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

    def add_queue(self, name: str, target: Target, target_name: str | None = None, *,
                  batch_size: int = 1, visibility_timeout: float = 300.0,
                  max_receive_count: int = 5) -> LocalQueue:
        queue = LocalQueue(name, target, target_name or _name_of(target), batch_size, visibility_timeout,
                           max_receive_count)
        with self._lock:
            self.queues[name] = queue
        return queue

    def send(self, queue_name: str, bodies: list[str], delay_seconds: float = 0.0) -> list[str]:
        """SendMessage(Batch): the messages become visible ``delay_seconds`` from now."""
        now = self.clock()
        with self._lock:
            queue = self.queues[queue_name]
            queue.sent += len(bodies)
            return [queue.push(body, now + max(0.0, delay_seconds), sent_at=now) for body in bodies]

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
                delivery = self._invoke(rule.name, rule.target, rule.target_name, event, i > 0,
                                        rule=rule)
                out.append(delivery)
        return out

    def _invoke(
        self,
        rule_name: str,
        target: Target,
        target_name: str,
        event: dict[str, Any],
        dup: bool,
        *,
        rule: Rule | None = None,
        attempt: int = 1,
    ) -> Delivery:
        payload = copy.deepcopy(event)  # each invocation gets its own JSON-decoded copy
        context = LambdaContext(function_name=target_name)
        delivery = Delivery(
            event_id=event.get("id", ""),
            detail_type=event.get("detail-type", ""),
            rule=rule_name,
            target=target_name,
            ok=True,
            time=self.clock(),
            duplicate=dup,
            attempt=attempt,
        )
        try:
            delivery.result = target(payload, context)
        except Exception as exc:
            delivery.ok = False
            delivery.error = f"{type(exc).__name__}: {exc}"
            delays = rule.retry_delays if rule is not None else ()
            with self._lock:
                if rule is not None and attempt <= len(delays):
                    self._retry_seq += 1
                    heapq.heappush(self._retries, _Retry(self.clock() + delays[attempt - 1],
                                                         self._retry_seq, rule, event, attempt + 1))
                elif rule_name.startswith("sqs:"):
                    pass  # the queue redelivers it (or dead-letters it after its receives)
                else:
                    self.dead_letters.append(
                        DeadLetter(rule_name, target_name, event, exc, traceback.format_exc())
                    )
            if self.raise_errors:
                with self._lock:
                    self.deliveries.append(delivery)
                raise
        with self._lock:
            self.deliveries.append(delivery)
        for observe in list(self.observers):
            observe(delivery)
        return delivery

    # --- schedules ---------------------------------------------------------------
    def next_schedule_due(self) -> float | None:
        """When the next schedule, retry or queued message is due."""
        with self._lock:
            times = [s.next_due for s in self.schedules]
            if self._retries:
                times.append(self._retries[0].due)
            times += [t for t in (q.next_visible() for q in self.queues.values()) if t is not None]
            return min(times, default=None)

    def queued(self) -> int:
        with self._lock:
            return sum(len(q.messages) for q in self.queues.values())

    def pending_retries(self) -> int:
        with self._lock:
            return len(self._retries)

    def fire_due(self, now: float | None = None) -> list[Delivery]:
        """Fire every schedule, retry and queued message due at or before ``now`` (in time order)."""
        now = self.clock() if now is None else now
        out: list[Delivery] = []
        while True:
            with self._lock:
                due = [s for s in self.schedules if s.next_due <= now]
                retry = self._retries[0] if self._retries and self._retries[0].due <= now else None
                if retry is not None and (not due or retry.due <= min(s.next_due for s in due)):
                    heapq.heappop(self._retries)
                else:
                    retry = None
                queue = min((q for q in self.queues.values()
                             if q.messages and q.messages[0].visible_at <= now),
                            key=lambda q: q.messages[0].visible_at, default=None)
                first = min([s.next_due for s in due] + ([retry.due] if retry else []), default=None)
                if queue is not None and (first is None or queue.messages[0].visible_at <= first):
                    if retry is not None:  # not yet: the queued message is older
                        heapq.heappush(self._retries, retry)
                        retry = None
                    batch = [heapq.heappop(queue.messages)
                             for _ in range(min(queue.batch_size, len(queue.messages)))
                             if queue.messages and queue.messages[0].visible_at <= now]
                else:
                    batch = []
                if retry is None and not due and not batch:
                    return out
            if batch and queue is not None:
                out.extend(self._deliver_queue(queue, batch))
                continue
            if retry is not None:
                out.append(self._invoke(retry.rule.name, retry.rule.target, retry.rule.target_name,
                                        retry.event, False, rule=retry.rule, attempt=retry.attempt))
                continue
            with self._lock:
                sched = min(due, key=lambda s: s.next_due)
                fire_at = sched.next_due
                sched.next_due += sched.every_seconds
            event = ev.scheduled_event(sched.arn, time=fire_at)
            with self._lock:
                self.events.append(event)
            out.append(self._invoke(sched.name, sched.target, sched.target_name, event, False))

    def _deliver_queue(self, queue: LocalQueue, batch: list[_Message]) -> list[Delivery]:
        """One event source mapping invocation (twice when duplicating)."""
        now = self.clock()
        for message in batch:
            message.receives += 1
        records = [ev.sqs_record(m.message_id, m.body, queue.arn, receive_count=m.receives, sent_at=m.sent_at)
                   for m in batch]
        event = {"Records": records}
        out: list[Delivery] = []
        failed: set[str] = set()
        for copy_ in range(2 if self.duplicate_delivery else 1):
            delivery = self._invoke(f"sqs:{queue.name}", queue.target, queue.target_name, event, copy_ > 0)
            out.append(delivery)
            if copy_ == 0:
                if not delivery.ok:
                    failed = {m.message_id for m in batch}
                elif isinstance(delivery.result, dict):
                    failed = {str(f.get("itemIdentifier"))
                              for f in delivery.result.get("batchItemFailures") or []}
        with self._lock:
            for message in batch:
                if message.message_id not in failed:
                    continue
                if message.receives >= queue.max_receive_count:
                    self.dead_letters.append(DeadLetter(
                        f"sqs:{queue.name}", queue.target_name, {"Records": [ev.sqs_record(
                            message.message_id, message.body, queue.arn, receive_count=message.receives,
                            sent_at=message.sent_at)]},
                        RuntimeError(f"received {message.receives} times"), ""))
                else:
                    queue.push(message.body, now + queue.visibility_timeout, receives=message.receives,
                               message_id=message.message_id, sent_at=message.sent_at)
        return out

    # --- inspection --------------------------------------------------------------
    def failures(self) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if not d.ok]

    def delivered_to(self, target_name: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.target == target_name]

